"""Upstream failures as client errors: the status mapping keeps the gateway's upstream addresses to itself."""

from __future__ import annotations

import httpx

from gateway.upstreams.base import MAX_UPSTREAM_MESSAGE_CHARS, client_safe, upstream_error
from tests.support.gateway import running_gateway
from tests.support.policies import make_policy


def test_client_safe_hides_addresses_and_raw_bytes():
    text = client_safe(
        "Cannot connect to host internal.corp:8443 ssl:default [('10.1.2.3', 8443)] "
        "see http://10.1.2.3:8443/v1/chat and [::1]:80\x00\x1b[31m" + "<html>" * 500
    )
    for secret in ("internal.corp", "8443", "10.1.2.3", "::1", "\x00", "\x1b"):
        assert secret not in text
    assert len(text) <= MAX_UPSTREAM_MESSAGE_CHARS + 3


def test_upstream_error_message_is_client_safe():
    error = upstream_error(None, "ClientConnectorError: Cannot connect to host 127.0.0.1:9", "m")
    assert error.status == 502 and "127.0.0.1" not in error.message and ":9" not in error.message


def test_unreachable_upstream_is_not_named_to_the_client(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_BASE", "http://127.0.0.1:9/v1")  # discard port: nothing listens
    with running_gateway(tmp_path, make_policy("http://127.0.0.1:9")) as (url, _):
        response = httpx.post(
            f"{url}/v1/chat/completions",
            timeout=30,
            json={"model": "gpt-test", "messages": [{"role": "user", "content": "x"}]},
        )
    assert response.status_code == 502
    assert "127.0.0.1" not in response.text and ":9" not in response.text
