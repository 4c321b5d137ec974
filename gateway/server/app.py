"""The Starlette application factory: everything the handlers use is built here, or passed in by tests,
and held in one typed `Gateway` (gateway.server.state)."""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.routing import Route
from starlette.types import ASGIApp

from gateway import tracing
from gateway.errors import GatewayError
from gateway.ledger.database import REQUEST_BUSY_TIMEOUT_S
from gateway.ledger.errors import LedgerError
from gateway.ledger.keys import KeyStore
from gateway.ledger.labels import LabelStore, learning_spend
from gateway.ledger.pricing import PriceBook
from gateway.ledger.reloads import ReloadLog
from gateway.ledger.writer import Ledger
from gateway.routing.errors import RoutingError
from gateway.routing.service import RoutingService
from gateway.server.access_log import AccessLog
from gateway.server.admin import admin_routes
from gateway.server.auth import Authenticator
from gateway.server.chat import chat_completions
from gateway.server.collections import collection_routes
from gateway.server.context import keyed
from gateway.server.embeddings import embeddings_route
from gateway.server.errors import handle_error
from gateway.server.explain import explain_route
from gateway.server.feedback import feedback_routes
from gateway.server.health import health_routes
from gateway.server.keys import key_routes
from gateway.server.learning import record_learning
from gateway.server.metrics import GatewayMetrics, metrics_route
from gateway.server.middleware import RequestMiddleware
from gateway.server.models import model_routes
from gateway.server.openapi import docs_routes, openapi_route
from gateway.server.reloads import PolicyReloads
from gateway.server.startup import Startup
from gateway.server.state import Gateway
from gateway.server.tracing import TracingMiddleware
from gateway.settings import Settings, private_dir
from gateway.upstreams.base import Upstream
from gateway.upstreams.errors import UpstreamError
from pipelines.errors import CollectionNotFound, StoreUnavailable
from policies.limits import effective_policy
from policies.loader import load_policy
from policies.schema import Policy

if TYPE_CHECKING:
    from pipelines.embedding import Embedder

logger = logging.getLogger(__name__)


def default_upstream() -> Upstream:
    from gateway.upstreams.direct import DirectOpenAIUpstream
    from gateway.upstreams.dispatch import ProviderUpstream
    from gateway.upstreams.litellm_provider import LiteLLMUpstream
    from gateway.upstreams.local import LocalModelUpstream

    return ProviderUpstream(DirectOpenAIUpstream(), LiteLLMUpstream(), LocalModelUpstream())


# Allocations (less deallocations) between two young collections, CPython's default 700. Requests in flight hold a
# few hundred objects each, and each young collection traverses the new ones still alive and moves them on, where
# the older generations traverse them again: at 32 requests in flight the collector ran every eight requests, about
# a tenth of the event loop's time on a pass-through request (BENCHMARKS.md section 1, round nine). A request leaves
# no cyclic garbage (tests/server/test_disconnect.py), so what waits here is at most this many small objects.
YOUNG_COLLECTION_THRESHOLD = 10_000


def _freeze_when_loaded(*loaders: threading.Thread) -> None:
    """Once the start-up threads are done, move what they loaded (litellm and its cost map, the models, the
    store: ~400k long-lived objects) out of the cyclic collector's sight. Scanning them made each full
    collection under load stall the event loop for 0.4-1 s, every few hundred requests. Then young collections
    come every YOUNG_COLLECTION_THRESHOLD allocations (the older generations' thresholds are left as they are)."""
    for loader in loaders:
        loader.join()
    gc.collect()
    gc.freeze()
    gc.set_threshold(max(YOUNG_COLLECTION_THRESHOLD, gc.get_threshold()[0]), *gc.get_threshold()[1:])


# the errors Starlette's exception middleware answers through handle_error; any other exception its server-error
# middleware answers likewise and re-raises to the server (which logs it)
HANDLED_ERRORS: tuple[type[Exception], ...] = (
    GatewayError,
    RoutingError,
    UpstreamError,
    LedgerError,
    StoreUnavailable,
    CollectionNotFound,
    HTTPException,
)
CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")  # the second for clients configured without /v1


