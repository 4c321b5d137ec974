"""Request ids in and out and in the ledger, and the access log: through a real gateway and the openai client."""

from __future__ import annotations

import io
import json
import logging
import re
import time

import httpx
import openai
import pytest

from gateway.server.access_log import ACCESS_LOGGER, JsonFormatter
from gateway.server.auth import Authenticator
from tests.support.gateway import ledger_rows, running_gateway
from tests.support.policies import make_policy

PROMPT = "a secret question about the Zephyr pump"


@pytest.fixture()
def gateway(upstream, tmp_path, monkeypatch):
    base, _ = upstream
    monkeypatch.setenv("OPENAI_API_BASE", f"{base}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-upstream-test")
    with running_gateway(tmp_path, make_policy(base)) as (url, app):
        yield url, app


@pytest.fixture()
def access_lines():
    """What the access logger writes, as JSON lines (the `serve --log-format json` formatter)."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger(ACCESS_LOGGER)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)

    def lines(count: int | None = None) -> list[dict]:
        # a line is written once the response is done on the server, a moment after the client has read it
        deadline = time.monotonic() + 10
        while count is not None and len(stream.getvalue().splitlines()) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return [json.loads(line) for line in stream.getvalue().splitlines()]

    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def client(url: str, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


def test_a_clients_request_id_comes_back_and_is_ledgered(gateway):
    url, app = gateway
    raw = client(url).chat.completions.with_raw_response.create(
        model="gpt-test",
        messages=[{"role": "user", "content": "hello"}],
        extra_headers={"X-Request-Id": "trace-42.a:b"},
    )
    assert raw.headers["x-request-id"] == "trace-42.a:b"
    assert raw.parse()._request_id == "trace-42.a:b"  # what the openai SDK reads
    gateway_id = raw.headers["x-selfroute-request-id"]
    assert gateway_id.startswith("req_")
    rows = ledger_rows(app)
    assert [(r["id"], r["client_request_id"]) for r in rows] == [(gateway_id, "trace-42.a:b")]


def test_without_a_valid_id_the_gateway_makes_one(gateway):
    url, app = gateway
    answer = client(url).chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "hi"}])
    assert answer._request_id.startswith("req_")
    for bad in ("x" * 129, "has space", "tab\there", "ünïcode".encode(), "a;b", ""):
        response = httpx.post(
            f"{url}/v1/chat/completions",
            headers={"X-Request-Id": bad},
            json={"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert response.status_code == 200
        assert response.headers["x-request-id"] == response.headers["x-selfroute-request-id"] != bad
        assert response.headers["x-request-id"].startswith("req_")
    rows = ledger_rows(app)
    assert len(rows) == 7 and {r["client_request_id"] for r in rows} == {None}
    assert answer._request_id in {r["id"] for r in rows}
    # time first (the ledger's id indexes take new rows at their end): in the order made, and req_ + 32 hex digits
    made = [r["id"] for r in rows]  # ledger_rows orders by created_at
    assert made == sorted(made) and all(re.fullmatch(r"req_[0-9a-f]{32}", i) for i in made)


def test_every_response_carries_the_id_errors_too(upstream, tmp_path):
    base, _ = upstream
    with running_gateway(tmp_path, make_policy(base), auth=Authenticator(["sk-good"])) as (url, _):
        for method, path, kwargs in (
            ("GET", "/healthz", {}),
            ("GET", "/no/such/path", {}),
            ("POST", "/v1/chat/completions", {"json": {}}),  # 401: no key
            ("GET", "/metrics", {}),
        ):
            response = httpx.request(method, f"{url}{path}", headers={"X-Request-Id": "abc-1"}, **kwargs)
            assert response.headers["x-request-id"] == "abc-1", path
            assert response.headers["x-selfroute-request-id"].startswith("req_"), path
        with pytest.raises(openai.AuthenticationError) as refused:
            client(url, "sk-bad").chat.completions.create(
                model="gpt-test", messages=[{"role": "user", "content": "x"}], extra_headers={"X-Request-Id": "abc-2"}
            )
        assert refused.value.request_id == "abc-2"


def test_one_access_line_per_request_with_ids_route_tokens_and_cost_never_the_prompt(gateway, access_lines):
    url, app = gateway
    client(url).chat.completions.create(
        model="selfroute", messages=[{"role": "user", "content": PROMPT}], extra_headers={"X-Request-Id": "line-1"}
    )
    httpx.get(f"{url}/healthz?key=sk-should-never-be-logged")
    lines = access_lines(2)
    assert [line["path"] for line in lines] == ["/v1/chat/completions", "/healthz"]
    chat, health = lines
    row = ledger_rows(app)[0]
    assert chat["request_id"] == "line-1" and chat["selfroute_id"] == row["id"]
    assert (chat["method"], chat["status"], chat["alias"], chat["route"]) == ("POST", 200, "selfroute", "long")
    assert (
        (chat["prompt_tokens"], chat["completion_tokens"]) == (row["prompt_tokens"], row["completion_tokens"]) != (0, 0)
    )
    assert chat["cost_usd"] == pytest.approx(row["cost_usd"]) and chat["cost_usd"] > 0
    assert chat["latency_ms"] > 0 and chat["logger"] == ACCESS_LOGGER and chat["level"] == "INFO"
    assert health["status"] == 200 and "route" not in health and health["request_id"].startswith("req_")
    text = json.dumps(lines)
    assert "Zephyr" not in text and "sk-should-never" not in text and "echo" not in text


def test_a_stream_that_fails_after_its_200_logs_how_it_ended(gateway, access_lines):
    url, _ = gateway
    with httpx.stream(
        "POST",
        f"{url}/v1/chat/completions",
        json={"model": "garbled", "stream": True, "messages": [{"role": "user", "content": "x"}]},
    ) as r:
        r.read()
    (line,) = access_lines(1)
    assert line["status"] == 200 and line["ledger_status"] == 502 and line["route"] == "passthrough"


def test_access_log_off(upstream, tmp_path, access_lines):
    base, _ = upstream
    with running_gateway(tmp_path, make_policy(base), access_log=False) as (url, _):
        httpx.get(f"{url}/healthz")
        time.sleep(0.3)
    assert access_lines() == []
