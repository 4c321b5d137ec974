"""POST /v1/chat/completions: authenticate, validate, hand the request to routing, and send its answer."""
from __future__ import annotations

import logging

import anyio
from starlette.requests import Request
from starlette.responses import Response

from gateway.errors import GatewayError
from gateway.ledger.entry import RequestLedgerEntry
from gateway.ledger.errors import LedgerError
from gateway.protocol import parse_chat_request
from gateway.routing.calls import Answer, Completed
from gateway.server import headers
from gateway.server.bodies import json_response, read_body
from gateway.server.collections import check_collection_access, requested_collection
from gateway.server.disconnect import ClientDisconnected, unless_disconnected
from gateway.server.errors import error_response, from_ledger_error, from_store_error
from gateway.server.grounding import check_answer
from gateway.server.injection import flag_headers, screen_attached
from gateway.server.limits import admit
from gateway.server.state import Gateway, gateway_of
from gateway.server.streaming import CLIENT_CLOSED, stream_response
from pipelines.embedding import scope_queries
from pipelines.errors import CollectionNotFound, StoreUnavailable

logger = logging.getLogger(__name__)


def route_headers(entry: RequestLedgerEntry) -> dict[str, str]:
    # header values must be latin-1; reasons are ours and ASCII, but be safe
    reason = (entry.record.reason or "").encode("ascii", "replace").decode()
    return {headers.ROUTE: entry.record.route or "", headers.REASON: reason}


def render(answer: Answer, extra_headers: dict[str, str]) -> Response:
    failure = answer.fallback_error
    if failure is not None:
        extra_headers = {**extra_headers, headers.FALLBACK_ERROR: f"{failure.status} {failure.code or failure.type}"}
    if isinstance(answer, Completed):
        return json_response(answer.completion, headers=extra_headers)
    return stream_response(answer, headers=extra_headers)


async def security_notes(gateway: Gateway, answer: Answer, flags: list[dict]) -> dict[str, str]:
    """The injection findings and, when the policy asks, the grounding check, on a routed answer: headers to
    add; a whole answer also carries them in its `selfroute` object (and loses dropped sentences)."""
    notes = flag_headers(flags)
    if isinstance(answer, Completed):
        if flags:
            answer.completion.setdefault("selfroute", {})["flags"] = flags
        security = gateway.policy.security
        if security.grounding != "off":
            notes |= await anyio.to_thread.run_sync(check_answer, security.grounding, security.grounding_threshold,
                                                    gateway.store.embedder.embed, answer.completion, answer.sent)
    return notes


async def chat_completions(request: Request) -> Response:
    gateway = gateway_of(request)
    try:
        caller = gateway.auth.check(request)
    except GatewayError as exc:  # refused before it touches the ledger: anyone can send these, cheaply
        gateway.metrics.unauthenticated.inc()
        return error_response(exc)
    entry = RequestLedgerEntry(gateway.ledger, gateway.prices, request.state.request_id, gateway.policy.name)
    entry.record.key_id = caller.key_id
    try:
        raw = await read_body(request, gateway.settings.max_body_bytes)
        chat, body = parse_chat_request(raw)
        entry.record.alias = chat.model
        entry.record.stream = bool(chat.stream)
        chat.scope_to(caller.key_id)
        scope_queries(caller.key_id)
        await admit(gateway.policy, gateway.keys, caller, chat.model)
        check_collection_access(gateway, caller, requested_collection(chat, request))
        if chat.model in gateway.policy.aliases:
            entry.flags = await screen_attached(gateway.policy, chat)
            collection = request.headers.get(headers.COLLECTION)
            answer = await unless_disconnected(request, lambda: gateway.routing.route(chat, body, entry, collection))
            return render(answer, {**route_headers(entry), **await security_notes(gateway, answer, entry.flags)})
        return render(await unless_disconnected(request, lambda: gateway.routing.passthrough(chat, body, entry)), {})
    except ClientDisconnected:  # nobody to answer: the work was stopped
        entry.finish(CLIENT_CLOSED, "client disconnected before the answer was ready")
        return Response(status_code=CLIENT_CLOSED)
    except anyio.get_cancelled_exc_class():  # a shutdown past its grace period: still ledgered
        entry.finish(503, "the gateway shut down before the answer was ready")
        raise
    except GatewayError as exc:
        entry.finish(exc.status, exc.message)
        return error_response(exc)
    except (LedgerError, StoreUnavailable, CollectionNotFound) as exc:  # key limits, owners; the collections
        error = from_ledger_error(exc) if isinstance(exc, LedgerError) else from_store_error(exc)
        entry.finish(error.status, error.message)
        return error_response(error)
    except Exception as exc:  # logged once here, answered with the envelope, never a traceback
        logger.exception("chat completion %s failed", entry.record.id)
        entry.finish(500, f"internal error: {type(exc).__name__}: {exc}")
        return error_response(GatewayError(500, "internal error in the gateway; see the gateway log",
                                           code="internal_error"))
