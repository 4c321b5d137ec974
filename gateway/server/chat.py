"""POST /v1/chat/completions: validate, admit, hand the request to routing, and send its answer."""

from __future__ import annotations

import anyio
from starlette.responses import Response

from gateway.errors import GatewayError
from gateway.ledger.entry import RequestLedgerEntry
from gateway.ledger.records import RequestRecord
from gateway.protocol import parse_chat_request, request_tags
from gateway.routing.calls import Answer, Completed, Outcome
from gateway.server import headers, usage
from gateway.server.bodies import JSON_HEADERS, json_response
from gateway.server.collections import check_collection_access, requested_collection
from gateway.server.context import RequestContext
from gateway.server.errors import failure
from gateway.server.grounding import check_answer, stream_check
from gateway.server.injection import flag_headers, screen_attached
from gateway.server.state import Gateway
from gateway.server.streaming import AfterText, stream_response


def fallback_failure(outcome: Outcome) -> GatewayError | None:
    """The long route's failure when the cheap answer was sent instead, as the client is told it."""
    return None if outcome.fallback_error is None else failure(outcome.fallback_error).error


def reason_text(outcome: Outcome) -> str | None:
    """Routing's reason, with the long route's failure (status and code) when the cheap answer was sent instead."""
    failed = fallback_failure(outcome)
    if failed is None:
        return outcome.reason
    return f"{outcome.reason} ({failed.status} {failed.code or failed.type})"


def record_outcome(entry: RequestLedgerEntry, outcome: Outcome) -> None:
    """What routing decided and did, into the request's ledger record (once it returned or failed, before a
    stream starts: the stream's end settles the record)."""
    record = entry.record
    record.route, record.reason, record.provenance = outcome.route, reason_text(outcome), outcome.provenance
    if outcome.features is not None:
        record.features = outcome.features


def route_headers(outcome: Outcome) -> dict[str, str]:
    # header values must be latin-1; reasons are ours and ASCII, but be safe
    reason = (reason_text(outcome) or "").encode("ascii", "replace").decode()
    return {headers.ROUTE: outcome.route or "", headers.REASON: reason}


def selfroute_object(outcome: Outcome, request_id: str) -> dict:
    """The routed answer's `selfroute` object: route, reason, rule, probability, request id and provenance."""
    found = {
        "route": outcome.route,
        "reason": reason_text(outcome),
        "rule": outcome.rule,
        "probability": outcome.probability,
        "request_id": request_id,
        "provenance": outcome.provenance,
    }
    failed = fallback_failure(outcome)
    if failed is not None:
        found["fallback_error"] = failed.body()["error"]
    return found


def render(
    answer: Answer,
    outcome: Outcome,
    extra_headers: dict[str, str],
    record: RequestRecord,
    routed: bool,
    after_text: AfterText | None = None,
) -> Response:
    """The answer with every leg's usage and the cost (gateway.server.usage): a whole answer's in its body and the
    cost header, a stream's in its final usage chunk."""
    failed = fallback_failure(outcome)
    if failed is not None:
        extra_headers = {**extra_headers, headers.FALLBACK_ERROR: f"{failed.status} {failed.code or failed.type}"}
    if isinstance(answer, Completed):
        extra_headers = {**extra_headers, **usage.whole_answer(answer.completion, record, routed)}
        raw = None if routed else getattr(answer.completion, "raw", None)
        if raw:  # a pass-through answer, unchanged: the upstream's own bytes (gateway.upstreams.base.RawCompletion)
            return Response(raw, headers={**JSON_HEADERS, **extra_headers})
        return json_response(answer.completion, headers=extra_headers)
    return stream_response(
        answer, headers=extra_headers, final=lambda data: usage.final_chunk(data, record, routed), after_text=after_text
    )


async def security_notes(
    gateway: Gateway, answer: Answer, entry: RequestLedgerEntry
) -> tuple[dict[str, str], AfterText | None]:
    """The injection findings and, when the policy asks, the grounding check, on a routed answer: headers to
    add; a whole answer also carries them in its `selfroute` object (and loses dropped sentences), a stream gets
    the check to run once its text has ended (gateway.server.grounding)."""
    flags = entry.flags
    notes = flag_headers(flags)
    security = gateway.policy.security
    if not isinstance(answer, Completed):
        if security.grounding == "off":
            return notes, None
        embed = gateway.store.embedder.embed
        return notes, stream_check(security.grounding, security.grounding_threshold, embed, answer.sent, entry)
    if flags:
        answer.completion.setdefault("selfroute", {})["flags"] = flags
    if security.grounding != "off":
        notes |= await anyio.to_thread.run_sync(
            check_answer,
            security.grounding,
            security.grounding_threshold,
            gateway.store.embedder.embed,
            answer.completion,
            answer.sent,
            entry,
        )
    return notes, None


async def chat_completions(ctx: RequestContext) -> Response:
    gateway, entry = ctx.gateway, ctx.entry
    assert entry is not None  # metered
    chat, body = parse_chat_request(ctx.body)
    entry.record.alias = chat.model
    entry.tags = request_tags(chat)
    entry.record.stream = bool(chat.stream)
    await ctx.admit(chat.model, chat)  # reserves the request's estimated cost before any upstream call
    check_collection_access(gateway, ctx.caller, requested_collection(chat, ctx.request))
    if chat.model in gateway.policy.aliases:
        gateway.check_ready()  # routed requests need the models start-up loads
        entry.flags = await screen_attached(gateway.policy, chat, ctx.scope)
        collection = ctx.request.headers.get(headers.COLLECTION)
        outcome = Outcome()
        try:
            answer = await gateway.routing.route(chat, body, entry, collection, ctx.scope, outcome)
        finally:
            record_outcome(entry, outcome)
        if isinstance(answer, Completed):
            answer.completion["selfroute"] = selfroute_object(outcome, entry.record.id)
        notes, after_text = await security_notes(gateway, answer, entry)
        return render(answer, outcome, {**route_headers(outcome), **notes}, entry.record, True, after_text)
    outcome = Outcome()
    try:
        answer = await gateway.routing.passthrough(chat, body, entry, outcome)
    finally:
        record_outcome(entry, outcome)
    return render(answer, outcome, {}, entry.record, routed=False)
