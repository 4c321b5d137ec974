"""Routed answers as streams: three paths, one small state machine.

plain    one model's stream, relayed as it comes (direct, rag, and each try of `long`).
long     the long model's stream, else each alternate's in order (gateway.routing.calls.first_answering): only
         before its first chunk; once text has reached the client a failure ends the stream with an error event.
checked  the cheap stream is HELD until the answer check can decide (its opening for the literal rule, the whole
         answer for the verifier), then
           RELAYED   the check trusts it: what was held, then the rest;
           ESCALATED it is closed (its leg recorded) and the long stream is sent instead (its text collected for
                     the judge when the learning loop judges escalations);
           KEPT      the long route failed and the policy says to send the cheap answer (fallback.on_long_error:
                     return_cheap): what was held, marked `cut_short` when it was cut after its opening, so the
                     server closes it as truncated.

Every path returns a `RoutedStream`: the stream to relay and what it was produced from (route, prompt), from which
the service builds the provenance once. Nothing here renders HTTP: the server relays the chunks and their tail.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from gateway import protocol
from gateway.ledger.entry import RequestLedgerEntry
from gateway.protocol import ChatCompletionRequest, chunk_usage
from gateway.routing.calls import (
    LEG_FAILURES,
    Outcome,
    Streamed,
    close_stream,
    first_answering,
    open_stream,
    stream_upstream,
)
from gateway.upstreams.base import malformed_chunk
from gateway.upstreams.errors import UpstreamError
from pipelines.base import PreparedPrompt
from pipelines.tokens import count_tokens
from policies.routes import LONG
from policies.schema import ModelConfig

if TYPE_CHECKING:
    from gateway.routing.learning.loop import JudgeInput
    from gateway.routing.planner import RoutePlan
    from gateway.routing.service import RoutingService


def chunk_text(data: bytes) -> str:
    """A stream chunk's text (gateway.protocol.chunk_text); a malformed chunk is the upstream's failure."""
    try:
        return protocol.chunk_text(data)
    except (ValueError, AttributeError, IndexError) as exc:
        raise malformed_chunk(exc) from None


def text_or_nothing(data: bytes) -> str:
    """A chunk's text for the judge; a malformed chunk is the relay's to report, not the collector's."""
    try:
        return chunk_text(data)
    except UpstreamError:
        return ""


@dataclass
class RoutedRequest:
    """One routed streaming request, as the paths below need it."""

    chat: ChatCompletionRequest
    body: dict[str, Any]
    plan: RoutePlan
    entry: RequestLedgerEntry
    outcome: Outcome


@dataclass
class RoutedStream:
    """A stream to relay and what it was produced from: the provenance's route and prompt."""

    streamed: Streamed
    route: str
    prepared: PreparedPrompt


async def plain(
    service: RoutingService, request: RoutedRequest, config: ModelConfig, route: str, prepared: PreparedPrompt
) -> RoutedStream:
    """One model's stream; its leg and the request are settled when it ends (with the counterfactual)."""
    entry, plan, outcome = request.entry, request.plan, request.outcome
    streamed = await stream_upstream(
        service.upstream,
        entry,
        config,
        route,
        service.body_for(request.body, config, prepared),
        client_wants_usage=request.chat.wants_usage_in_stream,
        before_finish=lambda: service.counterfactual(entry, plan, outcome),
    )
    return RoutedStream(streamed, route, prepared)


async def long(service: RoutingService, request: RoutedRequest, prepared: PreparedPrompt) -> RoutedStream:
    """The long model's stream, else each alternate's in order while the failure is the provider's."""

    async def attempt(config: ModelConfig) -> RoutedStream:
        return await plain(service, request, config, LONG, prepared)

    return await first_answering(service.long_models(), attempt)


@dataclass
class Held:
    """The cheap stream as far as it was read while the check decides."""

    chunks: AsyncIterator[bytes]
    started: float
    read: list[bytes] = field(default_factory=list)
    text: str = ""
    usage: dict[str, Any] | None = None
    ended: bool = False  # the upstream stream has no more chunks

    def take(self, data: bytes) -> None:
        self.read.append(data)
        self.text += chunk_text(data)
        try:
            self.usage = chunk_usage(data) or self.usage
        except (ValueError, AttributeError) as exc:
            raise malformed_chunk(exc) from None

    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self.started) * 1000

    def usage_so_far(self, prepared: PreparedPrompt) -> dict[str, Any]:
        """The upstream's usage, else (cut short before it reported any) what was sent and received, counted."""
        return self.usage or {"prompt_tokens": prepared.prompt_tokens, "completion_tokens": count_tokens(self.text)}


