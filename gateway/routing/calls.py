"""Upstream calls as legs of a request: each one is recorded in the request's ledger entry, success or failure."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from gateway import tracing
from gateway.errors import GatewayError
from gateway.ledger.entry import RequestLedgerEntry
from gateway.upstreams.base import Upstream, check_completion, malformed_answer
from gateway.upstreams.errors import UpstreamError
from policies.schema import ModelConfig

logger = logging.getLogger(__name__)
T = TypeVar("T")

# what an upstream leg can fail with: the upstreams' own errors (and a GatewayError of an Upstream the app was handed)
LEG_FAILURES = (UpstreamError, GatewayError)
LegFailure = UpstreamError | GatewayError

# finish(usage, error, status, relayed): runs exactly once when a stream ends, however it ends; `relayed` counts the
# chunks with choices the client was sent (what a stream that ends without usage is charged for)
StreamFinish = Callable[[dict[str, Any] | None, str | None, int, int], None]


@dataclass
class Outcome:
    """What routing decided and did for one request. Routing fills it in as it goes (a request that fails midway
    keeps the route it took); the server renders it (headers, the body's `selfroute` object) and records it in
    the request's ledger entry (gateway.server.chat). Routing never writes the ledger record's fields itself."""

    route: str | None = None
    reason: str | None = None
    rule: str | None = None  # the policy rule that decided, if one did
    probability: float | None = None  # the classifier's, if it decided
    provenance: dict[str, Any] | None = None  # what was sent: documents, sections, chunks or units
    features: dict[str, Any] | None = None  # the learning record (gateway.routing.learning.features_record)
    # the long route's failure when the cheap answer was sent instead (fallback.on_long_error: return_cheap)
    fallback_error: LegFailure | None = None


@dataclass
class Completed:
    """A whole chat.completion, ready to send."""

    completion: dict[str, Any]
    sent: list[dict] | None = None  # routed answers: the messages the answer was produced from (grounding check)


@dataclass
class Streamed:
    """An upstream stream to relay: its first chunk (already received), the rest, and how to settle the ledger."""

    first: bytes | None
    chunks: AsyncIterator[bytes]
    client_wants_usage: bool
    finish: StreamFinish
    # a held answer sent after all though it was cut after its opening: the usage counted so far; the server closes
    # the stream as truncated (finish_reason "length", then this usage)
    cut_short: dict[str, Any] | None = None
    sent: list[dict] | None = None  # routed streams: the messages the answer is produced from (grounding check)


Answer = Completed | Streamed


async def complete_upstream(
    upstream: Upstream, entry: RequestLedgerEntry, config: ModelConfig, route: str, body: dict[str, Any]
) -> dict[str, Any]:
    """One non-streaming upstream call, recorded as a leg of the request whether it succeeds or fails."""
    started = time.perf_counter()
    entry.leg_started(config, route)  # cancelled before it answers (the client left): charged at the estimate
    with tracing.span("selfroute.upstream", **{"selfroute.model": config.model, "selfroute.route": route}) as span:
        try:
            # a body of the wrong shape is the upstream's failure: a 502 with its leg kept, never a 500 that loses it
            completion = check_completion(await upstream.complete(config, body), config.model)
        except LEG_FAILURES as exc:
            entry.add_call(config, route, None, (time.perf_counter() - started) * 1000, exc.message)
            tracing.set_attributes(span, **{"selfroute.error": exc.message})
            raise
        leg = entry.add_call(config, route, completion.get("usage"), (time.perf_counter() - started) * 1000)
        tracing.set_attributes(
            span,
            **{
                "selfroute.prompt_tokens": leg.prompt_tokens,
                "selfroute.completion_tokens": leg.completion_tokens,
                "selfroute.cost_usd": leg.cost_usd,
            },
        )
    return completion


async def open_stream(
    upstream: Upstream, config: ModelConfig, body: dict[str, Any]
) -> tuple[bytes | None, AsyncIterator[bytes]]:
    """Start an upstream stream and wait for its first chunk, so failures still get a proper status."""
    upstream_body = {
        **body,
        "stream": True,
        "stream_options": {**(body.get("stream_options") or {}), "include_usage": True},
    }
    chunks = upstream.stream(config, upstream_body).__aiter__()
    try:
        first = await chunks.__anext__()
    except StopAsyncIteration:
        # an empty stream (or a body that was no event stream at all) would reach the client as an empty 200
        raise malformed_answer(config.model, "the stream ended without a single event") from None
    return first, chunks


async def close_stream(chunks: AsyncIterator[bytes]) -> None:
    """Close a stream the gateway stops reading. The upstreams' streams (and the gateway's wrappers of them) are async
    generators, and closing one closes the upstream's HTTP stream."""
    if isinstance(chunks, AsyncGenerator):
        await chunks.aclose()


async def stream_upstream(
    upstream: Upstream,
    entry: RequestLedgerEntry,
    config: ModelConfig,
    route: str,
    body: dict[str, Any],
    *,
    client_wants_usage: bool,
    before_finish: Callable[[], None] | None = None,
) -> Streamed:
    """Open one upstream stream as a leg of the request; its leg and the request are settled when it ends."""
    started = time.perf_counter()
    entry.leg_started(config, route)
    # the leg's span ends with the stream (None while tracing is off)
    span = tracing.start_span(
        "selfroute.upstream", **{"selfroute.model": config.model, "selfroute.route": route, "selfroute.stream": True}
    )
    try:
        first, chunks = await open_stream(upstream, config, body)
    except LEG_FAILURES as exc:
        entry.add_call(config, route, None, (time.perf_counter() - started) * 1000, exc.message)
        if span is not None:
            span.set_attribute("selfroute.error", exc.message)
            span.end()
        raise

    def finish(usage: dict[str, Any] | None, error: str | None, status: int, relayed: int) -> None:
        # a stream that ends before its usage event came is charged its prompt's estimate and what was relayed
        entry.stream_ended(config, route, usage, (time.perf_counter() - started) * 1000, error, status, relayed)
        if span is not None:
            tracing.set_attributes(span, **{"selfroute.status": status, "selfroute.error": error})
            span.end()
        if before_finish is not None:
            before_finish()
        entry.finish(status, error)

    return Streamed(first, chunks, client_wants_usage, finish)


def worth_an_alternate(exc: LegFailure) -> bool:
    """Failures of the provider (timeout, rate limit, 5xx, a broken answer), not of the request: another long model
    may answer."""
    if isinstance(exc, UpstreamError):
        return exc.provider_side
    return exc.status in (408, 429, 500, 502, 503, 504)


async def first_answering(models: list[ModelConfig], attempt: Callable[[ModelConfig], Awaitable[T]]) -> T:
    """`attempt` on each model in order while the failure is the provider's (every try is a leg of the request):
    the long model and its alternates, whole or streamed."""
    for index, config in enumerate(models):
        try:
            return await attempt(config)
        except LEG_FAILURES as exc:
            if index == len(models) - 1 or not worth_an_alternate(exc):
                raise
            logger.warning("long model %s failed (%s); trying %s", config.model, exc.code, models[index + 1].model)
    raise AssertionError("unreachable: the policy always has a long model")
