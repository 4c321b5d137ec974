"""POST /v1/route/explain prices the long route with the provider's prompt cache as the gateway last saw it: cold,
then warm once a long request sent the same documents and the upstream reported caching, cold again after the TTL;
never for a block chosen per question; explaining warms nothing. Live gateway, fake upstream reporting cached usage
as Anthropic (cache_control) and OpenAI (automatic prefix caching) do."""

from __future__ import annotations

import httpx
import openai
import pytest

from gateway.routing.warm_cache import COLD, NOT_CACHEABLE, WARM, WarmPrefixes
from gateway.server.app import create_app
from gateway.settings import Settings
from pipelines.embedding import Embedder
from policies.routes import LONG
from tests.support.gateway import ledger_rows
from tests.support.policies import prompt_cache_policy
from tests.support.routed import Clock, documents
from tests.support.servers import serve_app

QUESTION = "Which way do the valves close?"


@pytest.fixture(scope="module")
def embedder():
    return Embedder()


@pytest.fixture
def start(upstream, embedder, tmp_path):
    servers = []

    def _start(
        long_model: str = "fake-long", cache_control: bool = True, window: int = 16000, cheap: str = "fake-cheap"
    ):
        policy = prompt_cache_policy(
            upstream[0],
            name="explain-cache-test",
            long=long_model,
            cheap=cheap,
            cache_control=cache_control,
            window=window,
            min_tokens=100,
        )
        app = create_app(Settings(data_dir=tmp_path / str(len(servers))), policy=policy, embedder=embedder)
        clock = Clock()
        app.state.gateway.routing.warm = WarmPrefixes(clock=clock)
        server = serve_app(app)
        servers.append(server)
        return server.__enter__(), app, clock

    yield _start
    for server in servers:
        server.__exit__(None, None, None)


def explain(url: str, docs: list[dict], question: str = QUESTION, key: str = "unused") -> dict:
    """The long route's estimate, asked with the key `ask` uses (attached documents are per key)."""
    response = httpx.post(
        f"{url}/v1/route/explain",
        timeout=60,
        headers={"authorization": f"Bearer {key}"},
        json={
            "model": "selfroute",
            "max_tokens": 50,
            "messages": [{"role": "user", "content": question}],
            "selfroute": {"documents": docs},
        },
    )
    assert response.status_code == 200, response.text
    return response.json()["estimates"][LONG]


def ask(url: str, docs: list[dict], question: str = "Do the pumps hum?", route: str = LONG):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0).chat.completions.create(
        model="selfroute",
        max_tokens=50,
        messages=[{"role": "user", "content": question}],
        extra_body={"selfroute": {"documents": docs, "route": route}},
    )


def priced(estimate: dict, cached: int = 0, written: int = 0) -> float:
    prompt, completion = estimate["prompt_tokens"], estimate["completion_tokens_estimate"]
    return ((prompt - cached - written) * 10.0 + cached * 1.0 + written * 12.5 + completion * 20.0) / 1e6


def test_explain_is_cold_then_warm_after_a_long_request_on_the_same_documents(start, upstream):
    url, app, _ = start()
    docs = documents("estuary")
    first = explain(url, docs)
    assert first["cache"] == COLD and "has not reported" in first["cache_reason"]
    assert first["cost_usd"] == first["cost_usd_uncached"] == pytest.approx(priced(first))
    ask(url, docs)  # the upstream reports writing the marked block: this upstream caches
    sent = upstream[1].state.received[-1]["body"]["messages"][-1]["content"]
    block_words = len(sent[0]["text"].split())
    warm = explain(url, docs)
    # the same documents, another question: the block the upstream reported writing is read back from its cache
    assert (warm["cache"], warm["cached_tokens_estimate"], warm["cache_write_tokens_estimate"]) == (
        WARM,
        block_words,
        0,
    )
    assert warm["prompt_tokens"] == first["prompt_tokens"] and warm["cost_usd_uncached"] == first["cost_usd_uncached"]
    assert warm["cost_usd"] == pytest.approx(priced(warm, cached=block_words))
    assert warm["cost_usd"] < 0.5 * warm["cost_usd_uncached"]
    # which is what the upstream then reports for that request
    ask(url, docs, QUESTION)
    assert ledger_rows(app, "upstream_calls")[-1]["cached_tokens"] == warm["cached_tokens_estimate"]
    # attached documents are per key: another key is not told that these were sent
    assert explain(url, docs, key="another-key")["cache"] == COLD

    # other documents are cold: Anthropic-style, the marked block would be written at the write price
    other = explain(url, documents("delta"))
    prefix = other["cache_write_tokens_estimate"]
    assert other["cache"] == COLD and "not sent in the last 300 s" in other["cache_reason"]
    assert 0 < prefix < other["prompt_tokens"] and other["cached_tokens_estimate"] == 0
    assert (
        other["cost_usd"] == pytest.approx(priced(other, written=prefix))
        and other["cost_usd"] > other["cost_usd_uncached"]
    )


