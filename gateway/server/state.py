"""The typed holder of what request handlers use, built once by the app factory (gateway.server.app)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from starlette.requests import Request

from gateway.ledger.keys import KeyStore
from gateway.ledger.labels import LabelStore
from gateway.ledger.pricing import PriceBook
from gateway.ledger.writer import Ledger
from gateway.routing.service import RoutingService
from gateway.server.auth import Authenticator
from gateway.server.metrics import GatewayMetrics
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

    @property
    def store(self):
        """The collections' document store (pipelines.store.DocumentStore), once start-up has built it."""
        if self.routing.store is None:
            raise self.routing.not_ready()
        return self.routing.store


def gateway_of(request: Request) -> Gateway:
    """The Gateway of the app serving this request."""
    return request.app.state.gateway
