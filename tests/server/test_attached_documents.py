"""Documents attached to requests, through a real gateway: the first question on new documents is answered from a
first pass while they are embedded in the background (pipelines.store.pending), the ledger records which each
request got, and shutdown stops the background ingestion without leaving a collection taken for complete."""

from __future__ import annotations

import json
import time

import openai
import pytest

from pipelines.embedding import Embedder
from pipelines.store import DocumentStore
from tests.support.gateway import ledger_rows, running_gateway
from tests.support.pipelines import SlowEmbedder
from tests.support.policies import make_policy
from tests.support.routed import manual

DOCUMENT = {"id": "manual", "text": manual(sections=60, planted_at=41), "title": "Pump manual"}


@pytest.fixture(scope="module")
def base_embedder():
    return Embedder()


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def ask(url: str, question: str, route: str) -> dict:
    raw = client(url).chat.completions.with_raw_response.create(
        model="selfroute",
        messages=[{"role": "user", "content": question}],
        extra_body={"selfroute": {"route": route, "documents": [DOCUMENT]}},
    )
    return raw.http_response.json()["selfroute"]["provenance"]


def policy(base: str):
    # the long model's window is smaller than the manual, so the long route scores units
    return make_policy(base, long={"context_window": 1500})


def test_first_questions_get_the_first_pass_later_ones_the_full_index_and_the_ledger_says_which(
    upstream, tmp_path, monkeypatch, base_embedder
):
    base, fake = upstream
    monkeypatch.setenv("OPENAI_API_BASE", f"{base}/v1")
    with running_gateway(tmp_path, policy(base), embedder=base_embedder) as (url, app):
        first = ask(url, "What is the maintenance password for the Zephyr pump?", "rag")
        assert first["retrieval_index"] == "partial"
        assert "BLUE-HERON-42" in fake.state.received[-1]["body"]["messages"][-1]["content"]
        units = ask(url, "What is the maintenance password for the Zephyr pump?", "long")
        assert units["all_fitted"] is False and units["retrieval_index"] == "partial"
        assert "BLUE-HERON-42" in fake.state.received[-1]["body"]["messages"][-1]["content"]
        app.state.gateway.store.wait_inline()
        later = ask(url, "How often must the pump housing be inspected?", "rag")
        assert later["retrieval_index"] == "full"
        assert ask(url, "What is the maintenance password for the Zephyr pump?", "long")["retrieval_index"] == "full"
        recorded = [json.loads(row["provenance"])["retrieval_index"] for row in ledger_rows(app)]
        assert recorded == ["partial", "partial", "full", "full"]


def test_shutdown_stops_the_background_ingestion_and_the_next_gateway_finishes_it(
    upstream, tmp_path, monkeypatch, base_embedder
):
    base, fake = upstream
    monkeypatch.setenv("OPENAI_API_BASE", f"{base}/v1")
    slow = SlowEmbedder(base_embedder, 0.5)
    slow.batch_size = 2  # many short slices: the ingestion takes a while and stops between two of them
    with running_gateway(tmp_path, policy(base), embedder=slow) as (url, app):
        store = app.state.gateway.store
        assert ask(url, "What is the maintenance password for the Zephyr pump?", "rag")["retrieval_index"] == "partial"
        [pending] = store.inline._pending.values()
        time.sleep(1.0)
        assert pending.started and pending.state == "running"
        stopping = time.perf_counter()
    assert time.perf_counter() - stopping < 15  # shut down without embedding the rest
    assert pending.state == "cancelled"
    reader = DocumentStore(store.uri, base_embedder, store.settings)
    assert not reader.inline.holds(pending.name, pending.docs)  # not taken for complete
    with running_gateway(tmp_path, policy(base), embedder=base_embedder) as (url, app):
        assert ask(url, "Which valves close clockwise?", "rag")["retrieval_index"] == "partial"
        app.state.gateway.store.wait_inline()
        assert ask(url, "Which valves close clockwise?", "rag")["retrieval_index"] == "full"
    rows = sorted((c.doc_id, c.position) for c, _ in reader.chunks(pending.name))
    assert len(rows) == len(set(rows)) == len(pending.chunks)  # no duplicates from the two ingestions
