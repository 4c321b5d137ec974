"""Fixtures for gateway tests: a fake upstream on loopback and a gateway in front of it."""

from __future__ import annotations

import sqlite3
from contextlib import contextmanager
from pathlib import Path

from gateway.server.app import create_app
from gateway.settings import Settings
from policies.loader import parse_policy
from tests.support.servers import serve_app

POLICY_TEMPLATE = """
name: test
aliases: [selfroute]
cheap:
  model: openai/fake-cheap
  api_base: {base}/v1
  input_cost_per_mtok: 1.0
  output_cost_per_mtok: 2.0
  context_window: 8192
long:
  model: openai/fake-long
  api_base: {base}/v1
  input_cost_per_mtok: 10.0
  output_cost_per_mtok: 20.0
  context_window: 16000
routing:
  classifier: null
  default_route: long
passthrough:
  allow: ["*"]  # the tests pass any name through to the fake upstream (not providers of local services)
"""


def make_policy(base: str, template: str = POLICY_TEMPLATE):
    return parse_policy(template.format(base=base), "test-policy.yaml")


@contextmanager
def running_gateway(data_dir: Path, policy, **kwargs):
    """Yield (base_url, app) for a gateway on a real uvicorn server."""
    settings_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in Settings.__dataclass_fields__}
    app = create_app(Settings(data_dir=data_dir, **settings_kwargs), policy=policy, **kwargs)
    with serve_app(app) as url:
        yield url, app


def ledger_rows(app, table: str = "requests") -> list[dict]:
    app.state.gateway.ledger.flush()
    conn = sqlite3.connect(app.state.gateway.ledger.path)
    conn.row_factory = sqlite3.Row
    try:
        order = {"requests": "created_at", "requests_in_flight": "created_at"}.get(table, "id")
        return [dict(r) for r in conn.execute(f"SELECT * FROM {table} ORDER BY {order}")]
    finally:
        conn.close()