def test_a_warm_block_goes_cold_after_the_models_ttl(start):
    url, _, clock = start()
    docs = documents("lagoon")
    ask(url, docs)
    clock.now += 299
    assert explain(url, docs)["cache"] == WARM
    clock.now += 2
    expired = explain(url, docs)
    assert expired["cache"] == COLD and "300 s" in expired["cache_reason"]
    assert expired["cost_usd"] > expired["cost_usd_uncached"]  # written again
    ask(url, docs)  # sent again: warm again for another TTL
    assert explain(url, docs)["cache"] == WARM


def test_only_a_long_request_puts_the_block_in_the_providers_cache(start):
    url, _, _ = start()
    ask(url, documents("strait"))  # the upstream has reported caching
    docs = documents("cove")
    ask(url, docs, route="rag")  # passages went to the cheap model: the long block was never sent
    assert explain(url, docs)["cache"] == COLD
    ask(url, docs)
    assert explain(url, docs)["cache"] == WARM


def test_an_escalated_streamed_answer_warms_the_block_too(start):
    # the cheap model refuses, the check escalates, and the long answer is streamed: the long leg sent the block
    url, app, _ = start(cheap="cheap-refuser")
    ask(url, documents("reef"))  # the upstream has reported caching
    docs = documents("shoal")
    stream = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0).chat.completions.create(
        model="selfroute",
        max_tokens=50,
        stream=True,
        messages=[{"role": "user", "content": QUESTION}],
        extra_body={"selfroute": {"documents": docs, "route": "rag"}},
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices).startswith("echo:")
    assert ledger_rows(app)[-1]["route"] == "rag>long"
    assert explain(url, docs)["cache"] == WARM


def test_explaining_warms_nothing(start):
    url, _, _ = start()
    ask(url, documents("sound"))  # the upstream has reported caching: only the block's history decides
    docs = documents("firth")
    states = [explain(url, docs)["cache"] for _ in range(3)]
    assert states == [COLD, COLD, COLD]
    ask(url, documents("sound"), QUESTION)
    assert explain(url, docs)["cache"] == COLD


def test_an_upstream_that_caches_by_itself_is_assumed_warm_only_once_it_reported_a_hit(start):
    # OpenAI-style: no marking, no write reported; the second request on a prefix reports the cached part
    url, app, _ = start("fake-long-prefix-cache", cache_control=False)
    docs = documents("inlet")
    ask(url, docs)
    after_one = explain(url, docs)
    assert after_one["cache"] == COLD and "has not reported" in after_one["cache_reason"]
    assert after_one["cache_write_tokens_estimate"] == 0 and after_one["cost_usd"] == after_one["cost_usd_uncached"]
    ask(url, docs, QUESTION)
    hit = explain(url, docs)
    cached = ledger_rows(app, "upstream_calls")[-1]["cached_tokens"]  # what the upstream reported for the prefix
    assert hit["cache"] == WARM and hit["cached_tokens_estimate"] == cached > 0
    assert hit["cost_usd"] == pytest.approx(priced(hit, cached=cached))


def test_a_block_chosen_per_question_is_not_cacheable(start, upstream):
    url, _, _ = start(window=2000)
    ask(url, documents("bay"))  # fits whole: marked, and the upstream reports caching
    assert isinstance(upstream[1].state.received[-1]["body"]["messages"][-1]["content"], list)
    large = [*documents("bay"), {"id": "appendix", "text": "The bay pumps are serviced every spring. " * 250}]
    before = explain(url, large)
    assert before["prompt_tokens_exact"] is False  # over the window: units are chosen per question
    ask(url, large)
    assert isinstance(upstream[1].state.received[-1]["body"]["messages"][-1]["content"], str)  # not marked
    after = explain(url, large)
    for estimate in (before, after):
        assert estimate["cache"] == NOT_CACHEABLE and estimate["cost_usd"] == estimate["cost_usd_uncached"]
        assert estimate["cached_tokens_estimate"] == estimate["cache_write_tokens_estimate"] == 0
    # under the model's minimum: nothing to cache either
    tiny = explain(url, [{"id": "memo", "text": "The bay opens at nine."}])
    assert tiny["cache"] == NOT_CACHEABLE and "prompt_cache_min_tokens" in tiny["cache_reason"]
    # a conversation that fits goes as the client wrote it, unmarked
    pasted = "\n\n".join(d["text"] for d in documents("bay")) + "\n\nQuestion: do the pumps hum?"
    response = httpx.post(
        f"{url}/v1/route/explain",
        timeout=60,
        json={"model": "selfroute", "messages": [{"role": "user", "content": pasted}]},
    )
    conversation = response.json()["estimates"][LONG]
    assert conversation["prompt_tokens_exact"] is True and conversation["cache"] == NOT_CACHEABLE
