"""What the app factory wires: the /chat/completions alias for clients configured without /v1, and the hot path
(the chat endpoints' POSTs past Starlette's stack)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from starlette.responses import Response
from starlette.routing import Router

from gateway.errors import GatewayError
from tests.support.gateway import ledger_rows, running_gateway
from tests.support.policies import make_policy


@pytest.fixture(scope="module")
def gateway(upstream, tmp_path_factory):
    with running_gateway(tmp_path_factory.mktemp("app"), make_policy(upstream[0])) as (url, app):
        yield url, app


def test_chat_completions_without_v1(gateway):
    url, app = gateway
    no_v1 = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
    response = no_v1.chat.completions.with_raw_response.create(
        model="selfroute", messages=[{"role": "user", "content": "Say hello."}]
    )
    assert response.http_request.url.path == "/chat/completions"
    assert response.headers["x-selfroute-route"] and response.parse().choices[0].message.content.startswith("echo:")
    assert ledger_rows(app)[-1]["status"] == 200


@pytest.fixture()
def passthrough(upstream, monkeypatch):
    """Pass-through models go to the fake upstream."""
    monkeypatch.setenv("OPENAI_API_BASE", f"{upstream[0]}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-upstream-test")


def test_chat_posts_take_the_hot_path_past_starlettes_router(gateway, passthrough, monkeypatch):
    url, app = gateway
    routed: list[str] = []
    original = Router.__call__

    async def counting(self, scope, receive, send):
        if scope.get("app") is app:  # not the fake upstream's router
            routed.append(scope["path"])
        await original(self, scope, receive, send)

    monkeypatch.setattr(Router, "__call__", counting)
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(f"{url}/v1/chat/completions", json=body).status_code == 200
    assert httpx.post(f"{url}/chat/completions", json=body).status_code == 200
    assert routed == []
    assert httpx.get(f"{url}/v1/chat/completions").status_code == 405  # not a POST: the router answers
    assert httpx.get(f"{url}/health/liveness").status_code == 200
    assert routed == ["/v1/chat/completions", "/health/liveness"]


class _Failing(Response):
    def __init__(self, error: Exception):
        super().__init__()
        self.error = error

    async def __call__(self, scope, receive, send):
        raise self.error


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (GatewayError(418, "short and stout", code="teapot"), 418, "teapot"),
        (RuntimeError("boom"), 500, "internal_error"),
    ],
)
def test_an_error_escaping_a_hot_path_endpoint_gets_starlettes_answer(
    gateway, passthrough, monkeypatch, error, status, code
):
    """What Starlette's stack did for an exception past the endpoint: the handler's envelope, with the request's
    ids (an unexpected one is also re-raised to the server, which logs it)."""
    url, _ = gateway
    monkeypatch.setattr("gateway.server.chat.render", lambda *args, **kwargs: _Failing(error))
    response = httpx.post(
        f"{url}/v1/chat/completions", json={"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert response.status_code == status and response.json()["error"]["code"] == code
    assert response.headers["x-selfroute-request-id"].startswith("req_")


def test_a_passthrough_answer_is_relayed_as_the_upstreams_bytes(gateway, passthrough):
    url, _ = gateway
    response = httpx.post(
        f"{url}/v1/chat/completions", json={"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert response.status_code == 200 and response.json()["object"] == "chat.completion"
    # the fake upstream answers through Starlette's JSONResponse (compact separators); json.dumps again would not
    assert response.content == json.dumps(response.json(), ensure_ascii=False, separators=(",", ":")).encode()