class GatewayApp(Starlette):
    """Starlette with the request middleware (gateway.server.middleware) outside its whole stack, so that the hot
    path (the chat endpoints) can go from it straight to its endpoint."""

    def __init__(self, *args, outer: Callable[[ASGIApp], ASGIApp], **kwargs):
        self._outer = outer
        super().__init__(*args, **kwargs)

    def build_middleware_stack(self) -> ASGIApp:
        return self._outer(super().build_middleware_stack())


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
    strict = policy is None  # a policy file must give the window of a model litellm does not know
    if policy is None:
        policy, policy_path = load_policy(settings.policy_path)
    # --cheap-model / --long-model, and every model's window, output limit, timeout and retries filled in
    policy, limits = effective_policy(
        policy,
        cheap_model=settings.cheap_model,
        long_model=settings.long_model,
        cheap_window=settings.cheap_window,
        long_window=settings.long_window,
        strict=strict,
    )
    private_dir(settings.data_dir)
    ledger = ledger or Ledger(settings.ledger_location, dead_letter_dir=settings.data_dir)
    keys = KeyStore(ledger.location, busy_timeout=REQUEST_BUSY_TIMEOUT_S)  # a locked file: down, not a stall
    auth = auth or Authenticator.from_environment(settings.keys_file)
    if auth.store is None:
        auth.store = keys
    upstream = upstream or default_upstream()
    prices = prices or PriceBook()
    routing = RoutingService(policy, upstream, record_learning)
    startup = Startup(settings, policy, policy_path, upstream, routing, embedder=embedder)
    routing.learning.budget.read_spend = functools.partial(learning_spend, ledger.location)
    labels = LabelStore(ledger.location, busy_timeout=REQUEST_BUSY_TIMEOUT_S)
    metrics = metrics or GatewayMetrics()
    gateway = Gateway(
        settings, policy, policy_path, upstream, ledger, auth, prices, routing, metrics, keys, labels, startup
    )
    ledger.subscribe(metrics.observe)

    def use_policy(reloaded: Policy) -> None:  # a reload's policy, for the handlers that read gateway.policy
        gateway.policy = reloaded

    reloads = gateway.reloads = PolicyReloads(
        startup, ReloadLog(ledger.location, busy_timeout=REQUEST_BUSY_TIMEOUT_S), metrics, use_policy
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        ledger.start()
        warm = threading.Thread(
            target=prices.warm,
            args=([policy.cheap, policy.long, *policy.long_alternates],),
            name="selfroute-warm-prices",
            daemon=True,
        )
        warm.start()
        if auth.open:
            logger.warning("no API keys configured: the gateway is open to anyone who can reach it")
        # the reload generation is read before the models load (a reload added meanwhile is followed at once)
        reloads.start()
        # models and stores load after the server listens: liveness answers at once, readiness when they are in
        build = threading.Thread(target=startup.build_in_background, name="selfroute-build", daemon=True)
        build.start()
        threading.Thread(
            target=_freeze_when_loaded, args=(warm, build), name="selfroute-gc-freeze", daemon=True
        ).start()
        try:
            yield
        finally:
            await routing.learning.aclose()  # shadow and judge work: waited for, or cancelled and ledgered
            reloads.close()
            if startup.store is not None:  # attached documents embedded in the background: stopped, waited for
                await anyio.to_thread.run_sync(startup.store.close)
            await upstream.aclose()
            ledger.close()
            keys.close()
            labels.close()
            metrics.close()

    chat = keyed(chat_completions, metered=True)
    routes = [
        *health_routes(),
        *model_routes(),
        *(Route(path, chat, methods=["POST"]) for path in CHAT_PATHS),
        embeddings_route(),
        *collection_routes(),
        Route("/v1/route/explain", keyed(explain_route, metered=True), methods=["POST"]),
        *feedback_routes(),
        *admin_routes(),
        *key_routes(),
        metrics_route(),
        openapi_route(),
        *docs_routes(),
    ]
    traced = tracing.enabled()
    access_log = AccessLog(settings.access_log)

    def outer(stack: ASGIApp) -> ASGIApp:
        return RequestMiddleware(
            stack,
            metrics=metrics,
            access_log=access_log,
            # with tracing on every request goes through the stack, where its span middleware is
            direct={} if traced else dict.fromkeys(CHAT_PATHS, chat),
            on_error=handle_error,
            handled=HANDLED_ERRORS,
        )

    app = GatewayApp(
        routes=routes,
        lifespan=lifespan,
        # endpoints that take a key answer their errors themselves (gateway.server.context); these are the rest's,
        # through the same table (gateway.server.errors.failure)
        exception_handlers={kind: handle_error for kind in (*HANDLED_ERRORS, Exception)},
        outer=outer,
    )
    app.state.gateway = gateway
    app.state.limits = limits  # what `serve` prints at start-up (policies.limits.EffectiveLimits)
    if traced:  # installed only while tracing is on: nothing per request otherwise
        app.add_middleware(TracingMiddleware)  # inside RequestMiddleware: the ids are set when its span starts
    return app
