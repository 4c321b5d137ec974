"""The per-process record of warm long-prompt prefixes: TTL on an injected clock, only upstreams that reported
caching, only stable blocks over the provider's minimum, bounded; and the ledger's always-long counterfactual priced
with it through a live gateway (fake upstream reporting Anthropic-style cache reads and writes)."""

from __future__ import annotations

import httpx  # noqa: F401  (imported whole before the gateway's litellm warm-up thread imports it)
import openai
import pytest

from gateway.ledger.records import UpstreamCall
from gateway.routing.warm_cache import COLD, NOT_CACHEABLE, WARM, WarmPrefixes
from gateway.server.app import create_app
from gateway.settings import Settings
from pipelines.embedding import Embedder
from pipelines.tokens import count_tokens
from policies.schema import ModelConfig
from tests.support.gateway import ledger_rows
from tests.support.policies import prompt_cache_policy
from tests.support.routed import Clock, documents
from tests.support.servers import serve_app

OPENAI = ModelConfig(model="openai/gpt-4.1", prompt_cache_min_tokens=1024)
CLAUDE = ModelConfig(model="anthropic/claude-sonnet-4-5")


def leg(model: str, cached: int = 0, written: int = 0, route: str = "long", error: str | None = None) -> UpstreamCall:
    return UpstreamCall(
        model=model, route=route, prompt_tokens=5000, cached_tokens=cached, cache_write_tokens=written, error=error
    )


def test_a_block_is_warm_for_its_ttl_after_it_was_sent_and_only_once_the_upstream_reported_caching():
    clock = Clock()
    warm = WarmPrefixes(clock=clock)
    assert warm.estimate(OPENAI, "docs", 4000).state == COLD
    warm.record(OPENAI, "docs", [leg(OPENAI.model)], sent_stable=True)  # OpenAI reports nothing on the writing call
    cold = warm.estimate(OPENAI, "docs", 4000)
    assert cold.state == COLD and "has not reported" in cold.reason and cold.cached_tokens == 0
    warm.record(OPENAI, "docs", [leg(OPENAI.model, cached=3968)], sent_stable=True)
    hit = warm.estimate(OPENAI, "docs", 4000)
    # the upstream's own count of the block (OpenAI caches in 128-token steps) is what it reads next time
    assert (hit.state, hit.cached_tokens, hit.write_tokens) == (WARM, 3968, 0)
    clock.now += 300
    assert warm.estimate(OPENAI, "docs", 4000).state == WARM  # the TTL's last second still counts
    clock.now += 1
    expired = warm.estimate(OPENAI, "docs", 4000)
    assert expired.state == COLD and "last 300 s" in expired.reason
    assert warm.estimate(OPENAI, "other-docs", 4000).state == COLD
    # a shorter TTL in the policy, and 0: never warm
    clock.now -= 1
    assert warm.estimate(OPENAI.model_copy(update={"prompt_cache_ttl_s": 60}), "docs", 4000).state == COLD
    never = warm.estimate(OPENAI.model_copy(update={"prompt_cache_ttl_s": 0}), "docs", 4000)
    assert never.state == COLD and "0" in never.reason


def test_only_stable_blocks_over_the_providers_minimum_are_cacheable():
    warm = WarmPrefixes(clock=Clock())
    warm.record(OPENAI, "docs", [leg(OPENAI.model, cached=2000)], sent_stable=True)
    assert warm.estimate(OPENAI, None, 4000).state == NOT_CACHEABLE  # no key: not even hashed
    assert warm.estimate(OPENAI, "docs", None).state == NOT_CACHEABLE  # units chosen or ordered per question
    short = warm.estimate(OPENAI, "docs", 1023)
    assert short.state == NOT_CACHEABLE and "1,024" in short.reason
    assert warm.estimate(OPENAI.model_copy(update={"prompt_cache_min_tokens": 0}), "docs", 1023).state == WARM
    # a block sent per question (sent_stable False) never becomes warm
    warm.record(OPENAI, "chosen", [leg(OPENAI.model, cached=2000)], sent_stable=False)
    assert warm.estimate(OPENAI, "chosen", 4000).state == COLD


