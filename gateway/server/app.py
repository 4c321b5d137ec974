"""The Starlette application factory: everything the handlers use is built here, or passed in by tests,
and held in one typed `Gateway` (gateway.server.state)."""
from __future__ import annotations

import contextlib
import logging
import threading
from typing import TYPE_CHECKING, Any

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.errors import GatewayError
from gateway.ledger.errors import LedgerError
from gateway.ledger.keys import KeyStore
from gateway.ledger.pricing import PriceBook
from gateway.ledger.writer import Ledger
from gateway.routing.service import RoutingService
from gateway.server.admin import admin_routes
from gateway.server.auth import Authenticator
from gateway.server.bodies import json_response
from gateway.server.chat import chat_completions
from gateway.server.collections import collection_routes
from gateway.server.errors import (
    handle_gateway_error, handle_http_exception, handle_ledger_error, handle_unexpected_error,
)
from gateway.server.explain import explain_route
from gateway.server.keys import key_routes
from gateway.server.limits import model_usable
from gateway.server.metrics import GatewayMetrics, metrics_route
from gateway.server.middleware import RequestIdMiddleware
from gateway.server.state import Gateway, gateway_of
from gateway.settings import Settings, private_dir
from gateway.upstreams.base import Upstream
from policies.loader import load_policy
from policies.schema import Policy

if TYPE_CHECKING:
    from pipelines.embedding import Embedder

logger = logging.getLogger(__name__)


def apply_model_overrides(policy: Policy, settings: Settings) -> Policy:
    """--cheap-model / --long-model replace the policy's model strings (keeping nothing model-specific)."""
    update: dict[str, Any] = {}
    if settings.cheap_model:
        update["cheap"] = policy.cheap.model_copy(update={"model": settings.cheap_model, "input_cost_per_mtok": None,
                                                          "output_cost_per_mtok": None})
    if settings.long_model:
        update["long"] = policy.long.model_copy(update={"model": settings.long_model, "input_cost_per_mtok": None,
                                                        "output_cost_per_mtok": None})
    return policy.model_copy(update=update) if update else policy


def default_upstream() -> Upstream:
    from gateway.upstreams.direct import DirectOpenAIUpstream
    from gateway.upstreams.dispatch import ProviderUpstream
    from gateway.upstreams.litellm_provider import LiteLLMUpstream
    from gateway.upstreams.local import LocalModelUpstream

    return ProviderUpstream(DirectOpenAIUpstream(), LiteLLMUpstream(), LocalModelUpstream())


async def healthz(request: Request) -> Response:
    return json_response({"status": "ok"})


async def list_models(request: Request) -> Response:
    gateway = gateway_of(request)
    caller = gateway.auth.check(request)
    policy = gateway.policy
    data = [{"id": alias, "object": "model", "created": 0, "owned_by": "selfroute"} for alias in policy.aliases]
    for config in {policy.cheap.model: policy.cheap, policy.long.model: policy.long}.values():
        provider = config.model.partition("/")[0] if "/" in config.model else "openai"
        data.append({"id": config.model, "object": "model", "created": 0, "owned_by": provider})
    data = [m for m in data if model_usable(policy, caller, m["id"])]  # only what this key may call
    return json_response({"object": "list", "data": data})


def create_app(
    settings: Settings,
    *,
    policy: Policy | None = None,
    upstream: Upstream | None = None,
    ledger: Ledger | None = None,
    auth: Authenticator | None = None,
    prices: PriceBook | None = None,
    metrics: GatewayMetrics | None = None,
    embedder: Embedder | None = None,
) -> Starlette:
    """Build the gateway. Tests inject fakes; the CLI passes what it built from flags and environment."""
    policy_path = settings.policy_path
    if policy is None:
        policy, policy_path = load_policy(settings.policy_path)
    policy = apply_model_overrides(policy, settings)
    private_dir(settings.data_dir)
    ledger = ledger or Ledger(settings.ledger_path)
    keys = KeyStore(ledger.path)
    auth = auth or Authenticator.from_environment(settings.keys_file)
    if auth.store is None:
        auth.store = keys
    upstream = upstream or default_upstream()
    prices = prices or PriceBook()
    routing = RoutingService(settings, policy, policy_path, upstream, embedder=embedder)
    metrics = metrics or GatewayMetrics()
    gateway = Gateway(settings, policy, policy_path, upstream, ledger, auth, prices, routing, metrics, keys)
    ledger.subscribe(metrics.observe)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        ledger.start()
        threading.Thread(target=prices.warm, name="selfroute-warm-prices", daemon=True).start()
        if auth.open:
            logger.warning("no API keys configured: the gateway is open to anyone who can reach it")
        await anyio.to_thread.run_sync(routing.build)
        try:
            yield
        finally:
            await upstream.aclose()
            ledger.close()
            keys.close()

    routes = [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        *collection_routes(),
        Route("/v1/route/explain", explain_route, methods=["POST"]),
        *admin_routes(),
        *key_routes(),
        metrics_route(),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            GatewayError: handle_gateway_error,
            LedgerError: handle_ledger_error,
            HTTPException: handle_http_exception,
            Exception: handle_unexpected_error,
        },
    )
    app.state.gateway = gateway
    app.add_middleware(RequestIdMiddleware)
    return app
