"""What every upstream path shares: the Upstream protocol, provider prefixes, and upstream failures as client errors.

`Upstream.complete` returns an OpenAI chat.completion dict; `Upstream.stream` yields the JSON bytes of
each chat.completion.chunk.
"""
from __future__ import annotations

import json
from typing import Any, AsyncIterator, Protocol

from gateway.errors import GatewayError
from policies.schema import ModelConfig

class Upstream(Protocol):
    async def complete(self, config: ModelConfig, body: dict[str, Any]) -> dict[str, Any]: ...

    def stream(self, config: ModelConfig, body: dict[str, Any]) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


def split_provider(model: str) -> tuple[str | None, str]:
    provider, sep, name = model.partition("/")
    return (provider, name) if sep else (None, model)


def upstream_error(status: int | None, message: str, model: str) -> GatewayError:
    """Map an upstream failure to the status the client should see."""
    text = f"upstream model {model!r} failed: {message}"
    if status is None:
        return GatewayError(502, text, code="upstream_unreachable")
    if status in (400, 404, 413, 422):
        return GatewayError(status, text, code="upstream_rejected_request")
    if status in (401, 403):
        # the gateway's credentials for the provider are wrong: not the client's fault
        return GatewayError(502, text, code="upstream_authentication_failed")
    if status == 429:
        return GatewayError(429, text, code="upstream_rate_limited")
    if status in (408, 504):
        return GatewayError(504, text, code="upstream_timeout")
    return GatewayError(502, text, code="upstream_error")


def malformed_chunk(exc: Exception) -> GatewayError:
    return GatewayError(502, f"the upstream sent a malformed stream chunk: {exc}", code="upstream_error")


def chunk_usage(data: bytes) -> dict[str, Any] | None:
    """The usage object of a stream chunk, if it carries one; the substring test avoids parsing most chunks."""
    if b'"usage"' not in data:
        return None
    usage = json.loads(data).get("usage")
    return usage if isinstance(usage, dict) else None
