"""What a client is told a request used and cost: every leg of an escalation, plain and streamed, and the cost
header; the upstream's usage on a pass-through."""

from __future__ import annotations

import httpx
import openai
import pytest

from gateway.routing.embedding_model import PACKAGED_EMBEDDING_MODEL
from gateway.server.app import create_app
from gateway.server.usage import cost_text
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
def escalating(upstream, embedder, tmp_path, monkeypatch):
    """A gateway whose cheap model refuses: every documented question is answered again by the long route."""
    monkeypatch.setenv("OPENAI_API_BASE", f"{upstream[0]}/v1")  # pass-through names go to the fake upstream
    monkeypatch.setenv("OPENAI_API_KEY", "sk-upstream-test")
    policy = routing_policy(upstream[0], cheap="cheap-refuser")
    policy = policy.model_copy(update={"passthrough": policy.passthrough.model_copy(update={"allow": ["gpt-*"]})})
    app = create_app(Settings(data_dir=tmp_path), policy=policy, embedder=embedder)
    with serve_app(app) as url:
        yield url, app


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def test_an_escalated_answer_counts_both_legs_with_their_detail_and_cost(escalating):
    url, app = escalating
    raw = client(url).chat.completions.with_raw_response.create(
        model="selfroute",
        messages=[{"role": "user", "content": QUESTION}],
        extra_body={"selfroute": {"documents": [{"text": manual()}]}},
    )
    completion = raw.parse()
    assert raw.headers["x-selfroute-route"] == "rag>long"
    [row] = ledger_rows(app)
    embedded, cheap, long = ledger_rows(app, "upstream_calls")  # the new manual's embedding first (the rag prompt)
    assert cheap["prompt_tokens"] > 0 and long["prompt_tokens"] > 0
    usage = completion.usage
    assert embedded["model"] == PACKAGED_EMBEDDING_MODEL and embedded["cost_usd"] == 0
    legs = embedded["prompt_tokens"] + cheap["prompt_tokens"] + long["prompt_tokens"]
    assert usage.prompt_tokens == legs == row["prompt_tokens"]  # the gateway's own embedding counts, as in the row
    assert usage.completion_tokens == cheap["completion_tokens"] + long["completion_tokens"] == row["completion_tokens"]
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    info = completion.model_extra["selfroute"]
    assert [(leg["model"], leg["route"], leg["prompt_tokens"]) for leg in info["legs"]] == [
        (PACKAGED_EMBEDDING_MODEL, "passthrough", embedded["prompt_tokens"]),
        ("openai/cheap-refuser", "rag", cheap["prompt_tokens"]),
        ("openai/fake-long", "long", long["prompt_tokens"]),
    ]
    assert info["cost_usd"] == pytest.approx(row["cost_usd"]) and row["cost_usd"] > 0
    assert raw.headers["x-selfroute-cost-usd"] == cost_text(row["cost_usd"])
    assert float(raw.headers["x-selfroute-cost-usd"]) == pytest.approx(cheap["cost_usd"] + long["cost_usd"])


def test_an_escalated_stream_counts_both_legs_in_its_final_chunk(escalating):
    url, app = escalating
    with client(url).chat.completions.with_streaming_response.create(
        model="selfroute",
        messages=[{"role": "user", "content": QUESTION}],
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"selfroute": {"documents": [{"text": manual()}]}},
    ) as response:
        assert response.headers["x-selfroute-route"] == "rag>long"
        assert "x-selfroute-cost-usd" not in response.headers  # headers go before the cost is known
        chunks = list(response.parse())
    final = chunks[-1]
    [row] = ledger_rows(app)
    embedded, cheap, long = ledger_rows(app, "upstream_calls")  # the new manual's embedding first (the rag prompt)
    legs = embedded["prompt_tokens"] + cheap["prompt_tokens"] + long["prompt_tokens"]
    assert final.usage.prompt_tokens == legs == row["prompt_tokens"]
    assert final.usage.completion_tokens == row["completion_tokens"] > long["completion_tokens"]
    info = final.model_extra["selfroute"]
    assert info["cost_usd"] == pytest.approx(row["cost_usd"]) and row["cost_usd"] > 0
    assert [leg["route"] for leg in info["legs"]] == ["passthrough", "rag", "long"] and info["request_id"] == row["id"]
    assert all("selfroute" not in (c.model_extra or {}) for c in chunks[:-1])  # only the final chunk


def test_a_single_leg_answer_keeps_the_upstreams_usage_and_gets_the_header(escalating):
    url, app = escalating
    raw = client(url).chat.completions.with_raw_response.create(
        model="selfroute", messages=[{"role": "user", "content": "Say hello."}]
    )  # no document: not checked
    [row] = ledger_rows(app)
    assert raw.headers["x-selfroute-cost-usd"] == cost_text(row["cost_usd"])
    assert raw.parse().usage.prompt_tokens == row["prompt_tokens"]


def test_pass_through_carries_the_cost_only_when_priced(escalating):
    url, app = escalating
    body = {"messages": [{"role": "user", "content": "hello"}]}
    priced = httpx.post(f"{url}/v1/chat/completions", json={**body, "model": "openai/fake-long"})  # the policy's
    unpriced = httpx.post(f"{url}/v1/chat/completions", json={**body, "model": "gpt-test"})  # no price anywhere
    assert priced.status_code == unpriced.status_code == 200
    rows = ledger_rows(app)
    assert priced.headers["x-selfroute-cost-usd"] == cost_text(rows[0]["cost_usd"]) != "0"
    assert "x-selfroute-cost-usd" not in unpriced.headers
    assert "selfroute" not in priced.json()  # the upstream's body as it came
    with httpx.stream(
        "POST",
        f"{url}/v1/chat/completions",
        json={**body, "model": "openai/fake-long", "stream": True, "stream_options": {"include_usage": True}},
    ) as r:
        events = [line for line in r.iter_lines() if line.startswith("data: {")]
    import json

    last = json.loads(events[-1][len("data: ") :])
    assert last["usage"]["prompt_tokens"] > 0 and last["selfroute"]["cost_usd"] > 0


def test_cost_text():
    assert [cost_text(x) for x in (0.0, 0.0012, 1e-7, 2.5, -1.0)] == ["0", "0.0012", "0.0000001", "2.5", "0"]
