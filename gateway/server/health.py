"""Health probes. Liveness: the process answers. Readiness: the embedding model, document store and routing
classifier are loaded (they load in the background after the server starts listening), 503 until then."""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.server.bodies import json_response
from gateway.server.state import gateway_of


async def liveness(request: Request) -> Response:
    return json_response({"status": "ok"})


async def readiness(request: Request) -> Response:
    routing = gateway_of(request).routing
    if routing.build_error is not None:
        return json_response({"status": "failed", "error": routing.build_error}, status=503)
    if routing.planner is None:
        return json_response({"status": "starting"}, status=503)
    return json_response({"status": "ready"})


def health_routes() -> list[Route]:
    return [
        Route("/healthz", liveness, methods=["GET"]),  # kept for existing probes: same as liveness
        Route("/health/liveness", liveness, methods=["GET"]),
        Route("/health/readiness", readiness, methods=["GET"]),
    ]
