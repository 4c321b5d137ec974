"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with a fitting status.

Plain data, no web framework: routing and upstreams raise GatewayError for what the client must be told;
gateway.server.errors turns it (and the ledger's own errors) into responses.
"""

from __future__ import annotations

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
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.headers = headers  # sent with the error response (e.g. Retry-After)
        self.status = status
        self.message = message
        self.type = type or _TYPE_FOR_STATUS.get(status, "api_error")
        self.param = param
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> GatewayError:
    return GatewayError(400, message, param=param, code=code)
