"""Health probes. Liveness: the process answers. Readiness: the routing classifier and the verifier are loaded, the
document store is open and the in-process models' files are checked (the embedding model's export made, the local
model's GGUF file there; both load at the first request that uses them, once, unless the gateway preloads them:
gateway.server.startup), all in the background after the server starts listening, 503 until then. A ready answer names the hosted models
whose key variable is unset (`missing_credentials`): their calls will fail until it is set, the policy reload
generation this process's routing models came with (`policy_generation`), and `reload_failed: true` while its last
reload failed (it routes with the models it had); with the admin key, `reload`: what it has in force and why the
reload failed (gateway.server.reloads)."""

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
        reloads = gateway.reloads
        if reloads is not None:
            body["policy_generation"] = reloads.loaded_generation
            if reloads.last_error is not None:
                body["reload_failed"] = True  # still ready: it answers with the models it had
            if gateway.auth.presents_admin_key(request):  # file paths and errors: the admin's only
                body["reload"] = reloads.state()
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
