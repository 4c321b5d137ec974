"""No client-supplied field can point the gateway, or the provider keys it holds, somewhere else.

A capture server on loopback plays the attacker: request fields, headers and model names name it in every
way litellm or an SDK would understand, on the direct path (OpenAI-compatible) and the litellm path
(anthropic/..., with a fake key in ANTHROPIC_API_KEY), plain and streaming, pass-through and routed. It must
see no connection at all; a second capture server plays Anthropic and must be where the key went.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.support.capture import capture_server
from tests.support.gateway import running_gateway
from tests.support.policies import fake_route, make_policy, model_route

ANTHROPIC_MODEL = "anthropic/claude-3-5-haiku-20241022"


def policy(base: str):
    return make_policy(
        base,
        name="isolation",
        cheap=fake_route(base, "fake-cheap"),
        long=model_route(ANTHROPIC_MODEL, api_key_env="ANTHROPIC_API_KEY", timeout=10),
    )


# (model, selfroute options): direct pass-through, litellm pass-through, routed to each path
TARGETS = [
    ("gpt-test", None),
    (ANTHROPIC_MODEL, None),
    ("selfroute", {"route": "direct"}),
    ("selfroute", {"route": "long"}),
]
LITELLM_TARGETS = {ANTHROPIC_MODEL, "long"}


@pytest.fixture(scope="module")
def attacker():
    with capture_server() as server:
        yield server


@pytest.fixture(scope="module")
def anthropic():
    with capture_server() as server:
        yield server


@pytest.fixture(scope="module")
def gateway(upstream, attacker, anthropic, tmp_path_factory):
    base, _ = upstream
    env = {
        "OPENAI_API_BASE": f"{base}/v1",
        "OPENAI_API_KEY": "sk-openai-secret",
        "ANTHROPIC_API_KEY": "sk-ant-secret",
        "ANTHROPIC_API_BASE": anthropic.url,
    }
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        with running_gateway(tmp_path_factory.mktemp("gw"), policy(base)) as (url, app):
            yield url


def _post(url: str, model: str, options, stream: bool, extra: dict, headers: dict | None = None) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "stream": stream, **extra}
    if options:
        body["selfroute"] = options
    response = httpx.post(
        f"{url}/v1/chat/completions",
        content=json.dumps(body),
        timeout=60,
        headers={"content-type": "application/json", **(headers or {})},
    )
    response.read()
    return response


def _target_id(target) -> str:
    model, options = target
    return f"{model}->{options['route']}" if options else model


def _uses_litellm(target) -> bool:
    model, options = target
    return model in LITELLM_TARGETS or bool(options and options["route"] in LITELLM_TARGETS)


def connection_params(url: str) -> dict:
    return {
        "api_base": url,
        "base_url": url,
        "api_key": "sk-attacker",
        "api_version": "2024-01-01",
        "custom_llm_provider": "openai",
        "mock_response": "pwned",
        "extra_headers": {"x-forward": url},
        "headers": {"host": url},
        "timeout": 0.001,
        "num_retries": 5,
        "litellm_params": {"api_base": url},
        "aws_bedrock_runtime_endpoint": url,
        "vertex_location": url,
        "azure_endpoint": url,
        "anthropic_base_url": url,
        "model_list": [{"model_name": "x", "litellm_params": {"api_base": url}}],
    }


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("target", TARGETS, ids=_target_id)
def test_connection_parameters_are_rejected_by_name(gateway, attacker, target, stream):
    for name, value in connection_params(attacker.url).items():
        response = _post(gateway, *target, stream, {name: value})
        assert response.status_code == 400, (name, response.text)
        error = response.json()["error"]
        assert (error["type"], error["param"], error["code"]) == (
            "invalid_request_error",
            name,
            "unsupported_parameter",
        )
    assert attacker.connections == []


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("target", TARGETS, ids=_target_id)
def test_unknown_fields_and_headers_never_redirect(gateway, attacker, anthropic, upstream, target, stream):
    smuggled = {
        "endpoint": attacker.url,
        "proxy_url": attacker.url,
        "callback_url": attacker.url,
        "deployment": {"api_base": attacker.url},
        "user": attacker.url,
    }
    headers = {
        "x-api-base": attacker.url,
        "api-base": attacker.url,
        "x-base-url": attacker.url,
        "anthropic-base-url": attacker.url,
        "x-litellm-api-base": attacker.url,
    }
    response = _post(gateway, *target, stream, smuggled, headers)
    if _uses_litellm(target):
        # the fake Anthropic answers 500: the call went where the gateway's configuration says
        assert response.status_code == 502 or "error" in response.text
        assert anthropic.received("sk-ant-secret")
    else:
        assert response.status_code == 200, response.text
        sent = upstream[1].state.received[-1]
        assert sent["body"]["endpoint"] == attacker.url  # a JSON body field for the upstream, nothing more
        assert sent["headers"]["authorization"] == "Bearer sk-openai-secret"
    assert attacker.connections == []


@pytest.mark.parametrize("model", ["openai/{url}/v1", "huggingface/{url}", "{url}", "ollama/x@{url}"])
def test_model_names_cannot_carry_a_url(gateway, attacker, model):
    response = _post(gateway, model.format(url=attacker.url), None, False, {})
    assert response.status_code == 400 and response.json()["error"]["param"] == "model"
    assert attacker.connections == []


def test_litellm_path_does_not_fetch_remote_content(gateway, attacker, anthropic):
    content = [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": f"{attacker.url}/cat.png"}},
    ]
    for model, options in [(ANTHROPIC_MODEL, None), ("selfroute", {"route": "long"})]:
        body = {"model": model, "messages": [{"role": "user", "content": content}]}
        if options:
            body["selfroute"] = options
        response = httpx.post(f"{gateway}/v1/chat/completions", json=body, timeout=60)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["code"] == "remote_url_not_supported"
    assert attacker.connections == []


def test_provider_keys_went_only_to_their_providers(gateway, attacker, anthropic, upstream):
    _post(gateway, ANTHROPIC_MODEL, None, False, {})
    assert anthropic.received("sk-ant-secret") and not anthropic.received("sk-openai-secret")
    assert attacker.connections == []