async def checked(
    service: RoutingService, request: RoutedRequest, prepared: PreparedPrompt, route: str
) -> RoutedStream:
    """HOLD the cheap stream, check it, then RELAY it, or ESCALATE to the long stream (or KEEP it when that fails)."""
    held = await _hold(service, request, prepared, route)
    try:
        verdict, judged = await service.verdict(
            request.plan, prepared, route, held.text, request.outcome, key=request.entry.record.key_id
        )
    except BaseException:
        # the request ended during the check (the client left, a shutdown): an answer read whole is charged at the
        # usage it reported, not at the estimate the open leg would get (probe10: 34x the cheap leg's real cost)
        if held.ended:
            request.entry.add_call(service.policy.cheap, route, held.usage_so_far(prepared), held.elapsed_ms())
        raise
    request.outcome.reason = verdict.reason(request.plan.decision)
    if not verdict.escalate:
        return _relayed(service, request, prepared, route, held, judged)
    # the refusal never reaches the client: close the cheap stream, record its leg, answer from the long route
    if not held.ended:
        await close_stream(held.chunks)
    usage = held.usage_so_far(prepared)
    request.entry.add_call(service.policy.cheap, route, usage, held.elapsed_ms())
    request.outcome.route = verdict.outcome
    long_prepared = await service.prepare(request.plan, LONG, request.entry)
    try:
        escalated = await long(service, request, long_prepared)
    except LEG_FAILURES as exc:
        if service.policy.routing.fallback.on_long_error == "error":
            raise
        service.kept_cheap(request.outcome, exc, route)
        return _kept(service, request, prepared, route, held, usage)
    return replace(escalated, streamed=_judged(service, escalated.streamed, request, judged))


async def _hold(service: RoutingService, request: RoutedRequest, prepared: PreparedPrompt, route: str) -> Held:
    """Read the cheap stream until the check can decide; a failure here is a proper status (nothing was sent)."""
    cheap, entry = service.policy.cheap, request.entry
    started = time.perf_counter()
    entry.leg_started(cheap, route)  # the client leaving while it is held: charged at the estimate
    try:
        first, chunks = await open_stream(service.upstream, cheap, service.body_for(request.body, cheap, prepared))
    except LEG_FAILURES as exc:
        entry.add_call(cheap, route, None, (time.perf_counter() - started) * 1000, exc.message)
        raise
    held = Held(chunks, started)
    check = service.check
    data = first
    try:
        while data is not None:
            held.take(data)
            if not check.reads_whole_answer and len(" ".join(held.text.split())) > check.detector.head_chars:
                break  # the opening is settled: later text cannot make it a refusal
            try:
                data = await chunks.__anext__()
            except StopAsyncIteration:
                data, held.ended = None, True
    except LEG_FAILURES as exc:
        entry.add_call(cheap, route, held.usage, held.elapsed_ms(), exc.message)
        await close_stream(chunks)
        raise
    return held


def _relayed(
    service: RoutingService,
    request: RoutedRequest,
    prepared: PreparedPrompt,
    route: str,
    held: Held,
    judged: JudgeInput,
) -> RoutedStream:
    """The trusted cheap answer: what was held, then the rest of the upstream stream."""
    cheap, entry, plan = service.policy.cheap, request.entry, request.plan

    async def held_then_rest() -> AsyncIterator[bytes]:
        try:
            for item in held.read[1:]:
                yield item
            if not held.ended:
                async for item in held.chunks:
                    yield item
        finally:
            await close_stream(held.chunks)  # closing this generator must close the upstream stream too

    def finish(usage: dict[str, Any] | None, error: str | None, status: int, relayed: int) -> None:
        entry.stream_ended(cheap, route, usage, held.elapsed_ms(), error, status, relayed)
        service.counterfactual(entry, plan, request.outcome)
        entry.finish(status, error)
        if status == 200 and error is None:  # the client has the whole answer now
            service.maybe_shadow(request.chat, request.body, plan, entry, judged)

    streamed = Streamed(held.read[0], held_then_rest(), request.chat.wants_usage_in_stream, finish)
    return RoutedStream(streamed, route, prepared)


def _kept(
    service: RoutingService,
    request: RoutedRequest,
    prepared: PreparedPrompt,
    route: str,
    held: Held,
    usage: dict[str, Any],
) -> RoutedStream:
    """The held cheap answer sent after all (its leg is already recorded); cut after its opening, it carries the usage
    counted so far as `cut_short`, and the server closes it as truncated."""
    entry, plan, outcome = request.entry, request.plan, request.outcome

    async def held_only() -> AsyncIterator[bytes]:
        for item in held.read[1:]:
            yield item

    def finish(_usage: dict[str, Any] | None, error: str | None, status: int, _relayed: int) -> None:
        service.counterfactual(entry, plan, outcome)
        entry.finish(status, error)

    streamed = Streamed(
        held.read[0],
        held_only(),
        request.chat.wants_usage_in_stream,
        finish,
        cut_short=None if held.ended else usage,
    )
    return RoutedStream(streamed, route, prepared)


def _judged(service: RoutingService, streamed: Streamed, request: RoutedRequest, judged: JudgeInput) -> Streamed:
    """An escalated stream whose text is collected as it is relayed, for the judge once it has ended whole."""
    if not service.learning.settings.judge:
        return streamed
    parts = [text_or_nothing(streamed.first)] if streamed.first else []
    chunks, finish = streamed.chunks, streamed.finish

    async def collected() -> AsyncIterator[bytes]:
        try:
            async for item in chunks:
                parts.append(text_or_nothing(item))
                yield item
        finally:
            await close_stream(chunks)

    def finish_judged(usage: dict[str, Any] | None, error: str | None, status: int, relayed: int) -> None:
        whole = status == 200 and error is None
        if whole:
            service.keep_texts(request.outcome, long_answer="".join(parts))
        finish(usage, error, status, relayed)
        if whole:
            service.learning.judge_escalation(request.entry, judged, "".join(parts))

    return replace(streamed, chunks=collected(), finish=finish_judged)
