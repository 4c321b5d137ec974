"""The request span of OpenTelemetry tracing (gateway.tracing): installed by the app factory only while tracing
is on, so a gateway without it pays nothing per request.

One SERVER span per HTTP request, a child of the caller's trace when it sends W3C `traceparent`; the routing
code's spans (plan, prepare, each upstream leg, the answer check) are its children. When the response is done it
gets the status and, for a ledgered request, the route and its reason, the alias, the key, the tokens and the
cost; never the prompt or the answer."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway import tracing


class TracingMiddleware:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not tracing.enabled():
            await self.app(scope, receive, send)
            return
        from opentelemetry.propagate import extract
        from opentelemetry.trace import Status, StatusCode

        carrier = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
        state = scope.setdefault("state", {})
        status = 500  # unless a response starts

        async def send_noting_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        with tracing.server_span(f"{scope['method']} {scope['path']}", context=extract(carrier)) as span:
            span.set_attributes(
                {
                    "http.request.method": scope["method"],
                    "url.path": scope["path"],
                    "selfroute.request_id": state.get("client_request_id") or state.get("request_id") or "",
                }
            )
            try:
                await self.app(scope, receive, send_noting_status)
            finally:
                span.set_attribute("http.response.status_code", status)
                record = state.get("record")
                if record is not None:
                    tracing.set_attributes(
                        span,
                        **{
                            "selfroute.id": record.id,
                            "selfroute.route": record.route,
                            "selfroute.reason": record.reason,
                            "selfroute.alias": record.alias,
                            "selfroute.key": record.key_id,
                            "selfroute.status": record.status,
                            "selfroute.prompt_tokens": record.prompt_tokens,
                            "selfroute.completion_tokens": record.completion_tokens,
                            "selfroute.cost_usd": record.cost_usd,
                        },
                    )
                if status >= 500 or (record is not None and record.status >= 500):
                    span.set_status(Status(StatusCode.ERROR))
