"""The typed holder of what request handlers use, built once by the app factory (gateway.server.app)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from starlette.requests import Request

from gateway.errors import GatewayError
from gateway.ledger.keys import KeyStore
from gateway.ledger.labels import LabelStore
from gateway.ledger.pricing import PriceBook
from gateway.ledger.writer import Ledger
from gateway.routing.service import RoutingService
from gateway.server.auth import Authenticator
from gateway.server.metrics import GatewayMetrics
from gateway.server.reloads import PolicyReloads
from gateway.server.startup import Startup
from gateway.settings import Settings
from gateway.upstreams.base import Upstream
from policies.schema import Policy


@dataclass
class Gateway:
    settings: Settings
    policy: Policy
    policy_path: Path | None
    upstream: Upstream
    ledger: Ledger
    auth: Authenticator
    prices: PriceBook
    routing: RoutingService
    metrics: GatewayMetrics
    keys: KeyStore  # named keys, their spend and rate windows, and who owns which collection
    labels: LabelStore | None = None  # feedback labels (POST /v1/feedback) and who sent which request
    startup: Startup | None = None  # loads the models and the document store; readiness (None: a bare test holder)
    reloads: PolicyReloads | None = None  # follows the policy reloads of every process on the ledger

    @property
    def store(self):
        """The collections' document store (pipelines.store.DocumentStore), once start-up has built it."""
        if self.startup is None or self.startup.store is None:
            raise self.not_ready()
        return self.startup.store

    def not_ready(self) -> GatewayError:
        return (
            self.startup.not_ready()
            if self.startup is not None
            else GatewayError(503, "the gateway is still starting", code="not_ready")
        )

    def check_ready(self) -> None:
        """503 (not_ready or build_failed) until start-up has loaded what routed requests need."""
        if self.startup is None or not self.startup.ready:
            raise self.not_ready()


def gateway_of(request: Request) -> Gateway:
    """The Gateway of the app serving this request."""
    return request.app.state.gateway
