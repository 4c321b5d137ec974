"""Price pairs for replay costs: the policy's own prices, or a reference pair from litellm's cost map.

The reference pair is the models the L-Eval paired answers came from: gpt-3.5-turbo (the RAG
answers, 4k window) and gpt-3.5-turbo-16k (the long-context answers). litellm's bundled cost map is
read as a file (LITELLM_LOCAL_MODEL_COST_MAP semantics: no network, no litellm import).
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from gateway.evaluation.replay import Prices
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
        per_mtok(cheap, "input_cost_per_token"), per_mtok(cheap, "output_cost_per_token"),
        per_mtok(long, "input_cost_per_token"), per_mtok(long, "output_cost_per_token"),
        source=f"reference: litellm cost map, cheap={cheap}, long={long}",
    )


def policy_prices(policy: Policy) -> Prices | None:
    """The policy's prices, or None when they are missing or all zero (local models)."""
    values = [policy.cheap.input_cost_per_mtok, policy.cheap.output_cost_per_mtok,
              policy.long.input_cost_per_mtok, policy.long.output_cost_per_mtok]
    if any(v is None for v in values) or not any(values):
        return None
    return Prices(*[float(v) for v in values],
                  source=f"policy {policy.name}: cheap={policy.cheap.model}, long={policy.long.model}")


def resolve_prices(policy: Policy, mode: str = "auto") -> Prices:
    """mode: 'policy', 'reference', or 'auto' (the policy's when it has non-zero prices)."""
    if mode == "reference":
        return reference_prices()
    prices = policy_prices(policy)
    if prices is not None:
        return prices
    if mode == "policy":
        raise ValueError(f"policy {policy.name!r} has no non-zero prices; use --prices reference")
    return reference_prices()
