import pytest

from gateway.evaluation.prices import REFERENCE_LONG, policy_prices, resolve_prices
from gateway.evaluation.replay import LongCache
from policies.loader import load_policy
from policies.schema import Policy


def hosted(cheap: dict, long: dict) -> Policy:
    return Policy.model_validate({"name": "hosted", "cheap": cheap, "long": long})


def test_a_policy_without_prices_is_priced_from_litellms_cost_map_as_the_ledger_prices_it():
    prices = policy_prices(hosted({"model": "openai/gpt-4.1-mini"}, {"model": "anthropic/claude-sonnet-4-5"}))
    assert (prices.cheap_input, prices.cheap_output) == pytest.approx((0.4, 1.6))
    assert (prices.long_input, prices.long_output) == pytest.approx((3.0, 15.0))
    assert "litellm" in prices.source and prices.long_cache is None
    # the shipped policy's local models have no price: auto falls back to the reference pair
    default, _ = load_policy()
    assert policy_prices(default) is None
    assert REFERENCE_LONG in resolve_prices(default).source


def test_the_long_models_cache_rates_and_whether_it_charges_for_writes():
    claude = resolve_prices(
        hosted({"model": "openai/gpt-4.1-mini"}, {"model": "anthropic/claude-sonnet-4-5"}), prompt_cache=True
    )
    assert claude.long_cache.read == pytest.approx(0.3) and claude.long_cache.write == pytest.approx(3.75)
    assert "cache_control" in claude.long_cache.source and claude.long_cache.window is None
    gpt = resolve_prices(
        hosted({"model": "openai/gpt-4.1-mini"}, {"model": "openai/gpt-4.1"}), prompt_cache=True, cache_window=10
    )
    assert gpt.long_cache == LongCache(pytest.approx(0.5), None, 10, 1024, source=gpt.long_cache.source)
    assert "automatic" in gpt.long_cache.source
    # the policy's own prices win, cache rates included; a write rate counts only when the gateway marks the block
    own = hosted(
        {"model": "a/cheap", "input_cost_per_mtok": 1, "output_cost_per_mtok": 2},
        {
            "model": "openai/custom",
            "input_cost_per_mtok": 10,
            "output_cost_per_mtok": 20,
            "cached_input_cost_per_mtok": 2.5,
            "cache_write_cost_per_mtok": 12.5,
        },
    )
    assert resolve_prices(own, "policy", prompt_cache=True).long_cache.write is None
    marked = own.model_copy(deep=True)
    marked.long.cache_control = True
    cache = resolve_prices(marked, "policy", prompt_cache=True).long_cache
    assert (cache.read, cache.write) == (2.5, 12.5)


def test_cache_rates_that_are_unknown_must_be_given():
    with pytest.raises(ValueError, match=f"{REFERENCE_LONG}.*--long-cache-prices"):
        resolve_prices(load_policy()[0], "reference", prompt_cache=True)
    given = resolve_prices(load_policy()[0], "reference", long_cache_prices=(0.3, 3.75), cache_window=5)
    assert (given.long_input, given.long_cache.read, given.long_cache.write, given.long_cache.window) == (
        pytest.approx(3.0),
        0.3,
        3.75,
        5,
    )
    no_rate = hosted(
        {"model": "a/cheap", "input_cost_per_mtok": 1, "output_cost_per_mtok": 2},
        {"model": "a/long", "input_cost_per_mtok": 10, "output_cost_per_mtok": 20},
    )
    with pytest.raises(ValueError, match="cached_input_cost_per_mtok"):
        resolve_prices(no_rate, prompt_cache=True)
    with pytest.raises(ValueError, match="--cache-window"):
        resolve_prices(no_rate, cache_window=3)
    assert resolve_prices(no_rate).long_cache is None
    # the shortest block the provider caches is the long model's prompt_cache_min_tokens
    no_rate.long.prompt_cache_min_tokens = 4096
    assert resolve_prices(no_rate, long_cache_prices=(1.0, None)).long_cache.min_prefix_tokens == 4096
