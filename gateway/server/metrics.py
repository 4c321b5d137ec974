"""Prometheus metrics fed by ledger records: `ledger.subscribe(metrics.observe)`, served at GET /metrics.

Each GatewayMetrics owns its registry, so several apps (tests) in one process never collide.
Labels stay low-cardinality: the request's route, model, status; never key ids or request ids.
Clients choose model names on pass-through requests, so only the first MAX_MODEL_LABELS distinct
names get a label of their own; later ones are counted under "other", and a label value is at most
MAX_LABEL_CHARS long. Requests refused for a missing or wrong key are only counted here, never ledgered.

Under `selfroute serve --workers N` every worker writes its values to files in $PROMETHEUS_MULTIPROC_DIR
(prometheus_client's multiprocess mode, set up by `serve` before the workers start) and a scrape, whichever
worker answers it, adds up all of them, so counters never jump back between scrapes. process_* then comes
once per live worker, labelled with its pid. No `_created` series in either mode.
"""

from __future__ import annotations

import logging
import os
import platform
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
    values,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.ledger.records import RequestRecord
from gateway.settings import package_version
from policies.routes import FALLBACK as FALLBACK_ROUTE

logger = logging.getLogger(__name__)

MAX_MODEL_LABELS = 64
MAX_LABEL_CHARS = 128
OTHER_MODEL = "other"
LATENCY_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
TTFT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_WORKER_FILE = re.compile(r"_(\d+)\.db$")  # prometheus_client names each worker's files TYPE[_MODE]_PID.db


def multiprocess_dir() -> str | None:
    """The multiprocess directory when prometheus_client is in multiprocess mode (the variable was set before it
    was imported), else None."""
    path = os.environ.get(MULTIPROC_ENV) or os.environ.get(MULTIPROC_ENV.lower())
    return path if path and values.ValueClass is not values.MutexValue else None


def _route(value: str | None) -> str:
    return value or "unknown"


def _constant(pid: int) -> Callable[[], int]:
    return lambda: pid


