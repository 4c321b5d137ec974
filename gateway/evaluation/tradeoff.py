"""Cost-quality choices over replay items: the thresholds that meet a cost cap or a quality target.

Used by `selfroute train --verifier` (the verifier threshold written into its card), `selfroute calibrate`
(the pre-route and verifier thresholds together) and `selfroute eval replay --protocol` (thresholds
chosen on training folds). Each candidate setting is scored as the replay scores it
(gateway.evaluation.replay): the route per question comes from the policy's Router with the item's
out-of-fold P(cheap); a cheap (rag) answer whose verifier P(good) is below the verifier threshold is
escalated (gateway.routing.escalation's rule: both legs paid, the long answer's score); `direct` has no
recorded answer and is scored min(rag, long), at the cheap price of the whole context. With a prompt cache in
the prices, each setting's long legs are priced in sequence by the replay's rule (replay.warm_long_legs), its
always-long baseline too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.evaluation.relative_choice import choose_relative, describe, held_out
from gateway.evaluation.replay import (
    Leg,
    Prices,
    ReplayItem,
    leg_cost,
    long_leg_cost,
    paired_answers,
    warm_long_legs,
    with_threshold,
    without_verifier,
)
from gateway.routing.decision import Router
from policies.routes import DIRECT, LONG
from policies.schema import Policy


@dataclass
class Choice:
    """One setting and what the replay gives it."""

    pre_threshold: float | None  # classifier threshold (None: the policy has no classifier)
    verifier_threshold: float
    quality: float
    quality_vs_long_points: float
    cost_vs_long: float
    long_share: float  # routed long or escalated
    met: bool = True  # False: no setting met the target; this is the closest one
    points: list[dict] = field(default_factory=list)  # every setting tried (the cost-quality cloud)
    refusal_threshold: float | None = None  # a refusal escalates below this P(good) (None: the threshold alone)


class Table:
    """Per-item scores and leg costs, so thresholds can be swept without re-running the strategies."""

    def __init__(self, items: Sequence[ReplayItem], prices: Prices):
        import numpy as np

        self.items = list(items)
        self.cache = prices.long_cache
        self._always_long: dict[bytes, float] = {}
        self.rag = np.array([i.rag_score for i in items], float)
        self.lc = np.array([i.lc_score for i in items], float)
        self.rag_cost = np.array(
            [leg_cost(Leg("cheap", i.rag_prompt_tokens, i.rag_output_tokens), prices) for i in items]
        )
        long_legs = [Leg("long", i.long_prompt_tokens, i.long_output_tokens) for i in items]
        self.long_cost = np.array([long_leg_cost(i, leg, prices, False) for i, leg in zip(items, long_legs)])
        self.long_cost_warm = np.array([long_leg_cost(i, leg, prices, True) for i, leg in zip(items, long_legs)])
        self.direct_cost = np.array(
            [leg_cost(Leg("cheap", i.direct_prompt_tokens, i.rag_output_tokens), prices) for i in items]
        )
        # prompt tokens of each leg (the replay's token accounting: StrategyResult.prompt_tokens)
        self.rag_tokens = np.array([i.rag_prompt_tokens for i in items], float)
        self.long_tokens = np.array([i.long_prompt_tokens for i in items], float)
        self.direct_tokens = np.array([i.direct_prompt_tokens for i in items], float)
        scores = [i.verifier_score for i in items]
        self.scores = np.array([math.nan if s is None else s for s in scores], float)
        self.refused = np.array([i.rag_refused for i in items], bool)

    def routes(self, policy: Policy) -> list[str]:
        router = Router(without_verifier(policy))
        return [router.decide(i.features, probability=i.probability).route for i in self.items]

    def _long_costs(self, idx, sends_long):
        """The long leg's cost of each item of idx, warm or cold as the sequence of long legs leaves the cache."""
        import numpy as np

        if self.cache is None:
            return self.long_cost[idx]
        warm = np.array(warm_long_legs([self.items[i] for i in idx], sends_long, self.cache), bool)
        return np.where(warm, self.long_cost_warm[idx], self.long_cost[idx])

    def outcome(
        self, routes, verifier_threshold: float | None, idx=None, refusal_threshold: float | None = None
    ) -> dict[str, float]:
        """Quality and cost share (of always-long) over items idx, with escalation below verifier_threshold and
        of refusals below refusal_threshold (gateway.routing.escalation's rule; the keep-refusal option's
        evidence is not modelled here: it is off in the shipped policy)."""
        import numpy as np

        idx = np.arange(len(self.items)) if idx is None else np.asarray(idx)
        r = np.asarray(routes, dtype=object)[idx]
        long, direct = r == LONG, r == DIRECT
        rag = ~long & ~direct
        escalate = rag & (self.scores[idx] < verifier_threshold) if verifier_threshold is not None else rag & False
        if refusal_threshold is not None:
            escalate = escalate | (rag & self.refused[idx] & (self.scores[idx] < refusal_threshold))
        score = np.where(
            long | escalate, self.lc[idx], np.where(direct, np.minimum(self.rag[idx], self.lc[idx]), self.rag[idx])
        )
        long_leg = self._long_costs(idx, (long | escalate).tolist())
        cost = np.where(
            long, long_leg, np.where(direct, self.direct_cost[idx], self.rag_cost[idx] + escalate * long_leg)
        )
        tokens = np.where(
            long,
            self.long_tokens[idx],
            np.where(direct, self.direct_tokens[idx], self.rag_tokens[idx] + escalate * self.long_tokens[idx]),
        )
        long_tokens = float(self.long_tokens[idx].sum())
        long_q = float(self.lc[idx].mean())
        key = idx.tobytes()
        if key not in self._always_long:  # the baseline is the same for every setting
            self._always_long[key] = float(self._long_costs(idx, [True] * len(idx)).sum())
        long_c = self._always_long[key]
        return {
            "quality": float(score.mean()),
            "quality_vs_long_points": 100 * (float(score.mean()) - long_q),
            "cost_vs_long": float(cost.sum()) / long_c if long_c else math.nan,
            "tokens_vs_long": float(tokens.sum()) / long_tokens if long_tokens else math.nan,
            "long_share": float(np.mean(long | escalate)),
        }


