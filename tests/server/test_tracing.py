"""OpenTelemetry spans (the SDK's in-memory exporter): one per request, children for the plan, the preparation,
each upstream leg and the answer check, with the route and its reason; none of it when tracing is off."""

from __future__ import annotations

import openai
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway import tracing
from gateway.server.app import create_app
from gateway.server.tracing import TracingMiddleware
from gateway.settings import Settings
from pipelines.embedding import Embedder
from tests.support.gateway import ledger_rows
from tests.support.policies import routing_policy
from tests.support.routed import manual
from tests.support.servers import serve_app

QUESTION = "What is the maintenance password for the Zephyr pump?"


@pytest.fixture(scope="module")
def embedder():
    return Embedder()


@pytest.fixture()
def traced(upstream, embedder, tmp_path):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.configure(provider)
    try:
        app = create_app(
            Settings(data_dir=tmp_path), policy=routing_policy(upstream[0], cheap="cheap-refuser"), embedder=embedder
        )
        with serve_app(app) as url:
            yield url, app, exporter
    finally:
        tracing.disable()


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def test_an_escalated_request_is_one_trace_with_its_plan_legs_and_check(traced):
    url, app, exporter = traced
    _client(url).chat.completions.create(
        model="selfroute",
        messages=[{"role": "user", "content": QUESTION}],
        extra_body={"selfroute": {"documents": [{"text": manual()}]}},
        extra_headers={"X-Request-Id": "trace-me"},
    )
    [row] = ledger_rows(app)
    spans = exporter.get_finished_spans()
    [root] = [s for s in spans if s.name == "POST /v1/chat/completions"]
    assert root.parent is None and root.attributes["selfroute.request_id"] == "trace-me"
    assert root.attributes["selfroute.route"] == "rag>long" == row["route"]
    assert root.attributes["selfroute.reason"] == row["reason"] and row["reason"]
    assert root.attributes["http.response.status_code"] == 200
    assert root.attributes["selfroute.cost_usd"] == pytest.approx(row["cost_usd"])
    children = [s for s in spans if s.context.trace_id == root.context.trace_id and s is not root]
    names = [s.name for s in children]
    assert names.count("selfroute.plan") == 1 and names.count("selfroute.verify") == 1
    assert names.count("selfroute.prepare") == 2  # the cheap route's passages, then the long route's units
    legs = [s for s in children if s.name == "selfroute.upstream"]
    assert [(s.attributes["selfroute.model"], s.attributes["selfroute.route"]) for s in legs] == [
        ("openai/cheap-refuser", "rag"),
        ("openai/fake-long", "long"),
    ]
    assert all(s.parent.span_id == root.context.span_id for s in children)
    assert next(s for s in children if s.name == "selfroute.verify").attributes["selfroute.escalate"] is True
    text = str([dict(s.attributes) for s in spans])
    assert "Zephyr" not in text and "BLUE-HERON" not in text  # never the prompt or the documents


def test_a_streamed_leg_ends_with_its_stream(traced):
    url, _, exporter = traced
    chunks = list(
        _client(url).chat.completions.create(
            model="selfroute", messages=[{"role": "user", "content": "Say hello."}], stream=True
        )
    )
    assert chunks
    legs = [s for s in exporter.get_finished_spans() if s.name == "selfroute.upstream"]
    assert len(legs) == 1 and legs[0].attributes["selfroute.stream"] is True
    assert legs[0].attributes["selfroute.status"] == 200


def test_off_by_default_no_middleware_and_a_shared_no_op(upstream, tmp_path):
    assert not tracing.enabled()
    app = create_app(Settings(data_dir=tmp_path), policy=routing_policy(upstream[0]))
    assert all(m.cls is not TracingMiddleware for m in app.user_middleware)
    assert tracing.span("x") is tracing.span("y")  # one shared null context: no allocation per call
    assert tracing.start_span("x") is None