def test_a_cold_block_is_written_to_the_cache_on_models_that_need_cache_control():
    warm = WarmPrefixes(clock=Clock())
    unknown = warm.estimate(CLAUDE, "docs", 4000)  # no upstream report yet: no cache assumed, not even a write
    assert (unknown.state, unknown.cached_tokens, unknown.write_tokens) == (COLD, 0, 0)
    # Anthropic reports the write: that is proof of caching, and the written block is read next time
    warm.record(CLAUDE, "docs", [leg(CLAUDE.model, written=3990)], sent_stable=True)
    hit = warm.estimate(CLAUDE, "docs", 4000)
    assert (hit.state, hit.cached_tokens, hit.write_tokens) == (WARM, 3990, 0)
    cold = warm.estimate(CLAUDE, "other-docs", 4000)
    assert (cold.state, cold.cached_tokens, cold.write_tokens) == (COLD, 0, 4000)
    warm.record(OPENAI, "x", [leg(OPENAI.model, cached=2000)], sent_stable=True)
    assert warm.estimate(OPENAI, "other-docs", 4000).write_tokens == 0  # OpenAI caches prefixes by itself, no premium
    # a TTL of 0 never assumes a read, but the marked block is still written
    assert warm.estimate(CLAUDE.model_copy(update={"prompt_cache_ttl_s": 0}), "docs", 4000).write_tokens == 4000


def test_failed_legs_and_other_routes_send_nothing_but_any_routed_request_warms_always_long():
    clock = Clock()
    warm = WarmPrefixes(clock=clock)
    warm.record(CLAUDE, "a", [leg(CLAUDE.model, written=4000)], sent_stable=True)  # the upstream caches
    warm.record(CLAUDE, "b", [leg(CLAUDE.model, error="502 upstream_error")], sent_stable=True)
    warm.record(CLAUDE, "c", [leg("openai/cheap", route="rag")], sent_stable=False)
    assert warm.estimate(CLAUDE, "b", 4000).state == COLD
    assert warm.estimate(CLAUDE, "c", 4000).state == COLD
    # always-long would have sent "b" and "c" with their requests: their blocks are warm in that world
    for key in ("a", "b", "c"):
        estimate = warm.estimate(CLAUDE, key, 4000, always_long=True)
        assert (estimate.state, estimate.cached_tokens) == (WARM, 4000)
    assert warm.estimate(CLAUDE, "d", 4000, always_long=True).write_tokens == 4000
    clock.now += 301
    assert warm.estimate(CLAUDE, "c", 4000, always_long=True).state == COLD


def test_estimates_change_nothing_and_the_record_is_bounded():
    warm = WarmPrefixes(size=3, clock=Clock())
    warm.record(OPENAI, "k0", [leg(OPENAI.model, cached=2000)], sent_stable=True)
    for _ in range(3):
        assert warm.estimate(OPENAI, "never-sent", 4000).state == COLD
        assert warm.estimate(OPENAI, "never-sent", 4000, always_long=True).state == COLD
    assert len(warm) == 1
    for n in range(1, 4):
        warm.record(OPENAI, f"k{n}", [leg(OPENAI.model)], sent_stable=True)
    assert len(warm) == 3
    assert warm.estimate(OPENAI, "k0", 4000).state == COLD  # the least recently used block was forgotten
    assert warm.estimate(OPENAI, "k3", 4000).state == WARM


# -- the always-long counterfactual in the ledger ---------------------------------------------------------------
def warm_policy(base: str, window: int = 16000):
    return prompt_cache_policy(base, name="warm-test", cache_control=True, window=window, min_tokens=100)


@pytest.fixture(scope="module")
def embedder():
    return Embedder()