def quantile_grid(values: Sequence[float | None], steps: int) -> list[float]:
    """Thresholds at the values' quantiles, plus both ends (0: never below; past the largest: always below)."""
    import numpy as np

    v = np.asarray([x for x in values if x is not None and not math.isnan(x)], float)
    if len(v) == 0:
        return [0.0]
    picks = set(np.quantile(v, np.linspace(0, 1, steps + 1)).tolist())
    return sorted(picks | {0.0, math.nextafter(float(v.max()), math.inf)})


def choose(
    items: Sequence[ReplayItem],
    policy: Policy,
    prices: Prices,
    *,
    max_cost_share: float | None = None,
    min_quality_delta: float | None = None,
    tune_pre_route: bool = True,
    steps: int = 40,
    idx=None,
) -> Choice:
    """The setting (classifier, verifier and refusal thresholds: refusal_grid) that meets the target on these items:
    - max_cost_share X: the best quality whose cost share of always-long is <= X (ties: the cheaper);
    - min_quality_delta D (points): the cheapest whose quality >= always-long + D.
    The classifier threshold is swept only when the policy has a classifier and tune_pre_route is set.
    When nothing meets the target, the closest setting comes back with met=False."""
    if (max_cost_share is None) == (min_quality_delta is None):
        raise ValueError("give exactly one of max_cost_share and min_quality_delta")
    table = Table(items, prices)
    chosen_items = table.items if idx is None else [table.items[i] for i in idx]
    classifier = policy.routing.classifier
    pre_grid: Sequence[float | None]
    if classifier is not None and tune_pre_route:
        pre_grid = quantile_grid([i.probability for i in chosen_items], min(steps, 30))
    else:
        pre_grid = [classifier.threshold if classifier is not None else None]
    verifier_grid = quantile_grid([i.verifier_score for i in chosen_items], steps)
    refusals = refusal_grid(table, policy)
    points: list[dict[str, Any]] = []
    for t1 in pre_grid:
        routes = table.routes(with_threshold(policy, t1) if t1 is not None else policy)
        for t2 in verifier_grid:
            for t3 in refusals:
                points.append(
                    {
                        "pre_threshold": t1,
                        "verifier_threshold": t2,
                        "refusal_threshold": t3,
                        **table.outcome(routes, t2, idx, t3),
                    }
                )
    if max_cost_share is not None:
        feasible = [p for p in points if p["cost_vs_long"] <= max_cost_share + 1e-12]
        pick = (
            max(feasible, key=lambda p: (p["quality"], -p["cost_vs_long"]))
            if feasible
            else min(points, key=lambda p: p["cost_vs_long"])
        )
    else:
        assert min_quality_delta is not None  # exactly one of the two is given (checked above)
        feasible = [p for p in points if p["quality_vs_long_points"] >= min_quality_delta - 1e-9]
        pick = (
            min(feasible, key=lambda p: (p["cost_vs_long"], -p["quality"]))
            if feasible
            else max(points, key=lambda p: p["quality"])
        )
    return Choice(
        pick["pre_threshold"],
        pick["verifier_threshold"],
        pick["quality"],
        pick["quality_vs_long_points"],
        pick["cost_vs_long"],
        pick["long_share"],
        bool(feasible),
        points,
        pick["refusal_threshold"],
    )


