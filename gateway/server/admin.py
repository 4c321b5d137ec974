"""Admin HTTP endpoints over the ledger (admin key required) and the dashboard page.

GET /v1/admin/requests        filters since, until, route, key, policy, status; limit + cursor pagination
GET /v1/admin/requests/{id}   one request with its legs and provenance
GET /v1/admin/costs?by=...    per-group spend, always-long counterfactual and saving
GET /v1/admin/summary         what the dashboard draws (?window=24h)
POST /v1/admin/reload         the policy file's classifier and verifier (model files, thresholds) put in force, here
                              and then in every process on the ledger (gateway.server.reloads)
GET /v1/admin/reload          what is in force in this process and in every process on the ledger
GET /dashboard                the self-contained dashboard page (its data calls need the admin key)

Queries live in gateway.ledger.reports and run in a worker thread, each on its own read-only connection.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from importlib import resources
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from gateway.errors import GatewayError, invalid_request
from gateway.ledger import reports
from gateway.ledger import summary as dashboard_data
from gateway.server.context import RequestContext, keyed
from gateway.server.reloads import PolicyReloads
from gateway.server.state import gateway_of

logger = logging.getLogger(__name__)

DEFAULT_WINDOW = "24h"
MAX_WINDOW_S = 90 * 86400


MAX_PARAM_CHARS = 200


def _param(request: Request, name: str) -> str | None:
    """A query parameter, refused when it is too long to be a real value (never echoed whole) or holds a NUL
    (PostgreSQL refuses it in a query: was a 500)."""
    value = request.query_params.get(name)
    if value is not None and len(value) > MAX_PARAM_CHARS:
        raise invalid_request(f"{name} is longer than {MAX_PARAM_CHARS} characters", param=name, code=f"invalid_{name}")
    if value is not None and "\x00" in value:
        raise invalid_request(f"{name} holds a NUL character", param=name, code=f"invalid_{name}")
    return value


def _filters(request: Request) -> reports.Filters:
    status = _param(request, "status")
    if status is not None and status.strip().isdigit() and not 100 <= int(status) <= 999:
        raise invalid_request(
            "status must be an HTTP status between 100 and 999, a class like 4xx, ok or error",
            param="status",
            code="invalid_status",
        )
    key = _param(request, "key")
    filters = reports.Filters.parse(
        since=_param(request, "since"),
        until=_param(request, "until"),
        route=_param(request, "route"),
        key=key,
        policy=_param(request, "policy"),
        status=status,
    )
    if key and gateway_of(request).keys.exists(key.strip()):  # a named key is recorded by its name
        filters = replace(filters, key=key.strip())
    return filters


async def _query(ctx: RequestContext, work: Callable[[Any], Any]) -> JSONResponse:
    """Run `work(conn)` off the event loop on a fresh read-only connection (the admin key was checked)."""
    location = ctx.gateway.ledger.location  # a SQLite file or the PostgreSQL every replica shares
    return JSONResponse(await run_in_threadpool(reports.query, location, work))


def _int_param(request: Request, name: str, default: int) -> int:
    value = _param(request, name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise invalid_request(f"{name} must be an integer", param=name, code=f"invalid_{name}") from None
    if abs(number) > 2**31:
        raise invalid_request(f"{name} is out of range", param=name, code=f"invalid_{name}")
    return number


async def list_requests(ctx: RequestContext) -> Response:
    request = ctx.request
    filters = _filters(request)
    limit = _int_param(request, "limit", 50)
    cursor = _param(request, "cursor")
    return await _query(ctx, lambda conn: reports.list_requests(conn, filters, limit=limit, cursor=cursor))


async def get_request(ctx: RequestContext) -> Response:
    request = ctx.request
    request_id = request.path_params["request_id"]
    if "\x00" in request_id:
        raise invalid_request("the request id holds a NUL character", param="request_id", code="invalid_request_id")
    return await _query(ctx, lambda conn: reports.get_request(conn, request_id))


async def costs(ctx: RequestContext) -> Response:
    request = ctx.request
    filters = _filters(request)
    by = _param(request, "by") or "route"
    if by not in reports.GROUPINGS:  # fail before touching the database
        raise invalid_request(
            f"cannot group by {by!r}: use one of {', '.join(reports.GROUPINGS)}", param="by", code="invalid_grouping"
        )
    return await _query(ctx, lambda conn: reports.costs(conn, by, filters))


async def summary(ctx: RequestContext) -> Response:
    request = ctx.request
    text = _param(request, "window") or DEFAULT_WINDOW
    now = time.time()
    window = now - reports.parse_time(text, now=now)
    if not 60 <= window <= MAX_WINDOW_S:
        raise invalid_request(
            "window must be an age between 1m and 90d, like 1h, 24h or 7d", param="window", code="invalid_window"
        )
    top = max(1, min(_int_param(request, "top", 10), 100))
    return await _query(ctx, lambda conn: dashboard_data.summary(conn, window=window, now=now, top=top))


_page_cache: dict[str, bytes] = {}


async def dashboard(request: Request) -> Response:
    # The page itself holds no data; it asks for the admin key and calls /v1/admin/summary with it.
    if "page" not in _page_cache:
        _page_cache["page"] = resources.files("gateway.server").joinpath("static/dashboard.html").read_bytes()
    return HTMLResponse(_page_cache["page"], headers={"cache-control": "no-cache", "referrer-policy": "no-referrer"})


def _reloads(ctx: RequestContext) -> PolicyReloads:
    reloads = ctx.gateway.reloads
    if ctx.gateway.startup is None or reloads is None:
        raise GatewayError(409, "this gateway has no start-up to reload", code="reload_failed")
    return reloads


async def reload_policy(ctx: RequestContext) -> Response:
    """The policy reload: the models `selfroute learn` (or calibrate's thresholds) wrote, without a restart. They
    load in this process first (a file that does not load: 409, nothing else is told); then a new generation in the
    ledger has every other worker and replica load them within a few seconds."""
    from gateway.server.startup import ReloadError

    reloads = _reloads(ctx)
    try:
        policy, generation = await run_in_threadpool(reloads.reload_here)
    except ReloadError:  # logged with the reason by reload_here; shown to the admin by GET /v1/admin/reload
        raise GatewayError(
            409,
            "the policy reload failed and the models in force are kept; the gateway's log says why",
            code="reload_failed",
        ) from None
    classifier, verifier = policy.routing.classifier, policy.routing.verifier
    return JSONResponse(
        {
            "reloaded": True,
            "generation": generation,  # None: the ledger could not record it, so only this process reloaded
            "classifier": classifier.model_dump(mode="json") if classifier else None,
            "verifier": verifier.model_dump(mode="json") if verifier else None,
            "process": reloads.state(),
        }
    )


async def reload_status(ctx: RequestContext) -> Response:
    """What is in force where: this process, the newest generation, and every process on the ledger as it last
    wrote itself (model files' sha256, thresholds, generation, last reload error; `stale` when it went silent)."""
    reloads = _reloads(ctx)

    def read() -> dict[str, Any]:
        return {"generation": reloads.log.latest(), "process": reloads.state(), "processes": reloads.fleet()}

    return JSONResponse(await run_in_threadpool(read))


def admin_routes() -> list[Route]:
    return [
        Route("/v1/admin/requests", keyed(list_requests, admin=True), methods=["GET"]),
        Route("/v1/admin/requests/{request_id:path}", keyed(get_request, admin=True), methods=["GET"]),
        Route("/v1/admin/costs", keyed(costs, admin=True), methods=["GET"]),
        Route("/v1/admin/summary", keyed(summary, admin=True), methods=["GET"]),
        Route("/v1/admin/reload", keyed(reload_policy, admin=True), methods=["POST"]),
        Route("/v1/admin/reload", keyed(reload_status, admin=True), methods=["GET"]),
        Route("/dashboard", dashboard, methods=["GET"]),
    ]
