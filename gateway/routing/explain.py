"""The routing decision for a chat body, with token and cost estimates per route, and no LLM call.

Estimates come from cached unit and token counts, not from prompts built and thrown away: a prompt is
exact when its whole context fits, else the route's budget (what packing fills up to). The long route's cost
counts the provider's prompt cache as this process last saw it (gateway.routing.warm_cache); explaining never
warms anything."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from gateway.ledger.entry import RequestLedgerEntry
from gateway.ledger.pricing import PriceBook
from gateway.protocol import ChatCompletionRequest
from gateway.routing.embedding_model import record_embedded
from gateway.routing.warm_cache import WarmPrefixes
from pipelines.scope import SHARED, KeyScope
from policies.routes import Route
from policies.schema import Policy

if TYPE_CHECKING:
    from gateway.routing.planner import RoutePlan, RoutePlanner

DEFAULT_COMPLETION_ESTIMATE = 256


def _estimate(
    policy: Policy,
    prices: PriceBook,
    planner: RoutePlanner,
    plan: RoutePlan,
    route: str,
    completion_tokens: int,
    warm: WarmPrefixes,
) -> dict[str, Any]:
    if route == Route.LONG:
        prompt_tokens, exact, prefix = planner.estimate_long(plan)
    else:
        (prompt_tokens, exact), prefix = planner.estimate_tokens(plan, route), None
    config = policy.long if route == Route.LONG else policy.cheap
    price = prices.price(config)
    estimate = {
        "model": config.model,
        "prompt_tokens": prompt_tokens,
        "prompt_tokens_exact": exact,
        "completion_tokens_estimate": completion_tokens,
        "cost_usd": price.cost(prompt_tokens, completion_tokens),
        "price_source": price.source,
    }
    if route == Route.LONG:
        # the key is hashed only for a block that can be cached at all
        cache = warm.estimate(config, plan.block_key if prefix is not None else None, prefix)
        estimate.update(
            {
                "cost_usd": price.cost(prompt_tokens, completion_tokens, cache.cached_tokens, cache.write_tokens),
                "cost_usd_uncached": estimate["cost_usd"],
                "cache": cache.state,
                "cache_reason": cache.reason,
                "cached_tokens_estimate": cache.cached_tokens,
                "cache_write_tokens_estimate": cache.write_tokens,
            }
        )
    return estimate


def explain_plan(
    policy: Policy,
    prices: PriceBook,
    planner: RoutePlanner,
    chat: ChatCompletionRequest,
    messages: list[dict],
    header_collection: str | None,
    warm: WarmPrefixes | None = None,
    scope: KeyScope = SHARED,
    entry: RequestLedgerEntry | None = None,
) -> dict[str, Any]:
    """`warm`: the serving process's record of warm prompt prefixes; None (the CLI): nothing is known warm.
    `scope`: the caller's key scope (pipelines.scope). `entry`: the request's ledger entry, which records what
    planning embedded (None: the CLI)."""
    started = time.perf_counter()
    plan = planner.plan(chat, messages, header_collection, scope)
    record_embedded(entry, policy, plan.embedded_tokens, (time.perf_counter() - started) * 1000.0)
    completion = chat.max_completion_tokens or chat.max_tokens or DEFAULT_COMPLETION_ESTIMATE
    decision = plan.decision
    warm = warm if warm is not None else WarmPrefixes()
    estimates = {route.value: _estimate(policy, prices, planner, plan, route, completion, warm) for route in Route}
    classifier = policy.routing.classifier
    return {
        "object": "route.explanation",
        "route": decision.route,
        "reason": decision.reason,
        "rule": decision.rule,
        "probability": decision.probability,
        "threshold": classifier.threshold if classifier else None,
        "source": plan.source,
        "question": plan.context.question,
        "context_tokens": plan.context_tokens,
        "features": {k: (None if v != v else v) for k, v in decision.features.items()},  # NaN is not JSON
        "estimates": estimates,
        "fallback": policy.routing.fallback.model_dump(mode="json"),
    }
