"""Prices: cached prompt tokens at the provider's cache rates (litellm's cost map or the policy's)."""
from __future__ import annotations

import pytest

from gateway.ledger.entry import cache_tokens
from gateway.ledger.pricing import Price, PriceBook
from policies.schema import ModelConfig


def test_cached_and_cache_written_tokens_are_priced_at_their_rates():
    price = Price(3e-6, 15e-6, "litellm", cache_read_per_token=0.3e-6, cache_write_per_token=3.75e-6)
    # 10,000 prompt tokens of which 8,000 read from the cache and 1,000 written to it; 100 completion tokens
    assert price.cost(10_000, 100, 8_000, 1_000) == pytest.approx(1_000 * 3e-6 + 8_000 * 0.3e-6 + 1_000 * 3.75e-6
                                                                  + 100 * 15e-6)
    assert price.cost(10_000, 100) == pytest.approx(10_000 * 3e-6 + 100 * 15e-6)
    no_rates = Price(1e-6, 2e-6, "policy")  # no cache prices known: cached tokens cost what input costs
    assert no_rates.cost(100, 10, 80) == no_rates.cost(100, 10)
    assert price.cost(100, 0, 500) == pytest.approx(100 * 0.3e-6)  # never more cached than prompt tokens


def test_litellm_cost_map_supplies_cache_rates():
    book = PriceBook({"claude-sonnet-4-5": {"input_cost_per_token": 3e-6, "output_cost_per_token": 15e-6,
                                            "cache_read_input_token_cost": 3e-7,
                                            "cache_creation_input_token_cost": 3.75e-6},
                      "gpt-4.1": {"input_cost_per_token": 2e-6, "output_cost_per_token": 8e-6,
                                  "cache_read_input_token_cost": 5e-7}})
    claude = book.price(ModelConfig(model="anthropic/claude-sonnet-4-5"))
    assert (claude.cache_read_per_token, claude.cache_write_per_token) == (3e-7, 3.75e-6)
    gpt = book.price(ModelConfig(model="openai/gpt-4.1"))
    assert gpt.cache_read_per_token == 5e-7 and gpt.cache_write_per_token is None


def test_policy_prices_cached_tokens_when_it_names_a_rate():
    config = ModelConfig(model="openai/x", input_cost_per_mtok=10, output_cost_per_mtok=20,
                         cached_input_cost_per_mtok=2.5, cache_write_cost_per_mtok=12.5)
    price = PriceBook({}).price(config)
    assert price.cost(1_000_000, 0, 1_000_000) == pytest.approx(2.5)
    assert price.cost(1_000_000, 0, 0, 1_000_000) == pytest.approx(12.5)


@pytest.mark.parametrize("usage, expected", [
    (None, (0, 0)),
    ({"prompt_tokens": 50}, (0, 0)),
    ({"prompt_tokens": 5000, "prompt_tokens_details": {"cached_tokens": 4096}}, (4096, 0)),  # OpenAI
    ({"prompt_tokens": 5000, "cache_read_input_tokens": 4000, "cache_creation_input_tokens": 0,  # litellm/Anthropic
      "prompt_tokens_details": {"cached_tokens": 4000}}, (4000, 0)),
    ({"prompt_tokens": 5000, "cache_creation_input_tokens": 4500}, (0, 4500)),
    ({"prompt_tokens": 5000, "prompt_tokens_details": None}, (0, 0)),
])
def test_cache_tokens_read_every_provider_spelling(usage, expected):
    assert cache_tokens(usage) == expected
