"""Reading request bodies under the size limit, and writing JSON responses."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from gateway.errors import GatewayError
from gateway.server.disconnect import ClientDisconnected, disconnect_hook

JSON_HEADERS = {"content-type": "application/json"}
# the whole body must arrive within this many seconds of the handler asking for it: a Content-Length larger than
# what is sent (or a client trickling bytes) would otherwise hold the request open for ever; `selfroute serve
# --body-timeout` sets it
BODY_READ_TIMEOUT_S = 30.0


async def read_body(request: Request, limit: int) -> bytes:
    """The body, at most `limit` bytes (413 beyond), read within BODY_READ_TIMEOUT_S (408 after)."""
    hook = disconnect_hook(request.scope)
    if hook is not None and hook.body_received:
        # serve's protocol has the whole body already (most requests arrive whole): no timer to arm and cancel,
        # which was about 4% of the event loop's time on a pass-through request (py-spy, in-process)
        return await _read(request, limit)
    try:
        # asyncio's own timeout: the server runs on asyncio (uvloop); anyio's fail_after (its backend and task
        # look-ups) was about 3% of the event loop's samples on the pass-through path (py-spy)
        async with asyncio.timeout(BODY_READ_TIMEOUT_S):
            return await _read(request, limit)
    except TimeoutError:
        raise GatewayError(
            408, f"the request body did not arrive within {BODY_READ_TIMEOUT_S:g}s", code="body_timeout"
        ) from None


def _too_large(limit: int) -> GatewayError:
    return GatewayError(413, f"request body is larger than the gateway's limit of {limit} bytes", code="body_too_large")


async def _read(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    body = bytearray()
    try:
        async for part in request.stream():
            body += part
            if len(body) > limit:
                raise _too_large(limit)
    except ClientDisconnect:
        # nobody to answer: ledgered as 499 like any client that left (a 400 said the client sent something wrong)
        raise ClientDisconnected("client disconnected while sending the body") from None
    return bytes(body)


def json_response(payload: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(payload).encode(), status_code=status, headers={**JSON_HEADERS, **(headers or {})})
