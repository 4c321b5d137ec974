"""Health probes. Liveness: the process answers. Readiness: the embedding model, document store and routing
classifier are loaded (they load in the background after the server starts listening), 503 until then."""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.routing.service import BUILD_FAILED
from gateway.server.bodies import json_response
from gateway.server.state import gateway_of


async def liveness(request: Request) -> Response:
    return json_response({"status": "ok"})


async def readiness(request: Request) -> Response:
    """Open to probes, so it says only a stable reason code; why a start failed (exception text, file paths) is in
    the log, and in this answer only for a caller presenting the admin key."""
    gateway = gateway_of(request)
    routing = gateway.routing
    reason = routing.not_ready_reason
    if reason is None:
        return json_response({"status": "ready"})
    body = {"status": "failed" if reason == BUILD_FAILED else "starting", "reason": reason}
    if routing.build_error is not None and gateway.auth.presents_admin_key(request):
        body["error"] = routing.build_error
    return json_response(body, status=503)


def health_routes() -> list[Route]:
    return [
        Route("/healthz", liveness, methods=["GET"]),  # kept for existing probes: same as liveness
        Route("/health/liveness", liveness, methods=["GET"]),
        Route("/health/readiness", readiness, methods=["GET"]),
    ]
