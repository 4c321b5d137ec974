"""Errors as responses: GatewayError, routing's, the upstreams', the ledger's and the document store's errors and Starlette's own,
all in OpenAI's envelope, through one table (`failure`): the keyed endpoints' wrapper (gateway.server.context)
records its status in the ledger and answers with its envelope; `handle_error` does the same for the app's other
routes."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

from gateway.errors import GatewayError
from gateway.ledger.errors import InvalidQuery, LedgerError, NotFound, Unavailable
from gateway.routing.errors import InvalidRequest, ModelNotFound, RequestTooLarge, RoutingError
from gateway.server.middleware import request_ids
from gateway.upstreams.errors import (
    UnsupportedRequest,
    UpstreamCredentialsRefused,
    UpstreamError,
    UpstreamRateLimited,
    UpstreamRejected,
    UpstreamTimeout,
    UpstreamUnavailable,
    UpstreamUnreachable,
)
from pipelines.errors import CollectionNotFound, StoreUnavailable

logger = logging.getLogger(__name__)


def error_response(error: GatewayError, extra_headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(
        error.body(), status_code=error.status, headers={**(error.headers or {}), **(extra_headers or {})}
    )


UNAVAILABLE_RETRY_S = 2  # a PostgreSQL restart or failover takes seconds


def collection_not_found(name: str, param: str | None = "selfroute.collection", or_empty: bool = True) -> GatewayError:
    """The one 404 for a collection that is absent, empty, or not this caller's to see (all answer alike): a chat or
    explain request naming it (`param` selfroute.collection), or the collections API (no param, `or_empty` False)."""
    return GatewayError(
        404,
        f"collection {name[:128]!r} does not exist{' or is empty' if or_empty else ''}",
        param=param,
        code="collection_not_found",
    )


def from_store_error(exc: StoreUnavailable | CollectionNotFound) -> GatewayError:
    if isinstance(exc, CollectionNotFound):  # absent or empty when planned, or deleted while a request read it
        return collection_not_found(exc.collection)
    return GatewayError(503, exc.message, code="store_unavailable", headers={"retry-after": str(UNAVAILABLE_RETRY_S)})


def from_ledger_error(exc: LedgerError) -> GatewayError:
    if isinstance(exc, Unavailable):
        return GatewayError(503, exc.message, code=exc.code, headers={"retry-after": str(UNAVAILABLE_RETRY_S)})
    status = 404 if isinstance(exc, NotFound) else 400 if isinstance(exc, InvalidQuery) else 500
    return GatewayError(status, exc.message, param=exc.param, code=exc.code)


# Each routing error class's status (gateway.routing.errors); the message, param and code are routing's. Any other
# RoutingError is a request that cannot be routed as sent: 400.
ROUTING_STATUS: dict[type[RoutingError], int] = {InvalidRequest: 400, RequestTooLarge: 413, ModelNotFound: 404}


def from_routing_error(exc: RoutingError) -> GatewayError:
    status = next((s for kind, s in ROUTING_STATUS.items() if isinstance(exc, kind)), 400)
    return GatewayError(status, exc.message, param=exc.param, code=exc.code)


# Each upstream error class's status (gateway.upstreams.errors); the message, param and code are the upstream's. A
# rejected request keeps the provider's status (400, 404, 413, 422); any other UpstreamError (a provider's 5xx, a
# malformed answer, a local model's crash) is a bad gateway: 502.
UPSTREAM_STATUS: dict[type[UpstreamError], int] = {
    UpstreamUnreachable: 502,
    UpstreamCredentialsRefused: 502,  # the gateway's credentials: not the client's fault
    UpstreamTimeout: 504,
    UpstreamRateLimited: 429,
    UpstreamUnavailable: 503,
    UnsupportedRequest: 400,
}


def from_upstream_error(exc: UpstreamError) -> GatewayError:
    if isinstance(exc, UpstreamRejected):
        status = exc.provider_status or 400
    else:
        status = next((s for kind, s in UPSTREAM_STATUS.items() if isinstance(exc, kind)), 502)
    # a rate-limited or unavailable provider's Retry-After, passed on (the gateway's own retries already waited)
    wait = exc.retry_after if status in (429, 503) and exc.retry_after is not None else None
    headers = {} if wait is None else {"retry-after": str(max(1, math.ceil(wait)))}
    return GatewayError(status, exc.message, param=exc.param, code=exc.code, headers=headers)


@dataclass(frozen=True)
class Failure:
    """How a request that raised ends: the error its client is told, the text its ledger record keeps, and
    whether it was a bug (logged with its traceback)."""

    error: GatewayError
    ledger_text: str
    unexpected: bool = False


INTERNAL_ERROR = "internal error in the gateway; see the gateway log"


def failure(exc: BaseException) -> Failure:
    """The one exception table: every error a request can end with, as the status and envelope the client
    gets (the ledger records the same status)."""
    if isinstance(exc, GatewayError):
        error = exc
    elif isinstance(exc, RoutingError):  # requests routing refuses (planning, request limits, unknown models)
        error = from_routing_error(exc)
    elif isinstance(exc, UpstreamError):  # the model providers' failures, and requests an upstream cannot serve
        error = from_upstream_error(exc)
    elif isinstance(exc, LedgerError):  # key limits, owners, the admin API's queries
        error = from_ledger_error(exc)
    elif isinstance(exc, (StoreUnavailable, CollectionNotFound)):
        error = from_store_error(exc)
    elif isinstance(exc, HTTPException):  # Starlette's own 404/405 etc.
        error = GatewayError(exc.status_code, str(exc.detail or "error"))
    else:  # never a bare 500 with a traceback: the envelope, and the cause in the log and the ledger
        return Failure(
            GatewayError(500, INTERNAL_ERROR, code="internal_error"),
            f"internal error: {type(exc).__name__}: {exc}",
            unexpected=True,
        )
    return Failure(error, error.message)


def request_id_header(request: Request) -> dict[str, str]:
    return request_ids(request)  # the 500 handler answers outside the middleware that adds them


async def handle_error(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's handler for errors raised outside gateway.server.context.keyed (open endpoints, routing)."""
    if isinstance(exc, HTTPException) and exc.status_code == 404:
        exc = HTTPException(404, f"no route for {request.method} {request.url.path}")
    failed = failure(exc)
    if failed.unexpected:
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
    if failed.error.status == 401:  # a missing or wrong key: counted, never ledgered
        gateway = getattr(request.app.state, "gateway", None)
        if gateway is not None:
            gateway.metrics.unauthenticated.inc()
    return error_response(failed.error, request_id_header(request))
