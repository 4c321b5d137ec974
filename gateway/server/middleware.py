"""ASGI middleware: every HTTP request gets its ids (on its response too), is counted in flight, and gets one
access-log line when its response is done; a stream's time to its first event is measured here.

Plain ASGI, not BaseHTTPMiddleware: it runs on every request, pass-through included, so it does only what it
must (a header scan, two clock reads, a gauge) and builds the access line only when the access log is on.

It is the application's outermost layer (gateway.server.app.GatewayApp), and it sends the chat endpoints' POSTs
(`direct`: the hot path) straight to their endpoint: Starlette's error middlewares, router and request wrapper
were about 7% of the event loop's time on a pass-through request. Those endpoints answer their own errors
(gateway.server.context.keyed); anything that still escapes gets what Starlette's stack would give it: `on_error`'s
envelope when nothing was sent yet, and an unexpected exception re-raised to the server."""

from __future__ import annotations

import random
import re
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.ledger.entry import RequestLedgerEntry
from gateway.server.access_log import AccessLog
from gateway.server.headers import CLIENT_REQUEST_ID, REQUEST_ID

if TYPE_CHECKING:
    from gateway.server.metrics import GatewayMetrics
    from gateway.server.state import Gateway

# an inbound X-Request-Id is taken when it is 1-128 letters, digits, '-', '_', '.' or ':' (UUIDs, ULIDs, req_...);
# anything else (too long, spaces, control characters, non-ASCII) is ignored and the gateway's own id is used
CLIENT_ID_PATTERN = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
_INBOUND = CLIENT_REQUEST_ID.encode()
_GATEWAY_HEADER = REQUEST_ID.encode()
_CONTENT_TYPE = b"content-type"
_EVENT_STREAM = b"text/event-stream"
NOT_IN_FLIGHT = frozenset({"/metrics"})  # a scrape does not count itself

Endpoint = Callable[[Request], Awaitable[Response]]
ErrorHandler = Callable[[Request, Exception], Awaitable[Response]]


def new_request_id() -> str:
    """req_ and 32 hex digits, as uuid4().hex gave: the time in nanoseconds, then 64 random bits. Ids must be
    unique, not secret (a key reaches only its own requests' rows): the random module, seeded from os.urandom and
    re-seeded after a fork, costs a sixth of uuid4, whose os.urandom call also let the ledger's threads take the GIL
    from the event loop. Time first, so the ledger's indexes on the id (requests, upstream_calls) take a batch's new
    ids in a page or two, not one page a row: with random ids the writer's CPU per row doubled on a ledger of
    100,000 rows (BENCHMARKS.md section 1, round eight)."""
    return f"req_{time.time_ns():016x}{random.getrandbits(64):016x}"


def client_request_id(scope: Scope) -> str | None:
    """The request's own X-Request-Id when it is a valid one, else None."""
    for name, value in scope["headers"]:
        if name == _INBOUND:  # ASGI servers lower-case header names
            text = value.decode("latin-1")
            return text if CLIENT_ID_PATTERN.fullmatch(text) else None
    return None


def request_ids(request: Request) -> dict[str, str]:
    """The id headers of this request's response, for answers sent outside this middleware (the 500 handler)."""
    state = request.state
    gateway_id = getattr(state, "request_id", None)
    if gateway_id is None:
        return {}
    return {REQUEST_ID: gateway_id, CLIENT_REQUEST_ID: getattr(state, "client_request_id", None) or gateway_id}


def start_entry(request: Request, gateway: Gateway) -> RequestLedgerEntry:
    """The request's ledger entry, with both its ids; the access log reads its record once the response is done."""
    state = request.state
    entry = RequestLedgerEntry(gateway.ledger, gateway.prices, state.request_id, gateway.policy.name)
    entry.record.client_request_id = getattr(state, "client_request_id", None)
    state.record = entry.record
    return entry


class RequestMiddleware:
    """Ids, the in-flight gauge, a stream's time to first event and the access log, for every HTTP request."""

    def __init__(
        self,
        app: ASGIApp,
        metrics: GatewayMetrics | None = None,
        access_log: AccessLog | None = None,
        *,
        direct: dict[str, Endpoint] | None = None,
        on_error: ErrorHandler | None = None,
        handled: tuple[type[Exception], ...] = (),
    ):
        self.app = app
        self.metrics = metrics
        self.access_log = access_log
        self.direct = direct or {}  # path -> endpoint of a POST that skips Starlette's stack
        self.on_error = on_error  # the envelope for an exception a direct endpoint let escape
        self.handled = handled  # the exceptions on_error answers for good (others are re-raised, as Starlette does)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        gateway_id = new_request_id()
        client_id = client_request_id(scope)
        state = scope.setdefault("state", {})
        state["request_id"] = gateway_id
        state["client_request_id"] = client_id
        added = ((_GATEWAY_HEADER, gateway_id.encode()), (_INBOUND, (client_id or gateway_id).encode()))
        status = 0
        streaming = False
        first_event: float | None = None

        async def send_with_ids(message: Message) -> None:
            nonlocal status, streaming, first_event
            kind = message["type"]
            if kind == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", []))
                present = set()
                for name, value in headers:
                    name = name.lower()
                    present.add(name)
                    if name == _CONTENT_TYPE and value.startswith(_EVENT_STREAM):
                        streaming = True
                headers.extend(h for h in added if h[0] not in present)
                message["headers"] = headers
            elif streaming and first_event is None and message.get("body"):
                first_event = time.perf_counter()
            await send(message)

        metrics = self.metrics
        in_flight = metrics is not None and scope["path"] not in NOT_IN_FLIGHT
        if metrics is not None and in_flight:
            metrics.in_flight.inc()
        endpoint = self.direct.get(scope["path"]) if scope["method"] == "POST" else None
        try:
            if endpoint is None:
                await self.app(scope, receive, send_with_ids)
            else:
                request = Request(scope, receive, send_with_ids)
                try:
                    response = await endpoint(request)
                    await response(scope, receive, send_with_ids)
                except Exception as exc:
                    if status or self.on_error is None:  # the response started: the server ends the connection
                        raise
                    await (await self.on_error(request, exc))(scope, receive, send_with_ids)
                    if not isinstance(exc, self.handled):
                        raise
        except BaseException:
            status = status or 500  # the server's error handler answers it, outside this middleware
            raise
        finally:
            if metrics is not None and in_flight:
                metrics.in_flight.dec()
            record = state.get("record")
            if first_event is not None and metrics is not None:
                metrics.time_to_first_token(record.route if record is not None else None, first_event - started)
            log = self.access_log
            if log is not None and log.active():
                log.emit(scope, status, (time.perf_counter() - started) * 1000.0, gateway_id, client_id, record)
