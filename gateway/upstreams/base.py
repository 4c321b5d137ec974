"""What every upstream path shares: the Upstream protocol, provider prefixes, and upstream failures as the
upstreams' own errors (gateway.upstreams.errors; the server maps them to HTTP).

`Upstream.complete` returns an OpenAI chat.completion dict; `Upstream.stream` yields the JSON bytes of
each chat.completion.chunk (their shape and helpers: gateway.protocol).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any, Protocol

from gateway.protocol import completion_problem
from gateway.upstreams.errors import (
    MalformedAnswer,
    UpstreamCredentialsRefused,
    UpstreamError,
    UpstreamFailed,
    UpstreamRateLimited,
    UpstreamRejected,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from gateway.upstreams.scrub import scrub
from policies.schema import ModelConfig


class RawCompletion(dict):
    """A chat.completion as an OpenAI-compatible upstream sent it: parsed, and the bytes it was parsed from (`raw`).
    A pass-through answer, which the gateway does not change, is sent as those bytes: no second json.dumps."""

    raw: bytes = b""


class Upstream(Protocol):
    async def complete(self, config: ModelConfig, body: dict[str, Any]) -> dict[str, Any]: ...

    def stream(self, config: ModelConfig, body: dict[str, Any]) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


def split_provider(model: str) -> tuple[str | None, str]:
    provider, sep, name = model.partition("/")
    return (provider, name) if sep else (None, model)


MAX_UPSTREAM_MESSAGE_CHARS = 300
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>]+")
_HOST_PORT = re.compile(r"\b(?:[A-Za-z0-9\-]+\.)*[A-Za-z0-9\-]+:\d{1,5}\b|\[[0-9A-Fa-f:]+\](?::\d+)?")
_IP = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b(?:'?,\s*\d{1,5})?")  # with a (host, port) tuple's port


# litellm's wrapping of a provider's message: "litellm.BadRequestError: BadRequestError: OpenAIException - ..."
_LITELLM_PREFIX = re.compile(r"^(?:\s*(?:litellm\.)?[A-Za-z]+(?:Error|Exception)\s*(?::|-)\s*)+")


def client_safe(message: str, secret_env: tuple[str, ...] = ()) -> str:
    """An upstream's message as a client (and the log, and the ledger) may see it: no secrets (key-shaped strings,
    the configured keys' values, gateway.upstreams.scrub), tracebacks or file paths, no URLs, hosts, ports or
    addresses of the gateway's upstreams, printable characters only, and short (raw upstream bodies can be
    anything)."""
    text = _LITELLM_PREFIX.sub("", scrub(message, secret_env)) or "no message"
    text = _URL.sub("<url>", text)
    text = _HOST_PORT.sub("<host>", text)
    text = _IP.sub("<address>", text)
    text = "".join(c if c.isprintable() else " " for c in text)
    if len(text) > MAX_UPSTREAM_MESSAGE_CHARS:
        text = text[:MAX_UPSTREAM_MESSAGE_CHARS] + "..."
    return text


def upstream_error(status: int | None, message: str, model: str, secret_env: tuple[str, ...] = ()) -> UpstreamError:
    """An upstream failure by kind (its HTTP status, None when there was no answer), with the provider's message
    summarised: scrubbed (client_safe), and for a refused credential not passed on at all (providers quote the key
    back). secret_env: names of environment variables holding this upstream's key (the policy's api_key_env)."""
    if status in (401, 403):
        # the gateway's credentials for the provider are wrong: not the client's fault, nor its business
        return UpstreamCredentialsRefused(
            f"upstream model {model!r} failed: the provider refused the gateway's credentials (HTTP {status})",
            model=model,
            provider_status=status,
        )
    text = f"upstream model {model!r} failed: {client_safe(message, secret_env)}"
    if status is None:
        return UpstreamUnreachable(text, model=model)
    if status in (400, 404, 413, 422):
        return UpstreamRejected(text, model=model, provider_status=status)
    if status == 429:
        return UpstreamRateLimited(text, model=model, provider_status=status)
    if status in (408, 504):
        return UpstreamTimeout(text, model=model, provider_status=status)
    return UpstreamFailed(text, model=model, provider_status=status)


def malformed_chunk(exc: Exception) -> UpstreamError:
    return MalformedAnswer(f"the upstream sent a malformed stream chunk: {client_safe(str(exc))}")


def malformed_answer(model: str, problem: str) -> UpstreamError:
    return MalformedAnswer(f"upstream model {model!r} sent a malformed answer: {client_safe(problem)}", model=model)


def check_completion(data: Any, model: str) -> dict[str, Any]:
    """The chat.completion an upstream returned, if it has the shape the gateway relies on; else a malformed answer."""
    problem = completion_problem(data)
    if problem is not None:
        raise malformed_answer(model, problem)
    return data
