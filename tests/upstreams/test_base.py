"""Upstream failures as client errors: the status mapping keeps the gateway's upstream addresses to itself."""

from __future__ import annotations

import httpx
import pytest

from gateway.server.errors import from_upstream_error
from gateway.upstreams.base import MAX_UPSTREAM_MESSAGE_CHARS, client_safe, upstream_error
from gateway.upstreams.errors import (
    UpstreamCredentialsRefused,
    UpstreamFailed,
    UpstreamRateLimited,
    UpstreamRejected,
    UpstreamTimeout,
    UpstreamUnreachable,
)
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
    assert isinstance(error, UpstreamUnreachable) and from_upstream_error(error).status == 502
    assert "127.0.0.1" not in error.message and ":9" not in error.message


@pytest.mark.parametrize(
    "status, kind, answered",
    [
        (401, UpstreamCredentialsRefused, 502),
        (403, UpstreamCredentialsRefused, 502),
        (400, UpstreamRejected, 400),
        (404, UpstreamRejected, 404),
        (413, UpstreamRejected, 413),
        (422, UpstreamRejected, 422),
        (429, UpstreamRateLimited, 429),
        (408, UpstreamTimeout, 504),
        (504, UpstreamTimeout, 504),
        (500, UpstreamFailed, 502),
        (503, UpstreamFailed, 502),
    ],
)
def test_upstream_failures_are_the_upstreams_own_errors_mapped_once(status, kind, answered):
    """The upstream layer says what went wrong (a class, the provider's status kept); the server's table says which
    status the client gets; only a rejected request is not worth another provider."""
    error = upstream_error(status, "provider message", "m")
    assert type(error) is kind and error.provider_status == status and not hasattr(error, "status")
    assert from_upstream_error(error).status == answered
    assert error.provider_side == (kind is not UpstreamRejected)


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
