"""No secret leaves through an upstream's error: a fault-injecting upstream on loopback quotes back the key it was
sent (as "Incorrect API key provided: sk-..." does), a Bearer header, an AWS key pair, a traceback with file paths,
on the direct path and the litellm path (anthropic/...), plain and streaming, pass-through and routed. None of it
reaches the client, the gateway's log or the ledger's error columns."""

from __future__ import annotations

import json
import logging
import sqlite3

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.support.gateway import running_gateway
from tests.support.policies import fake_route, make_policy, model_route
from tests.support.servers import serve_app

OPENAI_KEY = "sk-proj-openaiLIVEkey1234567890"
ANTHROPIC_KEY = "sk-ant-api03-anthropicLIVEkey123456"
# a key whose value has no provider's shape, in a variable whose name says nothing: only the policy's
# api_key_env tells the gateway it is a secret
PLAIN_KEY = "opensesame-4242-zz"
AWS_PAIR = "AKIAIOSFODNN7EXAMPLE wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
SECRETS = [
    OPENAI_KEY,
    ANTHROPIC_KEY,
    PLAIN_KEY,
    "AKIAIOSFODNN7EXAMPLE",
    "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "Traceback",
    "/srv/provider",
    "openaiLIVE",
    "anthropicLIVE",
]
ANTHROPIC_MODEL = "anthropic/claude-3-5-haiku-20241022"


def _leak(request: Request, body: dict) -> str:
    sent = request.headers.get("authorization") or request.headers.get("x-api-key") or ""
    key = sent.removeprefix("Bearer ")
    return (
        f"Incorrect API key provided: {key}. Authorization: {sent}. aws: {AWS_PAIR}. "
        f'Traceback (most recent call last):\n  File "/srv/provider/app.py", line 12, in handle\n'
        f"KeyError: {key}"
    )


async def chat(request: Request) -> JSONResponse:
    body = json.loads(await request.body())
    status = int(body["model"].rsplit("-", 1)[1])
    return JSONResponse({"error": {"message": _leak(request, body), "type": "invalid_request_error"}}, status)


async def messages(request: Request) -> JSONResponse:  # Anthropic's endpoint, reached through litellm
    body = json.loads(await request.body())
    return JSONResponse(
        {"type": "error", "error": {"type": "invalid_request_error", "message": _leak(request, body)}}, status_code=400
    )


def policy(base: str):
    return make_policy(
        base,
        name="secrets",
        cheap=fake_route(base, "leak-400", api_key_env="LLM_ACCESS"),
        long=model_route(ANTHROPIC_MODEL, api_key_env="ANTHROPIC_API_KEY", timeout=10),
    )


# (model, selfroute options): direct pass-through (400, 500, 401), litellm pass-through, routed to each path
TARGETS = [
    ("openai/leak-400", None),
    ("openai/leak-500", None),
    ("openai/leak-401", None),
    (ANTHROPIC_MODEL, None),
    ("selfroute", {"route": "direct"}),
    ("selfroute", {"route": "long"}),
]


@pytest.fixture(scope="module")
def leaky():
    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/messages", messages, methods=["POST"]),
        ]
    )
    with serve_app(app) as url:
        yield url


@pytest.fixture(scope="module")
def gateway(leaky, tmp_path_factory):
    env = {
        "OPENAI_API_BASE": f"{leaky}/v1",
        "OPENAI_API_KEY": OPENAI_KEY,
        "ANTHROPIC_API_KEY": ANTHROPIC_KEY,
        "ANTHROPIC_API_BASE": leaky,
        "LLM_ACCESS": PLAIN_KEY,
    }
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        with running_gateway(tmp_path_factory.mktemp("gw"), policy(leaky)) as (url, app):
            yield url, app


def _leaked(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("model", "options"), TARGETS)
def test_upstream_errors_reach_nobody_with_a_secret_in_them(gateway, caplog, model, options, stream):
    url, app = gateway
    caplog.set_level(logging.INFO)
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "hello"}],
        "stream": stream,
        **({"selfroute": options} if options else {}),
    }
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code >= 400 or "error" in response.text, response.text
    assert "error" in response.text
    assert _leaked(response.text) == [], response.text
    assert _leaked(caplog.text) == [], caplog.text
    app.state.gateway.ledger.flush()
    conn = sqlite3.connect(app.state.gateway.ledger.path)
    try:
        errors = [r[0] or "" for r in conn.execute("SELECT error FROM requests")]
        errors += [r[0] or "" for r in conn.execute("SELECT error FROM upstream_calls")]
    finally:
        conn.close()
    assert any(errors) and _leaked("\n".join(errors)) == [], errors


def test_the_message_keeps_what_helps_the_client(gateway):
    url, _ = gateway
    response = httpx.post(
        f"{url}/v1/chat/completions",
        timeout=60,
        json={"model": "openai/leak-400", "messages": [{"role": "user", "content": "hi"}]},
    )
    message = response.json()["error"]["message"]
    assert response.status_code == 400 and "Incorrect API key provided: <redacted>" in message
    assert "traceback left out" in message
