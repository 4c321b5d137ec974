"""The planner on the request path: once attached documents are ingested, no document text is embedded
again (only a question, once), and explain estimates tokens without preparing prompts."""

from __future__ import annotations

import json

import pytest

from gateway.ledger.pricing import PriceBook
from gateway.protocol import parse_chat_request
from gateway.routing.decision import Router
from gateway.routing.errors import RequestTooLarge
from gateway.routing.explain import explain_plan
from gateway.routing.planner import RoutePlanner
from gateway.server.errors import failure
from pipelines.documents import Document
from pipelines.embedding import Embedder
from pipelines.long_context import LongContextPipeline
from pipelines.store import DocumentStore
from policies.routes import DIRECT, LONG, RAG
from policies.schema import Policy
from tests.support.pipelines import CountingEmbedder, distractor_documents, manual_document


def make_policy(placement: str, window: int = 1500) -> Policy:
    return Policy.model_validate(
        {
            "cheap": {
                "model": "openai/cheap",
                "context_window": 1200,
                "input_cost_per_mtok": 1,
                "output_cost_per_mtok": 2,
            },
            "long": {
                "model": "openai/long",
                "context_window": window,
                "input_cost_per_mtok": 10,
                "output_cost_per_mtok": 20,
            },
            "rag": {"chunking": {"chunk_tokens": 64, "chunk_overlap": 8}, "context_budget_tokens": 300},
            "long_context": {
                "placement": placement,
                "unit_min_tokens": 40,
                "unit_max_tokens": 200,
                "answer_reserve_tokens": 128,
            },
            "routing": {"classifier": None, "default_route": "rag"},
        }
    )


@pytest.fixture(scope="module")
def base_embedder():
    return Embedder()


def chat(question: str, documents: list[Document], route: str | None = None):
    options = {"documents": [{"id": d.id, "text": d.text, "title": d.title} for d in documents]}
    if route:
        options["route"] = route
    body = {"model": "selfroute", "messages": [{"role": "user", "content": question}], "selfroute": options}
    return parse_chat_request(json.dumps(body).encode())


DOCUMENTS = [manual_document(), *distractor_documents()]


@pytest.mark.parametrize("placement", ["edges", "reading"])
def test_second_long_request_on_attached_documents_embeds_no_document_text(tmp_path, base_embedder, placement):
    embedder = CountingEmbedder(base_embedder)
    policy = make_policy(placement)
    planner = RoutePlanner(policy, DocumentStore(str(tmp_path / "db"), embedder, policy.rag), Router(policy, None))

    def ask(question: str):
        parsed, body = chat(question, DOCUMENTS, route=LONG)
        plan = planner.plan(parsed, body["messages"])
        return planner.prepare(plan, LONG)

    first = ask("What is the part number of the replacement impeller kit?")
    assert first.provenance["all_fitted"] is False  # the documents exceed the window: units were chosen
    assert "HP-IK-2231" in first.messages[-1]["content"]  # by the first pass (pipelines.store.pending)
    assert first.provenance["retrieval_index"] == "partial"
    planner.store.wait_inline()  # the documents, embedded in the background
    calls, queries = embedder.calls, embedder.queries_embedded
    second = ask("Which fuse protects the pump motor?")
    assert second.provenance["retrieval_index"] == "full"  # by stored chunk vectors
    assert embedder.calls == calls  # no document text embedded again
    assert embedder.queries_embedded - queries == 1  # the new question, once
    assert "15 ampere fuse" in second.messages[-1]["content"]
    again = ask("Which fuse protects the pump motor?")
    assert embedder.calls == calls and embedder.queries_embedded - queries == 1  # an asked question is remembered
    assert again.messages == second.messages


def test_edges_placement_when_everything_fits_scores_from_stored_vectors(tmp_path, base_embedder):
    embedder = CountingEmbedder(base_embedder)
    policy = make_policy("edges", window=100_000)
    planner = RoutePlanner(policy, DocumentStore(str(tmp_path / "db"), embedder, policy.rag), Router(policy, None))
    parsed, body = chat("What is the part number of the replacement impeller kit?", DOCUMENTS, route=LONG)
    prepared = planner.prepare(planner.plan(parsed, body["messages"]), LONG)
    assert prepared.provenance["all_fitted"] is True
    first_block = prepared.messages[-1]["content"].split("\n\n[Document: ")[1]
    assert "HP-IK-2231" in first_block  # the best unit leads
    scores = [u["score"] for u in prepared.provenance["units"]]
    assert scores[0] == max(scores)
    planner.store.wait_inline()
    calls, queries = embedder.calls, embedder.queries_embedded
    parsed, body = chat("Where are the dealers?", DOCUMENTS, route=LONG)
    planner.prepare(planner.plan(parsed, body["messages"]), LONG)
    assert embedder.calls == calls and embedder.queries_embedded - queries == 1


