"""Fixtures for gateway tests: a fake upstream on loopback and a gateway in front of it."""

from __future__ import annotations

import sqlite3
from contextlib import contextmanager
from pathlib import Path

import httpx

from gateway.server.app import create_app
from gateway.settings import Settings
from tests.support.servers import serve_app


@contextmanager
def running_gateway(data_dir: Path, policy, *, http=None, **kwargs):
    """Yield (base_url, app) for a gateway on a real uvicorn server (`http`: its HTTP protocol class, uvicorn's
    default unless given; `selfroute serve` runs gateway.commands._http_deadline.HeaderDeadlineProtocol)."""
    settings_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in Settings.__dataclass_fields__}
    app = create_app(Settings(data_dir=data_dir, **settings_kwargs), policy=policy, **kwargs)
    with serve_app(app, **({"http": http} if http is not None else {})) as url:
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


def ask(url: str, text: str, timeout: float = 120) -> httpx.Response:
    """One chat request for the `selfroute` alias, as any client sends it (no key)."""
    return httpx.post(
        f"{url}/v1/chat/completions",
        timeout=timeout,
        json={"model": "selfroute", "messages": [{"role": "user", "content": text}]},
    )