@dataclass
class UnitChoice:
    """A setting chosen so that it holds on every held-out unit (corpus, model family or task) at once."""

    pre_threshold: float | None
    verifier_threshold: float
    cap: float
    cap_on: str  # "tokens" or "cost": the share of always-long's that every unit must stay within
    worst_margin_points: float  # min over units of quality minus the better of always-long and always-RAG
    per_unit: dict[str, dict[str, float]]
    met: bool = True
    refusal_threshold: float | None = None  # a refusal escalates below this P(good) (None: the threshold alone)


def refusal_grid(table: Table, policy: Policy, steps: int = 8) -> Sequence[float | None]:
    """The refusal thresholds to try: the policy's rule off (None) stays off; otherwise quantiles of the refused
    answers' P(good) from the one that escalates the least-trusted 1/steps of refusals up to 1 (every refusal
    escalates, Self-Route's rule). Never 0: with the rule on, some refusals always escalate."""
    import numpy as np

    verifier = policy.routing.verifier
    if verifier is None or verifier.refusal_threshold is None:
        return [None]
    refused = np.array([s for s, r in zip(table.scores.tolist(), table.refused.tolist()) if r and not math.isnan(s)])
    picks = set(np.quantile(refused, np.linspace(0, 1, steps + 1)[1:]).tolist()) if len(refused) else set()
    return sorted({p for p in picks if p > 0.0} | {1.0})


def self_route_outcome(table: Table, idx) -> dict[str, float]:
    """Self-Route on items idx: every question RAG first, every literal refusal escalated."""
    import numpy as np

    idx = np.asarray(idx)
    escalate = table.refused[idx]
    long_tokens = float(table.long_tokens[idx].sum())
    tokens = table.rag_tokens[idx] + escalate * table.long_tokens[idx]
    return {
        "quality": float(np.where(escalate, table.lc[idx], table.rag[idx]).mean()),
        "tokens_vs_long": float(tokens.sum()) / long_tokens if long_tokens else math.nan,
    }


