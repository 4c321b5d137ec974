"""Prices: cached prompt tokens at the provider's cache rates (litellm's cost map or the policy's); a model with
no known price is warned about at start-up and marked unpriced in the ledger, the admin costs report, the
dashboard's summary and the metrics — never passed off as free."""

from __future__ import annotations

import logging

import httpx
import openai
import pytest

from gateway.ledger.entry import cache_tokens
from gateway.ledger.pricing import Price, PriceBook
from gateway.server.auth import Authenticator
from policies.schema import ModelConfig
from tests.support.gateway import ledger_rows, running_gateway
from tests.support.policies import DROP, Whole, fake_route, make_policy

ADMIN = "sk-admin-pricing"


def test_prices_come_from_the_policy_then_litellm_else_unknown():
    book = PriceBook({"gpt-4o-mini": {"input_cost_per_token": 1.5e-7, "output_cost_per_token": 6e-7}})
    assert book.price(ModelConfig(model="openai/gpt-4o-mini")).source == "litellm"
    free = book.price(ModelConfig(model="local/x", input_cost_per_mtok=0.0, output_cost_per_mtok=0.0))
    assert free.known and free.cost(1000, 1000) == 0.0  # a declared $0 is a price
    assert not book.price(ModelConfig(model="openai/no-such-model-xyz")).known


def test_an_unpriced_model_is_warned_about_and_marked_everywhere(upstream, tmp_path, caplog):
    base, _ = upstream
    auth = Authenticator(admin_key=ADMIN)
    with (
        caplog.at_level(logging.WARNING, logger="gateway.ledger.pricing"),
        running_gateway(
            tmp_path,
            make_policy(
                base,
                name="t",
                cheap=fake_route(base, "no-such-model-xyz"),
                long=fake_route(base, "fake-long", input_cost_per_mtok=0.0, output_cost_per_mtok=0.0),
                routing=Whole(classifier=None),
                passthrough=DROP,
            ),
            auth=auth,
            prices=PriceBook({"gpt-4o-mini": {"input_cost_per_token": 1e-7}}),
        ) as (url, app),
    ):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=ADMIN, max_retries=0)
        for model in ("openai/no-such-model-xyz", "openai/fake-long"):
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": "a b c"}])
        calls = {c["model"]: c["unpriced"] for c in ledger_rows(app, "upstream_calls")}
        assert calls == {"openai/no-such-model-xyz": 1, "openai/fake-long": 0}
        headers = {"authorization": f"Bearer {ADMIN}"}
        costs = httpx.get(f"{url}/v1/admin/costs", params={"by": "model"}, headers=headers).json()
        assert {g["group"]: g["unpriced"] for g in costs["groups"]} == {
            "openai/no-such-model-xyz": True,
            "openai/fake-long": False,
        }
        assert costs["unpriced_models"] == [
            {"model": "openai/no-such-model-xyz", "calls": 1, "prompt_tokens": 3, "completion_tokens": 4}
        ]
        summary = httpx.get(f"{url}/v1/admin/summary", params={"window": "1h"}, headers=headers).json()
        assert [u["model"] for u in summary["unpriced_models"]] == ["openai/no-such-model-xyz"]
        assert {m["group"]: m["unpriced"] for m in summary["models"]}["openai/no-such-model-xyz"] is True
        metrics = httpx.get(f"{url}/metrics").text
        assert 'selfroute_unpriced_calls_total{model="openai/no-such-model-xyz"} 1.0' in metrics
        assert "fake-long" not in "".join(l for l in metrics.splitlines() if l.startswith("selfroute_unpriced"))
    warnings = [r.getMessage() for r in caplog.records if "no price" in r.getMessage()]
    assert len(warnings) == 1 and "openai/no-such-model-xyz" in warnings[0]


def test_cached_and_cache_written_tokens_are_priced_at_their_rates():
    price = Price(3e-6, 15e-6, "litellm", cache_read_per_token=0.3e-6, cache_write_per_token=3.75e-6)
    # 10,000 prompt tokens of which 8,000 read from the cache and 1,000 written to it; 100 completion tokens
    assert price.cost(10_000, 100, 8_000, 1_000) == pytest.approx(
        1_000 * 3e-6 + 8_000 * 0.3e-6 + 1_000 * 3.75e-6 + 100 * 15e-6
    )
    assert price.cost(10_000, 100) == pytest.approx(10_000 * 3e-6 + 100 * 15e-6)
    no_rates = Price(1e-6, 2e-6, "policy")  # no cache prices known: cached tokens cost what input costs
    assert no_rates.cost(100, 10, 80) == no_rates.cost(100, 10)
    assert price.cost(100, 0, 500) == pytest.approx(100 * 0.3e-6)  # never more cached than prompt tokens


def test_litellm_cost_map_supplies_cache_rates():
    book = PriceBook(
        {
            "claude-sonnet-4-5": {
                "input_cost_per_token": 3e-6,
                "output_cost_per_token": 15e-6,
                "cache_read_input_token_cost": 3e-7,
                "cache_creation_input_token_cost": 3.75e-6,
            },
            "gpt-4.1": {
                "input_cost_per_token": 2e-6,
                "output_cost_per_token": 8e-6,
                "cache_read_input_token_cost": 5e-7,
            },
        }
    )
    claude = book.price(ModelConfig(model="anthropic/claude-sonnet-4-5"))
    assert (claude.cache_read_per_token, claude.cache_write_per_token) == (3e-7, 3.75e-6)
    gpt = book.price(ModelConfig(model="openai/gpt-4.1"))
    assert gpt.cache_read_per_token == 5e-7 and gpt.cache_write_per_token is None


def test_policy_prices_cached_tokens_when_it_names_a_rate():
    config = ModelConfig(
        model="openai/x",
        input_cost_per_mtok=10,
        output_cost_per_mtok=20,
        cached_input_cost_per_mtok=2.5,
        cache_write_cost_per_mtok=12.5,
    )
    price = PriceBook({}).price(config)
    assert price.cost(1_000_000, 0, 1_000_000) == pytest.approx(2.5)
    assert price.cost(1_000_000, 0, 0, 1_000_000) == pytest.approx(12.5)


@pytest.mark.parametrize(
    "usage, expected",
    [
        (None, (0, 0)),
        ({"prompt_tokens": 50}, (0, 0)),
        ({"prompt_tokens": 5000, "prompt_tokens_details": {"cached_tokens": 4096}}, (4096, 0)),  # OpenAI
        (
            {
                "prompt_tokens": 5000,
                "cache_read_input_tokens": 4000,
                "cache_creation_input_tokens": 0,  # litellm/Anthropic
                "prompt_tokens_details": {"cached_tokens": 4000},
            },
            (4000, 0),
        ),
        ({"prompt_tokens": 5000, "cache_creation_input_tokens": 4500}, (0, 4500)),
        ({"prompt_tokens": 5000, "prompt_tokens_details": None}, (0, 0)),
    ],
)
def test_cache_tokens_read_every_provider_spelling(usage, expected):
    assert cache_tokens(usage) == expected
