"""A verifier threshold relative to each key's own traffic (routing.verifier.relative), through the gateway: the
official openai client, the fake upstream, real MiniLM, LanceDB, SQLite and uvicorn. One key's refusals open its own
window's escalations and no other key's; the ledger keeps the threshold each answer was decided with and what the
rule charged, and a restarted gateway continues the key's window from the ledger."""

from __future__ import annotations

import json
import sqlite3

import openai
import pytest

from gateway.ledger.records import key_id
from gateway.server.app import create_app
from gateway.server.auth import Authenticator
from gateway.settings import Settings
from policies.schema import RelativeThreshold
from tests.support.gateway import ledger_rows
from tests.support.policies import routing_policy
from tests.support.routed import QUESTION, manual
from tests.support.servers import serve_app

KEYS = {"a": "sk-relative-a", "b": "sk-relative-b", "c": "sk-relative-c"}
ADMIN = "sk-relative-admin"
GROUNDED = "It is BLUE-HERON-42."


@pytest.fixture()
def start(upstream, embedder, verifier_file, tmp_path):
    """start() -> (url, app): a gateway on tmp_path (its ledger too), the toy verifier at threshold 0.0 (nothing
    escalates by the fixed rule) and a relative threshold warm after 6 answers."""
    servers = []

    def _start():
        policy = routing_policy(
            upstream[0], cheap="cheap-scripted", verifier=str(verifier_file), verifier_threshold=0.0
        )
        policy.routing.verifier.relative = RelativeThreshold(window=50, warm_up=6, pool=2.0, refusal_spend=1.0)
        app = create_app(
            Settings(data_dir=tmp_path),
            policy=policy,
            embedder=embedder,
            auth=Authenticator(list(KEYS.values()), ADMIN),
        )
        server = serve_app(app)
        url = server.__enter__()
        servers.append(server)
        return url, app

    yield _start, servers
    for server in servers:
        server.__exit__(None, None, None)


def route(upstream, url: str, key: str, answer: str) -> str:
    """One routed question as key `key` whose cheap answer is `answer`; the route it took."""
    upstream[1].state.scripted = answer
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEYS[key], max_retries=0, timeout=120)
    raw = client.chat.completions.with_raw_response.create(
        model="selfroute",
        messages=[{"role": "user", "content": QUESTION}],
        extra_body={"selfroute": {"documents": [{"text": manual()}]}},
    )
    assert raw.http_response.status_code == 200
    return raw.headers["x-selfroute-route"]


def test_each_keys_window_escalates_by_its_own_refusals_and_survives_a_restart(start, upstream, tmp_path):
    begin, servers = start
    url, app = begin()
    # key a: six refusals while its window warms up (the fixed threshold 0.0 keeps every one)
    assert [route(upstream, url, "a", "unanswerable") for _ in range(6)] == ["rag"] * 6
    # warm, every answer of a's window refused: its next answer is a candidate and fits the refusals' spend
    assert route(upstream, url, "a", GROUNDED) == "rag>long"
    # key b answers the same question the same way: its own window has no refusals, so nothing escalates
    assert [route(upstream, url, "b", GROUNDED) for _ in range(8)] == ["rag"] * 8
    rows = [r for r in ledger_rows(app) if r["route"] in ("rag", "rag>long")]  # oldest first
    a = [json.loads(features(app, r["id"])) for r in rows if r["key_id"] == key_id(KEYS["a"])]
    b = [json.loads(features(app, r["id"])) for r in rows if r["key_id"] == key_id(KEYS["b"])]
    assert len(a) == 7 and len(b) == 8
    assert [r["verifier_threshold"] for r in a[:6]] == [0.0] * 6  # the warm-up: the policy's threshold
    assert a[6]["escalated"] and a[6]["verifier_threshold"] > 1.0  # a's own: every answer a candidate
    assert all(r["long_tokens"] > 0 for r in a + b)
    assert [r["verifier_threshold"] for r in b] == [0.0] * 8 and not any(r["escalated"] for r in b)
    servers.pop().__exit__(None, None, None)

    # a restart (or a second worker): key a's window comes back from the ledger, key c's starts cold
    url, _ = begin()
    assert route(upstream, url, "a", GROUNDED) == "rag>long"
    assert route(upstream, url, "c", GROUNDED) == "rag"


def features(app, request_id: str) -> str:
    conn = sqlite3.connect(app.state.gateway.ledger.path)
    try:
        return conn.execute("SELECT data FROM request_features WHERE request_id = ?", (request_id,)).fetchone()[0]
    finally:
        conn.close()
