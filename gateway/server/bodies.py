"""Reading request bodies under the size limit, and writing JSON responses."""
from __future__ import annotations

import json
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from gateway.errors import GatewayError

JSON_HEADERS = {"content-type": "application/json"}


async def read_body(request: Request, limit: int) -> bytes:
    too_large = GatewayError(413, f"request body is larger than the gateway's limit of {limit} bytes",
                             code="body_too_large")
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise too_large
    body = bytearray()
    try:
        async for part in request.stream():
            body += part
            if len(body) > limit:
                raise too_large
    except ClientDisconnect:
        raise GatewayError(400, "client disconnected while sending the body", code="client_disconnected") from None
    return bytes(body)


def json_response(payload: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(payload).encode(), status_code=status, headers={**JSON_HEADERS, **(headers or {})})
