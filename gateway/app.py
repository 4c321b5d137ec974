"""The Starlette application factory. Everything the handlers use is built here or passed in."""
from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.admin import admin_routes
from gateway.auth import Authenticator
from gateway.chat import chat_completions, json_response
from gateway.errors import GatewayError, handle_gateway_error, handle_http_exception, handle_unexpected_error
from gateway.ledger import Ledger
from gateway.metrics import GatewayMetrics, metrics_route
from gateway.pricing import PriceBook
from gateway.request_context import RequestIdMiddleware
from gateway.settings import Settings
from gateway.upstream import DirectOpenAIUpstream, ProviderUpstream, Upstream
from policies.loader import load_policy
from policies.schema import Policy

logger = logging.getLogger(__name__)


@dataclass
class Gateway:
    """What request handlers need, in one place (available as request.app.state.gateway)."""

    settings: Settings
    policy: Policy
    policy_path: Path | None
    upstream: Upstream
    ledger: Ledger
    auth: Authenticator
    prices: PriceBook
    routing: Any  # gateway.routing.RoutingService


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
    from gateway.local_model import LocalModelUpstream
    from gateway.upstream_litellm import LiteLLMUpstream

    return ProviderUpstream(DirectOpenAIUpstream(), LiteLLMUpstream(), LocalModelUpstream())


async def healthz(request: Request) -> Response:
    return json_response({"status": "ok"})


async def list_models(request: Request) -> Response:
    gateway: Gateway = request.app.state.gateway
    gateway.auth.check(request)
    policy = gateway.policy
    data = [{"id": alias, "object": "model", "created": 0, "owned_by": "selfroute"} for alias in policy.aliases]
    for config in {policy.cheap.model: policy.cheap, policy.long.model: policy.long}.values():
        provider = config.model.partition("/")[0] if "/" in config.model else "openai"
        data.append({"id": config.model, "object": "model", "created": 0, "owned_by": provider})
    return json_response({"object": "list", "data": data})


def create_app(
    settings: Settings,
    *,
    policy: Policy | None = None,
    upstream: Upstream | None = None,
    ledger: Ledger | None = None,
    auth: Authenticator | None = None,
    prices: PriceBook | None = None,
    routing: Any = None,
    metrics: GatewayMetrics | None = None,
) -> Starlette:
    """Build the gateway. Tests inject fakes; the CLI passes what it built from flags and environment."""
    policy_path = settings.policy_path
    if policy is None:
        policy, policy_path = load_policy(settings.policy_path)
    policy = apply_model_overrides(policy, settings)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    ledger = ledger or Ledger(settings.ledger_path)
    auth = auth or Authenticator.from_environment(settings.keys_file)
    upstream = upstream or default_upstream()
    prices = prices or PriceBook()
    if routing is None:
        from gateway.routing import RoutingService

        routing = RoutingService(settings, policy, policy_path)
    gateway = Gateway(settings, policy, policy_path, upstream, ledger, auth, prices, routing)
    metrics = metrics or GatewayMetrics()
    ledger.subscribe(metrics.observe)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        ledger.start()
        threading.Thread(target=prices.warm, name="selfroute-warm-prices", daemon=True).start()
        if auth.open:
            logger.warning("no API keys configured: the gateway is open to anyone who can reach it")
        await routing.startup(gateway)
        try:
            yield
        finally:
            await routing.shutdown()
            await upstream.aclose()
            ledger.close()

    routes = [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        *routing.routes(),
        *admin_routes(),
        metrics_route(),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            GatewayError: handle_gateway_error,
            HTTPException: handle_http_exception,
            Exception: handle_unexpected_error,
        },
    )
    app.state.gateway = gateway
    app.state.ledger = ledger
    app.state.auth = auth
    app.state.settings = settings
    app.state.metrics = metrics
    app.add_middleware(RequestIdMiddleware)
    return app
