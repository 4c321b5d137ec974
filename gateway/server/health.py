"""Health probes. Liveness: the process answers. Readiness: every model the policy needs in-process is loaded (the
embedding model, both of its copies, the routing classifier and the verifier) and the document store is open (they
load in the background after the server starts listening), 503 until then. A ready answer names the hosted models
whose key variable is unset (`missing_credentials`): their calls will fail until it is set."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.server.bodies import json_response
from gateway.server.startup import BUILD_FAILED, NOT_READY
from gateway.server.state import gateway_of


async def liveness(request: Request) -> Response:
    return json_response({"status": "ok"})


async def readiness(request: Request) -> Response:
    """Open to probes, so it says only a stable reason code; why a start failed (exception text, file paths) is in
    the log, and in this answer only for a caller presenting the admin key."""
    gateway = gateway_of(request)
    startup = gateway.startup
    if startup is None:  # a bare holder has started nothing: not ready (as Gateway.check_ready says)
        return json_response({"status": "starting", "reason": NOT_READY}, status=503)
    reason = startup.not_ready_reason
    body: dict[str, Any]
    if reason is None:
        body = {"status": "ready"}
        if startup.missing_credentials:  # variable names, never values
            body["missing_credentials"] = startup.missing_credentials
        return json_response(body)
    body = {"status": "failed" if reason == BUILD_FAILED else "starting", "reason": reason}
    if startup.error is not None and gateway.auth.presents_admin_key(request):
        body["error"] = startup.error
    return json_response(body, status=503)


def health_routes() -> list[Route]:
    return [
        Route("/healthz", liveness, methods=["GET"]),  # kept for existing probes: same as liveness
        Route("/health/liveness", liveness, methods=["GET"]),
        Route("/health/readiness", readiness, methods=["GET"]),
    ]