def test_explain_estimates_without_preparing_prompts(tmp_path, base_embedder, monkeypatch):
    embedder = CountingEmbedder(base_embedder)
    policy = make_policy("edges")
    planner = RoutePlanner(policy, DocumentStore(str(tmp_path / "db"), embedder, policy.rag), Router(policy, None))
    prepared: list[str] = []
    original = LongContextPipeline.prepare
    monkeypatch.setattr(
        LongContextPipeline, "prepare", lambda self, request: prepared.append("x") or original(self, request)
    )
    parsed, body = chat("What is the part number of the replacement impeller kit?", DOCUMENTS)
    result = explain_plan(policy, PriceBook(), planner, parsed, body["messages"], None)
    assert prepared == [] and embedder.calls == 0 and embedder.queries_embedded == 0  # nothing scored or embedded
    estimates = result["estimates"]
    assert set(estimates) == {DIRECT, RAG, LONG}
    # neither the long nor the direct prompt fits: each is estimated at its route's budget, which the
    # prompt really sent stays within
    assert estimates[LONG]["prompt_tokens_exact"] is False and estimates[DIRECT]["prompt_tokens_exact"] is False
    assert estimates[RAG]["prompt_tokens"] < estimates[DIRECT]["prompt_tokens"] < estimates[LONG]["prompt_tokens"]
    monkeypatch.setattr(LongContextPipeline, "prepare", original)
    plan = planner.plan(parsed, body["messages"])
    for route, pipeline in ((LONG, planner.long), (DIRECT, planner.direct)):
        sent = planner.prepare(plan, route).prompt_tokens
        assert (
            0.9 * estimates[route]["prompt_tokens"]
            <= sent
            <= estimates[route]["prompt_tokens"]
            <= pipeline.budget_tokens
        )
    prepared.clear()
    monkeypatch.setattr(
        LongContextPipeline, "prepare", lambda self, request: prepared.append("x") or original(self, request)
    )

    # when everything fits, the estimate is the exact size of the prompt the route would send
    roomy = make_policy("reading", window=100_000)
    planner = RoutePlanner(roomy, planner.store, Router(roomy, None))
    result = explain_plan(roomy, PriceBook(), planner, parsed, body["messages"], None)
    assert prepared == []
    long = result["estimates"][LONG]
    assert long["prompt_tokens_exact"] is True
    monkeypatch.setattr(LongContextPipeline, "prepare", original)
    assert long["prompt_tokens"] == planner.prepare(planner.plan(parsed, body["messages"]), LONG).prompt_tokens


def test_attached_documents_over_the_cap_are_413_before_any_work(tmp_path, base_embedder):
    embedder = CountingEmbedder(base_embedder)
    policy = make_policy("reading")
    policy = policy.model_copy(update={"rag": policy.rag.model_copy(update={"max_attached_tokens": 2000})})
    planner = RoutePlanner(policy, DocumentStore(str(tmp_path / "db"), embedder, policy.rag), Router(policy, None))
    small = [Document("a", "A short note about pumps. " * 50)]  # under the cap in bytes: not even counted
    parsed, body = chat("What about pumps?", small, route=LONG)
    assert planner.plan(parsed, body["messages"]).stats.context_tokens < 2000
    big = [Document("a", "A short note about pumps. " * 300), Document("b", "Another note. " * 300)]
    parsed, body = chat("What about pumps?", big)
    with pytest.raises(RequestTooLarge) as caught:
        planner.plan(parsed, body["messages"])
    error = failure(caught.value).error  # what the client is told
    assert error.status == 413 and error.code == "documents_too_large" and error.param == "selfroute.documents"
    assert "collection" in error.message and "2,000" in error.message
    assert embedder.calls == 0 and embedder.queries_embedded == 0
    assert planner.store.collections() == []
