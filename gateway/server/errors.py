"""Errors as responses: GatewayError, the ledger's and the document store's errors and Starlette's own, all in
OpenAI's envelope."""
from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import JSONResponse

from gateway.errors import GatewayError
from gateway.ledger.errors import InvalidQuery, LedgerError, NotFound, Unavailable
from gateway.server import headers
from pipelines.errors import CollectionNotFound, StoreUnavailable

logger = logging.getLogger(__name__)


def error_response(error: GatewayError, extra_headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers={**(error.headers or {}), **(extra_headers or {})})


UNAVAILABLE_RETRY_S = 2  # a PostgreSQL restart or failover takes seconds


def from_store_error(exc: StoreUnavailable | CollectionNotFound) -> GatewayError:
    if isinstance(exc, CollectionNotFound):  # a named collection deleted while a request was reading it
        return GatewayError(404, f"collection {exc.collection!r} does not exist or is empty",
                            param="selfroute.collection", code="collection_not_found")
    return GatewayError(503, exc.message, code="store_unavailable",
                        headers={"retry-after": str(UNAVAILABLE_RETRY_S)})


def from_ledger_error(exc: LedgerError) -> GatewayError:
    if isinstance(exc, Unavailable):
        return GatewayError(503, exc.message, code=exc.code, headers={"retry-after": str(UNAVAILABLE_RETRY_S)})
    status = 404 if isinstance(exc, NotFound) else 400 if isinstance(exc, InvalidQuery) else 500
    return GatewayError(status, exc.message, param=exc.param, code=exc.code)


async def handle_gateway_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, GatewayError)
    if exc.status == 401:  # a missing or wrong key on any endpoint: counted, never ledgered
        gateway = getattr(request.app.state, "gateway", None)
        if gateway is not None:
            gateway.metrics.unauthenticated.inc()
    return error_response(exc, _request_id_header(request))


async def handle_ledger_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, LedgerError)
    return error_response(from_ledger_error(exc), _request_id_header(request))


async def handle_store_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, (StoreUnavailable, CollectionNotFound))
    return error_response(from_store_error(exc), _request_id_header(request))


async def handle_unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    # Never a bare 500 with a traceback: log it, answer with the envelope.
    logger.exception("unhandled error on %s %s", request.method, request.url.path)
    error = GatewayError(500, "internal error in the gateway; see the gateway log", code="internal_error")
    return error_response(error, _request_id_header(request))


def _request_id_header(request: Request) -> dict[str, str]:
    request_id = getattr(request.state, "request_id", None)
    return {headers.REQUEST_ID: request_id} if request_id else {}


async def handle_http_exception(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's own 404/405 etc. in the OpenAI envelope."""
    status = getattr(exc, "status_code", 500)
    detail = getattr(exc, "detail", None) or "error"
    if status == 404:
        detail = f"no route for {request.method} {request.url.path}"
    return error_response(GatewayError(status, str(detail)), _request_id_header(request))