def choose_across_units(
    items: Sequence[ReplayItem],
    units: Sequence[str],
    policy: Policy,
    prices: Prices,
    *,
    max_share: float,
    on: str = "tokens",
    tune_pre_route: bool = True,
    steps: int = 40,
) -> UnitChoice:
    """The (classifier, verifier, refusal) thresholds whose replay keeps every unit's tokens (or cost) within
    `max_share` of its always-long and meets the most of the per-unit targets (within 1 point of the better of
    always-long and always-RAG; more quality than Self-Route at no more tokens), then with the best worst-unit
    margin over the better baseline (ties: the better mean margin). Scores are the items' out-of-fold ones, so each unit is scored by models that never saw
    it; the thresholds themselves are shared by all units, as one shipped policy is. When no setting keeps every
    unit within the cap, the one with the smallest worst-unit share comes back with met=False."""
    import numpy as np

    if on not in ("tokens", "cost"):
        raise ValueError("on must be 'tokens' or 'cost'")
    key = "tokens_vs_long" if on == "tokens" else "cost_vs_long"
    table = Table(items, prices)
    names = sorted(set(units))
    index = {u: np.flatnonzero(np.asarray(units) == u) for u in names}
    best_base = {u: 100 * max(float(table.lc[i].mean()), float(table.rag[i].mean())) for u, i in index.items()}
    classifier = policy.routing.classifier
    pre_grid = (
        quantile_grid([i.probability for i in table.items], min(steps, 30))
        if classifier is not None and tune_pre_route
        else [classifier.threshold if classifier else None]
    )
    verifier_grid = quantile_grid([i.verifier_score for i in table.items], steps)
    refusals = refusal_grid(table, policy)
    candidates = []
    for t1 in pre_grid:
        routes = table.routes(with_threshold(policy, t1) if t1 is not None else policy)
        for t2 in verifier_grid:
            for t3 in refusals:
                per = {u: table.outcome(routes, t2, i, t3) for u, i in index.items()}
                margins = [100 * per[u]["quality"] - best_base[u] for u in names]
                worst_share = max(per[u][key] for u in names)
                candidates.append((t1, t2, t3, per, min(margins), float(np.mean(margins)), worst_share))
    self_route = {u: self_route_outcome(table, i) for u, i in index.items()}

    def targets_met(per: dict[str, dict[str, float]]) -> int:
        """Units within 1 point of their better baseline, plus units beating Self-Route at no more tokens."""
        return sum(int(100 * per[u]["quality"] - best_base[u] >= -1.0) + beats(per[u], u) for u in names)

    def beats(o: dict[str, float], u: str) -> int:
        sr = self_route[u]
        return int(o["quality"] > sr["quality"] and o["tokens_vs_long"] <= sr["tokens_vs_long"] + 1e-12)

    feasible = [c for c in candidates if c[6] <= max_share + 1e-12]
    # the targets first (a unit no setting can lift must not cost every other unit its margin), then the
    # worst unit's margin over the better of always-long and always-RAG, then the mean margin, then fewer tokens
    pick = (
        max(feasible, key=lambda c: (targets_met(c[3]), c[4], c[5], -c[6]))
        if feasible
        else min(candidates, key=lambda c: c[6])
    )
    t1, t2, t3, per, worst, _, _ = pick
    for u in names:
        per[u]["vs_better_baseline_points"] = 100 * per[u]["quality"] - best_base[u]
        sr = self_route[u]
        per[u]["self_route_quality"], per[u]["self_route_tokens_vs_long"] = sr["quality"], sr["tokens_vs_long"]
        per[u]["beats_self_route"] = float(beats(per[u], u))  # the target: more quality at no more tokens
    return UnitChoice(t1, t2, max_share, on, worst, per, bool(feasible), t3)


def relative_choice_card(
    items: Sequence[ReplayItem],
    units: Sequence[str],
    policy: Policy,
    *,
    max_token_share: float,
    seeds: Sequence[int] = (0, 1, 2),
    command: str,
) -> dict[str, Any]:
    """The relative rule's parameters (routing.verifier.relative) chosen on every unit, and nested: for each unit
    the choice made on the other units only, scored on it (gateway.evaluation.relative_choice, the live check). Every
    item is a checked cheap answer (no pre-route) with its out-of-fold P(good); the policy's fixed thresholds
    decide each stream's warm-up. The card's part, for a model card and for a policy's `relative.source`."""
    names = sorted(set(units))
    per_unit = {u: paired_answers([i for i, x in zip(items, units) if x == u]) for u in names}
    choice = choose_relative(policy, per_unit, seeds=seeds, max_token_share=max_token_share)
    nested = held_out(choice)
    both = sum(h.figures.both for h in nested)
    worst = min((h.figures.gap_points[0] for h in nested), default=None)  # None: a single unit
    chosen = choice.settings
    figures = "; ".join(
        f"{u} {f.gap_points[0]:+.2f}..{f.gap_points[1]:+.2f} points vs the better baseline at "
        f"{f.tokens[1]:.3f} of always-long's tokens, Self-Route {'beaten' if f.beats_self_route else 'not beaten'}"
        for u, f in sorted(choice.per_unit.items())
    )
    source = (
        f"{command}: chosen through the live check on {len(names)} units ({', '.join(names)}), {len(seeds)} stream "
        f"orders each, of {len(choice.candidates)} candidates (gateway.evaluation.relative_choice.candidate_grid): "
        f"{figures}; "
        + (
            f"nested (each unit chosen on the others): both targets on {both} of {len(nested)}, worst gap {worst:+.2f}"
            if worst is not None
            else "one unit, nothing held out"
        )
    )
    return {
        "settings": None if chosen is None else chosen.model_dump(exclude={"source"}),
        "described": describe(chosen),
        "source": source,
        "max_token_share": max_token_share,
        "seeds": list(seeds),
        "candidates": len(choice.candidates),
        "per_unit": {u: f.to_dict() for u, f in sorted(choice.per_unit.items())},
        "held_out": {
            h.unit: {"settings": describe(h.settings), "chosen_on": list(h.chosen_on), **h.figures.to_dict()}
            for h in nested
        },
        "held_out_both_targets": both,
        "held_out_worst_gap_points": worst,
    }