class WorkerProcesses:
    """process_* of every live worker writing to the multiprocess directory, each labelled with its pid."""

    def __init__(self, path: str):
        self.path = Path(path)

    def collect(self):
        pids = sorted({int(m.group(1)) for f in self.path.glob("*.db") if (m := _WORKER_FILE.search(f.name))})
        families: dict[str, Metric] = {}
        for pid in pids:
            for family in ProcessCollector(pid=_constant(pid), registry=None).collect():  # nothing for a dead one
                merged = families.setdefault(family.name, Metric(family.name, family.documentation, family.type))
                for sample in family.samples:
                    merged.add_sample(sample.name, {**sample.labels, "pid": str(pid)}, sample.value)
        return list(families.values())


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None, max_model_labels: int = MAX_MODEL_LABELS):
        self.max_model_labels = max_model_labels
        self._models: set[str] = set()
        self._models_lock = threading.Lock()
        disable_created_metrics()  # a _created series per child doubles the output and no dashboard reads it
        self.multiprocess_dir = multiprocess_dir()
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        if self.multiprocess_dir is None:  # one process: its own process_* (multiprocess: every worker's, at scrape)
            ProcessCollector(registry=r)
        self.requests = Counter(
            "selfroute_requests", "Requests answered, by route and HTTP status.", ["route", "status"], registry=r
        )
        self.request_cost = Counter(
            "selfroute_request_cost_usd", "Cost of requests in USD (all their legs), by route.", ["route"], registry=r
        )
        self.counterfactual_cost = Counter(
            "selfroute_counterfactual_cost_usd",
            "What always-long-context would have cost, in USD, by route.",
            ["route"],
            registry=r,
        )
        self.tokens = Counter(
            "selfroute_tokens",
            "Upstream tokens by request route, model and kind (prompt|completion).",
            ["route", "model", "kind"],
            registry=r,
        )
        self.cost = Counter(
            "selfroute_cost_usd", "Upstream cost in USD by request route and model.", ["route", "model"], registry=r
        )
        self.upstream_calls = Counter(
            "selfroute_upstream_calls",
            "Upstream calls (legs) by request route and model.",
            ["route", "model"],
            registry=r,
        )
        self.fallbacks = Counter(
            "selfroute_fallbacks",
            "Self-Route fallbacks: a RAG answer judged unanswerable, answered again with long context.",
            registry=r,
        )
        self.unpriced_calls = Counter(
            "selfroute_unpriced_calls",
            "Upstream calls to a model with no known price (recorded at $0), by model.",
            ["model"],
            registry=r,
        )
        self.upstream_errors = Counter(
            "selfroute_upstream_errors",
            "Upstream calls that failed, by request route and model.",
            ["route", "model"],
            registry=r,
        )
        self.request_latency = Histogram(
            "selfroute_request_latency_seconds",
            "Request latency by route.",
            ["route"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.upstream_latency = Histogram(
            "selfroute_upstream_latency_seconds",
            "Upstream call latency by request route and model.",
            ["route", "model"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.unauthenticated = Counter(
            "selfroute_unauthenticated_requests",
            "Requests refused for a missing or unknown API key (not ledgered).",
            registry=r,
        )
        # livesum: a worker that exits takes its share with it (gateway.server.app marks it dead on shutdown)
        self.in_flight = Gauge(
            "selfroute_requests_in_flight",
            "HTTP requests being answered now (scrapes not counted).",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.ttft = Histogram(
            "selfroute_time_to_first_token_seconds",
            "Streamed answers: from the request's arrival to its first event sent, by route.",
            ["route"],
            buckets=TTFT_BUCKETS_S,
            registry=r,
        )
        self.build_info = Gauge(
            "selfroute_build_info",
            "The running selfroute: version and Python (always 1).",
            ["version", "python"],
            registry=r,
            multiprocess_mode="max",
        )
        self.build_info.labels(package_version(), platform.python_version()).set(1)
        # what this process routes with (gateway.server.reloads): per worker (liveall: labelled pid under --workers)
        self.policy_generation = Gauge(
            "selfroute_policy_generation",
            "The policy reload generation this process's routing models came with (0: none since the ledger began).",
            registry=r,
            multiprocess_mode="liveall",
        )
        self.reload_error = Gauge(
            "selfroute_policy_reload_error",
            "1 when this process's last policy reload failed (it kept the models it had), else 0.",
            registry=r,
            multiprocess_mode="liveall",
        )
        self.routing_threshold = Gauge(
            "selfroute_routing_threshold",
            "The threshold in force in this process, by model (classifier, verifier, verifier_refusal).",
            ["model"],
            registry=r,
            multiprocess_mode="liveall",
        )
        self.routing_model = Gauge(
            "selfroute_routing_model_info",
            "The routing model files in force in this process, by model and the file's sha256 (1; 0: replaced).",
            ["model", "sha256"],
            registry=r,
            multiprocess_mode="liveall",
        )
        self._model_files: dict[str, str] = {}
        self._children: dict[tuple, Any] = {}
        self._per_request: dict[tuple[str, int], tuple[Any, Any, Any, Any]] = {}
        self._per_call: dict[tuple[str, str], tuple[Any, Any, Any, Any, Any]] = {}

    def _child(self, metric, *labels: str):
        # prometheus_client's .labels() validates and locks on every call; observe runs on the request's thread
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def _model(self, name: str) -> str:
        """The label for a model name: its own for the first max_model_labels names seen, else "other"."""
        name = name[:MAX_LABEL_CHARS]
        if name in self._models:
            return name
        with self._models_lock:  # requests finish on several threads: the cap must hold exactly
            if name in self._models or len(self._models) < self.max_model_labels:
                self._models.add(name)
                return name
        return OTHER_MODEL

    def _request_children(self, route: str, status: int) -> tuple[Any, Any, Any, Any]:
        # one look-up per request for its four series, not one each (observe runs on every request)
        key = (route, status)
        children = self._per_request.get(key)
        if children is None:
            children = self._per_request[key] = (
                self.requests.labels(route, str(status)),
                self.request_cost.labels(route),
                self.counterfactual_cost.labels(route),
                self.request_latency.labels(route),
            )
        return children

    def _call_children(self, route: str, model: str) -> tuple[Any, Any, Any, Any, Any]:
        key = (route, model)
        children = self._per_call.get(key)
        if children is None:
            children = self._per_call[key] = (
                self.upstream_calls.labels(route, model),
                self.tokens.labels(route, model, "prompt"),
                self.tokens.labels(route, model, "completion"),
                self.cost.labels(route, model),
                self.upstream_latency.labels(route, model),
            )
        return children

    def observe(self, record: RequestRecord) -> None:
        """Count one finished request and its legs (runs on the request's thread: only counter updates). A series
        exists from its first look-up, so adding 0 (an unpriced call's cost) is skipped: the output is the same."""
        route = _route(record.route)
        requests, request_cost, counterfactual_cost, request_latency = self._request_children(route, record.status)
        requests.inc()
        if record.cost_usd > 0:
            request_cost.inc(record.cost_usd)
        if record.counterfactual_cost_usd > 0:
            counterfactual_cost.inc(record.counterfactual_cost_usd)
        if record.route == FALLBACK_ROUTE:
            self.fallbacks.inc()
        if record.latency_ms is not None:
            request_latency.observe(record.latency_ms / 1000)
        for call in record.calls:
            model = self._model(call.model)
            calls, prompt_tokens, completion_tokens, cost, latency = self._call_children(route, model)
            calls.inc()
            if call.prompt_tokens > 0:
                prompt_tokens.inc(call.prompt_tokens)
            if call.completion_tokens > 0:
                completion_tokens.inc(call.completion_tokens)
            if call.cost_usd > 0:
                cost.inc(call.cost_usd)
            if call.unpriced:
                self._child(self.unpriced_calls, model).inc()
            if call.error:
                self._child(self.upstream_errors, route, model).inc()
            if call.latency_ms is not None:
                latency.observe(call.latency_ms / 1000)

    def models_in_force(self, state: dict[str, Any]) -> None:
        """This process's reload state (gateway.server.reloads.PolicyReloads.state), off the request path."""
        loaded = state.get("loaded_generation")
        if loaded is not None:
            self.policy_generation.set(loaded)
        self.reload_error.set(1 if state.get("last_error") else 0)
        classifier, verifier = state.get("classifier") or {}, state.get("verifier") or {}
        thresholds = {
            "classifier": classifier.get("threshold"),
            "verifier": verifier.get("threshold"),
            "verifier_refusal": verifier.get("refusal_threshold"),
        }
        for name, value in thresholds.items():
            if value is not None:
                self.routing_threshold.labels(name).set(value)
        for name in ("classifier", "verifier"):
            digest = (state.get(name) or {}).get("sha256")
            previous = self._model_files.get(name)
            if digest is None or digest == previous:
                continue
            if previous is not None:
                self.routing_model.labels(name, previous).set(0)
            self.routing_model.labels(name, digest).set(1)
            self._model_files[name] = digest

    def time_to_first_token(self, route: str | None, seconds: float) -> None:
        self._child(self.ttft, _route(route)).observe(seconds)

    def render(self) -> bytes:
        if self.multiprocess_dir is None:
            return generate_latest(self.registry)
        registry = CollectorRegistry()  # a fresh one per scrape, as prometheus_client's multiprocess guide says
        MultiProcessCollector(registry, path=self.multiprocess_dir)
        registry.register(WorkerProcesses(self.multiprocess_dir))
        return generate_latest(registry)

    def close(self) -> None:
        """This worker is going away: its live gauges (in flight) stop counting; its counters stay in the sum."""
        if self.multiprocess_dir is not None:
            mark_process_dead(os.getpid(), self.multiprocess_dir)


async def metrics_endpoint(request: Request) -> Response:
    # Open like most scrape targets: only aggregate counters, no keys, prompts or request ids.
    metrics: GatewayMetrics = request.app.state.gateway.metrics
    return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)


def metrics_route() -> Route:
    return Route("/metrics", metrics_endpoint, methods=["GET"])