@pytest.fixture
def gateway(upstream, embedder, tmp_path):
    app = create_app(Settings(data_dir=tmp_path), policy=warm_policy(upstream[0]), embedder=embedder)
    clock = Clock()
    app.state.gateway.routing.warm = WarmPrefixes(clock=clock)
    with serve_app(app) as url:
        yield url, app, clock


def ask(url: str, question: str, docs: list[dict], route: str | None = None):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0).chat.completions.create(
        model="selfroute",
        messages=[{"role": "user", "content": question}],
        extra_body={"selfroute": {"documents": docs, **({"route": route} if route else {})}},
    )


def counterfactual(row: dict, question: str, cached: bool = False, written: bool = False) -> float:
    """Always-long's price: the documents' tokens (the block) at the cache read or write rate when the block is
    warm or written, the question at the input rate."""
    block = row["context_tokens"] - count_tokens(question)
    rate = 1.0 if cached else 12.5 if written else 10.0
    return (block * rate + (row["context_tokens"] - block) * 10.0 + row["completion_tokens"] * 20.0) / 1e6


def test_the_always_long_counterfactual_reads_the_cache_when_the_documents_were_asked_about_within_the_ttl(gateway):
    url, app, clock = gateway
    question = "Which way do the valves close?"
    ask(url, question, documents("harbour"), route="rag")  # no cache reported yet: the plain input price
    ask(url, "Do the pumps hum?", documents("harbour"), route="long")  # the upstream reports a cache write
    ask(url, question, documents("harbour"), route="rag")  # always-long sent these documents a moment ago
    ask(url, question, documents("quarry"), route="rag")  # never seen: always-long would have written them
    ask(url, question, documents("quarry"), route="rag")  # seen by the rag request before: any route counts
    clock.now += 301
    ask(url, question, documents("quarry"), route="rag")  # the TTL has passed
    first, long, warm, written, warm_again, expired = ledger_rows(app)
    assert [r["route"] for r in (first, long, warm, written, warm_again, expired)] == ["rag", "long"] + ["rag"] * 4
    assert first["counterfactual_cost_usd"] == pytest.approx(counterfactual(first, question))
    # the long leg itself stays the counterfactual of a long answer
    assert long["counterfactual_cost_usd"] == pytest.approx(long["cost_usd"])
    assert warm["counterfactual_cost_usd"] == pytest.approx(counterfactual(warm, question, cached=True))
    assert written["counterfactual_cost_usd"] == pytest.approx(counterfactual(written, question, written=True))
    assert warm_again["counterfactual_cost_usd"] == pytest.approx(counterfactual(warm_again, question, cached=True))
    assert expired["counterfactual_cost_usd"] == pytest.approx(counterfactual(expired, question, written=True))
    # "saved vs always-long" shrinks by the cache: about a tenth of the documents' price is left to save on
    assert warm["counterfactual_cost_usd"] < 0.25 * first["counterfactual_cost_usd"]


def test_a_context_over_the_long_window_is_never_priced_as_cached(upstream, embedder, tmp_path):
    policy = warm_policy(upstream[0], window=2000)
    app = create_app(Settings(data_dir=tmp_path), policy=policy, embedder=embedder)
    large = [*documents("fjord"), {"id": "appendix", "text": "The fjord pumps are serviced. " * 300}]
    with serve_app(app) as url:
        ask(url, "Do the pumps hum?", documents("harbour"), route="long")
        # it fitted, so its block was marked, and the upstream reported caching it
        assert upstream[1].state.received[-1]["body"]["messages"][-1]["content"][0]["cache_control"]
        ask(url, "Do the pumps hum?", large, route="rag")
        ask(url, "Do the pumps hum?", large, route="rag")
        rows = ledger_rows(app)
    assert rows[0]["route"] == "long"
    capacity = 2000 - 512
    for row in rows[1:]:
        # always-long could send only part of the documents, chosen per question: the input price throughout
        assert row["context_tokens"] == capacity
        assert row["counterfactual_cost_usd"] == pytest.approx(
            (capacity * 10.0 + row["completion_tokens"] * 20.0) / 1e6
        )
