"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with a fitting status."""
from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import JSONResponse

logger = logging.getLogger(__name__)

_TYPE_FOR_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    502: "upstream_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}


class GatewayError(Exception):
    """An error the client sees as an OpenAI error envelope."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _TYPE_FOR_STATUS.get(status, "api_error")
        self.param = param
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self, headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> GatewayError:
    return GatewayError(400, message, param=param, code=code)


async def handle_gateway_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, GatewayError)
    return exc.response(_request_id_header(request))


async def handle_unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    # Never a bare 500 with a traceback: log it, answer with the envelope.
    logger.exception("unhandled error on %s %s", request.method, request.url.path)
    error = GatewayError(500, "internal error in the gateway; see the gateway log", code="internal_error")
    return error.response(_request_id_header(request))


def _request_id_header(request: Request) -> dict[str, str]:
    request_id = getattr(request.state, "request_id", None)
    return {"x-selfroute-request-id": request_id} if request_id else {}


async def handle_http_exception(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's own 404/405 etc. in the OpenAI envelope."""
    status = getattr(exc, "status_code", 500)
    detail = getattr(exc, "detail", None) or "error"
    if status == 404:
        detail = f"no route for {request.method} {request.url.path}"
    return GatewayError(status, str(detail)).response(_request_id_header(request))
