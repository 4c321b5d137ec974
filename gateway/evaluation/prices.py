"""Price pairs for replay costs: the policy's own prices, or a reference pair from litellm's cost map.

The reference pair is the models the L-Eval paired answers came from: gpt-3.5-turbo (the RAG
answers, 4k window) and gpt-3.5-turbo-16k (the long-context answers). litellm's bundled cost map is
read as a file (LITELLM_LOCAL_MODEL_COST_MAP semantics: no network, no litellm import).

The policy's prices are the ledger's (gateway.ledger.pricing): a model's prices from the policy, else from
litellm's cost map, so a replay costs what the gateway would bill. With provider prompt caching asked for,
the long model's cache rates come from the same place (the policy's cached_input / cache_write prices, else
the cost map's); a write premium applies only when the gateway marks the block (prompt_cache.needs_cache_control:
Claude models, or `cache_control: true`). The reference long model, gpt-3.5-turbo-16k, predates prompt
caching and has no cache rates: give them explicitly.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

from gateway.evaluation.replay import LongCache, Prices
from policies.schema import Policy

REFERENCE_CHEAP = "gpt-3.5-turbo"
REFERENCE_LONG = "gpt-3.5-turbo-16k"
COST_MAP_FILE = "model_prices_and_context_window_backup.json"


def litellm_cost_map() -> dict:
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("litellm is not installed: no bundled cost map to read reference prices from")
    path = Path(list(spec.submodule_search_locations)[0]) / COST_MAP_FILE
    return json.loads(path.read_text(encoding="utf-8"))


def reference_prices(cheap: str = REFERENCE_CHEAP, long: str = REFERENCE_LONG) -> Prices:
    costs = litellm_cost_map()
    missing = [m for m in (cheap, long) if m not in costs]
    if missing:
        raise KeyError(f"litellm's cost map has no entry for {missing}")

    def per_mtok(model: str, key: str) -> float:
        return float(costs[model][key]) * 1e6

    return Prices(
        per_mtok(cheap, "input_cost_per_token"),
        per_mtok(cheap, "output_cost_per_token"),
        per_mtok(long, "input_cost_per_token"),
        per_mtok(long, "output_cost_per_token"),
        source=f"reference: litellm cost map, cheap={cheap}, long={long}",
    )


def _ledger_prices(policy: Policy):
    """The cheap and long models' ledger prices (gateway.ledger.pricing.Price)."""
    from gateway.ledger.pricing import PriceBook

    book = PriceBook(litellm_cost_map())
    return book.price(policy.cheap), book.price(policy.long)


def policy_prices(policy: Policy) -> Prices | None:
    """The policy's models priced as the ledger prices them (the policy's prices, else litellm's cost map), or None
    when a model has no price or all are zero (local models)."""
    cheap, long = _ledger_prices(policy)
    values = [cheap.input_per_token, cheap.output_per_token, long.input_per_token, long.output_per_token]
    if not (cheap.known and long.known) or not any(values):
        return None
    cheap_in, cheap_out, long_in, long_out = (v * 1e6 for v in values)
    return Prices(
        cheap_in,
        cheap_out,
        long_in,
        long_out,
        source=f"policy {policy.name}: cheap={policy.cheap.model} ({cheap.source}), "
        f"long={policy.long.model} ({long.source})",
    )


def policy_long_cache(policy: Policy) -> LongCache:
    """The policy's long model's cache rates, as the gateway's ledger would price its cache reads and writes."""
    from gateway.routing.prompt_cache import needs_cache_control

    _, long = _ledger_prices(policy)
    if long.cache_read_per_token is None:
        raise ValueError(
            f"no prompt-cache read price for the long model {policy.long.model} (neither "
            "long.cached_input_cost_per_mtok in the policy nor litellm's cost map): give "
            "--long-cache-prices READ[,WRITE]"
        )
    marked = needs_cache_control(policy.long)
    write = long.cache_write_per_token * 1e6 if marked and long.cache_write_per_token is not None else None
    how = "cache_control on the document block" if marked else "automatic prefix caching"
    return LongCache(long.cache_read_per_token * 1e6, write, source=f"{policy.long.model} ({long.source}): {how}")


def resolve_prices(
    policy: Policy,
    mode: str = "auto",
    *,
    prompt_cache: bool = False,
    long_cache_prices: tuple[float, float | None] | None = None,
    cache_window: int | None = None,
) -> Prices:
    """mode: 'policy', 'reference', or 'auto' (the policy's when it has non-zero prices).
    prompt_cache: price long legs with the long model's provider cache (replay.LongCache), its rates from the
    policy's long model; long_cache_prices (READ, WRITE or None), USD per million tokens, give them instead;
    cache_window: questions a document's cache stays warm after its last long leg (None: the whole replay)."""
    prices = None if mode == "reference" else policy_prices(policy)
    if prices is None and mode == "policy":
        raise ValueError(f"policy {policy.name!r} has no non-zero prices; use --prices reference")
    reference = prices is None
    prices = prices or reference_prices()
    if long_cache_prices is None and not prompt_cache:
        if cache_window is not None:
            raise ValueError("--cache-window needs --prompt-cache on or --long-cache-prices")
        return prices
    if long_cache_prices is not None:
        read, write = long_cache_prices
        cache = LongCache(
            read,
            write,
            source="given" + (" (write premium: explicit caching)" if write is not None else " (automatic caching)"),
        )
    elif reference:
        raise ValueError(
            f"litellm's cost map has no prompt-cache prices for {REFERENCE_LONG}, the reference long "
            "model (it predates prompt caching): give --long-cache-prices READ[,WRITE], or replay a "
            "policy whose long model has cache prices"
        )
    else:
        cache = policy_long_cache(policy)
    return replace(
        prices, long_cache=replace(cache, window=cache_window, min_prefix_tokens=policy.long.prompt_cache_min_tokens)
    )
