"""One request to an endpoint that takes a key, opened and closed in one place.

Every such endpoint is an `async def handler(ctx: RequestContext) -> Response`, registered through `keyed`:

    Route("/v1/route/explain", keyed(explain_route, metered=True), methods=["POST"])
    Route("/v1/admin/costs", keyed(costs, admin=True), methods=["GET"])

`keyed` does, in this order, what every endpoint used to do for itself:

1. authenticates (`admin=True`: the admin key). A refused key is counted (`selfroute_unauthenticated_requests`)
   and never ledgered: anyone can send those, cheaply;
2. opens the request's ledger entry (`metered=True`), with the caller's key id on it;
3. reads the body of a POST under the size limit (`ctx.body`; `body_limit`, else the settings' max_body_bytes);
4. runs the handler in the request's cancellation scope (gateway.server.disconnect): the client leaving stops
   the work and is recorded as 499; a shutdown past its grace period is recorded and answered as 503;
5. records the final status once: the response's status, or for an exception the status of the error
   `gateway.server.errors.failure` maps it to (the one exception table), and answers with that error.
   A streamed answer records its own end when the stream ends (gateway.server.streaming).

Inside, the handler calls `await ctx.admit(model)` once it knows which model the request uses: the
policy's and the key's model allow-lists, the key's budget and rate limits (gateway.server.limits), and, on a
metered request, its reservation (recorded in flight before any upstream call; the entry's finish settles it). It
fills in what only it knows on `ctx.entry.record` (route, reason, ...) and adds the legs it ran, and passes
`ctx.scope` (the caller's key scope, pipelines.scope) to whatever caches work per key.
Endpoints that do model work (chat, embeddings, explain, adding documents) are metered and admitted;
reading or deleting collections and the admin API are only authenticated.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from gateway.errors import GatewayError
from gateway.ledger.entry import RequestLedgerEntry
from gateway.protocol import ChatCompletionRequest
from gateway.server.auth import Caller
from gateway.server.bodies import read_body
from gateway.server.disconnect import (
    CLIENT_CLOSED,
    SHUT_DOWN_TEXT,
    SHUTDOWN,
    ClientDisconnected,
    unless_disconnected,
)
from gateway.server.errors import error_response, failure, request_id_header
from gateway.server.limits import Embedded, RateLimits, admit, reserve
from gateway.server.middleware import start_entry
from gateway.server.state import Gateway, gateway_of
from pipelines.scope import KeyScope

logger = logging.getLogger(__name__)


Handler = Callable[["RequestContext"], Awaitable[Response]]


@dataclass
class RequestContext:
    """What one keyed request carries from its authentication to its last ledger status."""

    request: Request
    gateway: Gateway
    caller: Caller
    entry: RequestLedgerEntry | None  # None on an endpoint that is not metered
    body: bytes = b""
    rate_limits: RateLimits | None = None  # a named key's windows once admitted: x-ratelimit-* on its answer

    @property
    def key_id(self) -> str | None:
        return self.caller.key_id

    @property
    def scope(self) -> KeyScope:
        """Whose request this is, for every cache and store that keeps keys apart (pipelines.scope): pass it down."""
        return KeyScope(self.caller.key_id)

    def rate_limit_headers(self) -> dict[str, str]:
        return self.rate_limits.headers() if self.rate_limits is not None else {}

    async def admit(
        self, model: str | None, chat: ChatCompletionRequest | None = None, embedded: Embedded | None = None
    ) -> None:
        """Raise the 403 (model not allowed) or 429 (budget, rate limit) this request deserves. `model` None
        (work on the gateway's own embedding model, such as adding documents) checks budget and rates only.
        A metered request is then recorded in flight with its reservation (gateway.server.limits.reserve: for a
        `chat` request an upper bound on its cost; for `embedded` inputs their tokens; else none), held against the key's budget and TPM until the
        entry's finished row replaces it."""
        if self.entry is not None and model is not None:
            self.entry.record.alias = model
        self.rate_limits = await admit(self.gateway.policy, self.gateway.keys, self.caller, model)
        if self.entry is not None:
            await reserve(
                self.gateway.policy, self.gateway.prices, self.entry, self.caller, chat, embedded, len(self.body)
            )


def keyed(handler: Handler, *, metered: bool = False, admin: bool = False, body_limit: int | None = None):
    """The Starlette endpoint for `handler`: see the module's docstring."""

    @functools.wraps(handler)
    async def endpoint(request: Request) -> Response:
        gateway = gateway_of(request)
        try:
            caller = gateway.auth.check_admin(request) if admin else gateway.auth.check(request)
        except Exception as exc:  # refused before it touches the ledger
            error = failure(exc).error
            if error.status == 401:
                gateway.metrics.unauthenticated.inc()
            return error_response(error, request_id_header(request))
        entry = None
        if metered:
            entry = start_entry(request, gateway)  # with the client's X-Request-Id; the access log reads it
            entry.record.key_id = caller.key_id
        ctx = RequestContext(request, gateway, caller, entry)
        try:
            if request.method in ("POST", "PUT", "PATCH"):
                ctx.body = await read_body(request, body_limit or gateway.settings.max_body_bytes)
            response = await unless_disconnected(request, lambda: handler(ctx))
        except ClientDisconnected as exc:  # nobody to answer: the work was stopped
            if entry is not None:
                entry.finish(CLIENT_CLOSED, str(exc) or "client disconnected before the answer was ready")
            return Response(status_code=CLIENT_CLOSED)
        except anyio.get_cancelled_exc_class():  # a shutdown past its grace period: still ledgered
            if entry is not None:
                entry.finish(SHUTDOWN, SHUT_DOWN_TEXT)
            # answered, not re-raised: uvicorn answers a task it cancelled with a plain-text 500 (probe9)
            return error_response(
                GatewayError(SHUTDOWN, SHUT_DOWN_TEXT, code="shutting_down"), request_id_header(request)
            )
        except Exception as exc:
            failed = failure(exc)
            if failed.unexpected:  # logged once here, answered with the envelope, never a traceback
                logger.exception(
                    "%s %s failed (request %s)", request.method, request.url.path, request.state.request_id
                )
            if entry is not None:
                entry.finish(failed.error.status, failed.ledger_text)
            return error_response(failed.error, {**request_id_header(request), **ctx.rate_limit_headers()})
        if entry is not None and not isinstance(response, StreamingResponse):
            entry.finish(response.status_code)  # a stream records how it really ended, when it ends
        response.headers.update(ctx.rate_limit_headers())  # before it is sent: a stream's headers go first
        return response

    return endpoint
