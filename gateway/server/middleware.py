"""ASGI middleware: every HTTP request gets an id, on its response too."""
from __future__ import annotations

import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.server.headers import REQUEST_ID as REQUEST_ID_HEADER


def new_request_id() -> str:
    return f"req_{uuid.uuid4().hex}"


class RequestIdMiddleware:
    """Gives every HTTP request an id and puts it on the response. Plain ASGI: cheaper than BaseHTTPMiddleware."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = new_request_id()
        scope.setdefault("state", {})["request_id"] = request_id
        header = (REQUEST_ID_HEADER.encode(), request_id.encode())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if not any(k.lower() == header[0] for k, _ in headers):
                    headers.append(header)
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_id)
