"""Choosing the relative rule's parameters (routing.verifier.relative) from paired answers, under a held-out protocol.

Each unit (a corpus, a model family, a task: one deployment, one key) is replayed in `stream_order` through the live
`CheapAnswerCheck.verdict`, so what is chosen is exactly the rule the gateway applies; the fixed thresholds of the
policy decide each stream's warm-up. A candidate is scored per unit on the issue's two targets (issue 19), met only
when met in every stream order:
- within 1 point of the better of always-long and always-cheap at <= `max_token_share` of always-long's tokens;
- more quality than Self-Route (every literal refusal escalated) at no more tokens.
The choice over a set of units: the most units meeting both, then the most beating Self-Route, the most within 1
point, the best worst-unit gap to the better baseline, the best mean gap, fewer tokens. `held_out` nests it: for each unit, the choice made on the other units
only, and its figures on that unit.

Used by `selfroute train --verifier`, `selfroute calibrate` and the benchmarks (offline only: nothing in the serving
path imports it). The learning loop's refit of the same parameters is gateway.evaluation.relative_refit.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gateway.routing.decision import RouteDecision
from gateway.routing.escalation import CheapAnswerCheck
from policies.routes import Route
from policies.schema import Policy, RelativeThreshold

WITHIN_POINTS = 1.0  # the target: within this many points of the better baseline
MAX_TOKEN_SHARE = 0.3  # ... at no more than this share of always-long's tokens


class Grouped(Protocol):
    @property
    def group(self) -> str: ...


def stream_order(items: Sequence[Grouped], seed: int) -> list[int]:
    """Documents in a seeded random order; each document's questions together, in a seeded order too."""
    rng = random.Random(seed)
    by_group: dict[str, list[int]] = {}
    for index, item in enumerate(items):
        by_group.setdefault(item.group, []).append(index)
    groups = sorted(by_group)
    rng.shuffle(groups)
    order = []
    for group in groups:
        members = by_group[group][:]
        rng.shuffle(members)
        order.extend(members)
    return order


@dataclass(frozen=True)
class PairedAnswer:
    """One checked cheap answer with both routes' recorded quality and prompt tokens."""

    group: str  # its documents (a stream keeps a document's questions together)
    score: float  # the verifier's P(good) of the cheap answer (out of fold for an honest choice)
    refused: bool  # the cheap answer said the passages lack the answer
    cheap_quality: float
    long_quality: float
    cheap_tokens: float
    long_tokens: float
    probability: float | None = None  # the pre-route P(cheap)


@dataclass(frozen=True)
class UnitFigures:
    """One candidate on one unit, over the stream orders (min..max)."""

    n: int
    gap_points: tuple[float, float]  # quality - the better of always-long and always-cheap, points
    tokens: tuple[float, float]  # share of always-long's prompt tokens
    escalated: tuple[float, float]  # share of answers escalated
    self_route_points: tuple[float, float]  # quality - Self-Route's, points
    self_route_tokens: float  # Self-Route's share of always-long's tokens
    within: bool  # within WITHIN_POINTS at <= the token cap in every order
    beats_self_route: bool  # more quality at no more tokens than Self-Route in every order

    @property
    def both(self) -> bool:
        return self.within and self.beats_self_route

    def to_dict(self) -> dict:
        return {
            "n": self.n,
            "vs_better_baseline_points": list(self.gap_points),
            "tokens_vs_long": list(self.tokens),
            "escalated": list(self.escalated),
            "vs_self_route_points": list(self.self_route_points),
            "self_route_tokens_vs_long": self.self_route_tokens,
            "within_1_point": self.within,
            "beats_self_route": self.beats_self_route,
        }


def with_relative(policy: Policy, settings: RelativeThreshold | None) -> Policy:
    """The policy with these relative settings (None: the fixed thresholds alone)."""
    copy = policy.model_copy(deep=True)
    if copy.routing.verifier is None:
        raise ValueError("the policy has no verifier: the relative rule needs one")
    copy.routing.verifier.relative = settings
    return copy


def replay_unit(
    policy: Policy,
    answers: Sequence[PairedAnswer],
    seeds: Iterable[int],
    max_token_share: float = MAX_TOKEN_SHARE,
) -> UnitFigures:
    """The policy's check over one unit's answers, one fresh check (one key) per stream order."""
    n = len(answers)
    long_total = sum(a.long_tokens for a in answers) or 1.0
    cheap_q = sum(a.cheap_quality for a in answers) / n
    best = max(cheap_q, sum(a.long_quality for a in answers) / n)
    sr_q = sum(a.long_quality if a.refused else a.cheap_quality for a in answers) / n
    sr_t = sum(a.cheap_tokens + a.refused * a.long_tokens for a in answers) / long_total
    runs = []
    for seed in seeds:
        check = CheapAnswerCheck(policy)
        quality = tokens = escalated = 0.0
        for index in stream_order(answers, seed):
            a = answers[index]
            decision = RouteDecision(Route.RAG, "replay", probability=a.probability)
            verdict = check.verdict(decision, a.refused, a.score, None, a.long_tokens)
            quality += a.long_quality if verdict.escalate else a.cheap_quality
            tokens += a.cheap_tokens + verdict.escalate * a.long_tokens
            escalated += verdict.escalate
        runs.append((quality / n, tokens / long_total, escalated / n))
    gaps = [100 * (q - best) for q, _, _ in runs]
    vs_sr = [100 * (q - sr_q) for q, _, _ in runs]

    def span(values: list[float]) -> tuple[float, float]:
        return (min(values), max(values))

    return UnitFigures(
        n,
        span(gaps),
        span([t for _, t, _ in runs]),
        span([e for _, _, e in runs]),
        span(vs_sr),
        sr_t,
        all(g >= -WITHIN_POINTS - 1e-9 and t <= max_token_share + 1e-12 for g, (_, t, _) in zip(gaps, runs)),
        all(q > sr_q and t <= sr_t + 1e-12 for q, t, _ in runs),
    )


def criterion(figures: Iterable[UnitFigures]) -> tuple[int, int, int, float, float, float]:
    """Larger is better: units meeting both targets, then units beating Self-Route (kept on every unit so far: a
    choice made on units that meet neither must not buy their gap with Self-Route's target), units within 1 point,
    the worst unit's gap, the mean gap, fewer tokens (the most any unit spends)."""
    found = list(figures)
    if not found:
        raise ValueError("no unit to choose on")
    worst = [f.gap_points[0] for f in found]
    return (
        sum(f.both for f in found),
        sum(f.beats_self_route for f in found),
        sum(f.within for f in found),
        min(worst),
        sum(worst) / len(worst),
        -max(f.tokens[1] for f in found),
    )


@dataclass
class RelativeChoice:
    """The candidate chosen on `units`, and every candidate's figures on every unit."""

    settings: RelativeThreshold | None  # None: the fixed thresholds beat every relative candidate
    units: list[str]
    per_unit: dict[str, UnitFigures]  # the chosen candidate on each unit it was chosen on
    table: dict[int, dict[str, UnitFigures]] = field(repr=False)  # candidate index -> unit -> figures
    candidates: list[RelativeThreshold | None] = field(repr=False)


def evaluate_candidates(
    policy: Policy,
    units: Mapping[str, Sequence[PairedAnswer]],
    candidates: Sequence[RelativeThreshold | None],
    seeds: Sequence[int] = (0, 1, 2),
    max_token_share: float = MAX_TOKEN_SHARE,
) -> dict[int, dict[str, UnitFigures]]:
    """Every candidate (its index) on every unit."""
    return {
        c: {
            unit: replay_unit(with_relative(policy, candidate), answers, seeds, max_token_share)
            for unit, answers in units.items()
        }
        for c, candidate in enumerate(candidates)
    }


def pick(table: Mapping[int, Mapping[str, UnitFigures]], units: Sequence[str]) -> int:
    """The candidate index that does best on `units` by `criterion` (ties: the first)."""
    return max(table, key=lambda c: (criterion(table[c][u] for u in units), -c))


def choose_relative(
    policy: Policy,
    units: Mapping[str, Sequence[PairedAnswer]],
    candidates: Sequence[RelativeThreshold | None] | None = None,
    seeds: Sequence[int] = (0, 1, 2),
    max_token_share: float = MAX_TOKEN_SHARE,
    table: dict[int, dict[str, UnitFigures]] | None = None,
) -> RelativeChoice:
    """The relative settings (or none) that do best over all `units` by `criterion`, each unit replayed through
    the live check in `seeds` stream orders. `candidates`: default `candidate_grid(policy)`."""
    candidates = list(candidates) if candidates is not None else candidate_grid(policy)
    table = table if table is not None else evaluate_candidates(policy, units, candidates, seeds, max_token_share)
    names = sorted(units)
    chosen = pick(table, names)
    return RelativeChoice(candidates[chosen], names, dict(table[chosen]), table, candidates)


@dataclass(frozen=True)
class HeldOut:
    """The nested choice for one held-out unit: chosen on the other units, scored on this one."""

    unit: str
    settings: RelativeThreshold | None
    figures: UnitFigures
    chosen_on: tuple[str, ...]


def held_out(choice: RelativeChoice, training: Mapping[str, Sequence[str]] | None = None) -> list[HeldOut]:
    """For each unit of the choice: the candidate the same criterion picks on the other units only (their figures
    are already in the choice's table), and that candidate's figures on the held-out unit. `training`: per held-out
    unit, the units it may be chosen on instead (e.g. every unit sharing no answer with it, across protocols)."""
    found = []
    for unit in choice.units:
        others = (
            [u for u in choice.units if u != unit]
            if training is None
            else [u for u in training.get(unit, ()) if u != unit and u in choice.table[0]]
        )
        if not others:
            continue
        c = pick(choice.table, others)
        found.append(HeldOut(unit, choice.candidates[c], choice.table[c][unit], tuple(others)))
    return found


def candidate_grid(policy: Policy) -> list[RelativeThreshold | None]:
    """The settings a choice tries: the fixed thresholds alone (None), the policy's own relative settings, round
    six's grid of the refusal-spend rule, and the variants (a budget on always-long's tokens, a minimum share,
    joint ranking with P(cheap), escalations ranked per long token)."""
    verifier = policy.routing.verifier
    own = verifier.relative if verifier is not None else None
    base = {"window": own.window if own else 1000, "warm_up": own.warm_up if own else 50}
    grid: list[RelativeThreshold | None] = [None]
    if own is not None:
        grid.append(own.model_copy(update={"source": None}))
    for spend in (0.8, 0.9, 1.0):
        for pool in (1.0, 1.5, 2.0):
            grid.append(RelativeThreshold(**base, refusal_spend=spend, pool=pool))
    for long_share in (0.03, 0.05, 0.1):
        for pool in (1.5, 3.0):
            grid.append(RelativeThreshold(**base, long_share=long_share, pool=pool, min_share=0.02))
    for min_share in (0.02, 0.05):
        grid.append(RelativeThreshold(**base, pool=1.5, min_share=min_share))
    for weight in (0.25, 0.5):
        grid.append(RelativeThreshold(**base, pool=1.5, cheap_weight=weight))
    grid.append(RelativeThreshold(**base, pool=1.5, per_token=True))
    grid.append(RelativeThreshold(**base, pool=3.0, per_token=True))
    unique: list[RelativeThreshold | None] = []
    for g in grid:
        if g not in unique:
            unique.append(g)
    return unique


def describe(settings: RelativeThreshold | None) -> str:
    """A candidate in one line."""
    if settings is None:
        return "fixed thresholds"
    budget = (
        f"long_share {settings.long_share:g}"
        if settings.long_share is not None
        else f"refusal_spend {settings.refusal_spend:g}"
    )
    extra = "".join(
        [
            f", min_share {settings.min_share:g}" if settings.min_share else "",
            f", cheap_weight {settings.cheap_weight:g}" if settings.cheap_weight else "",
            ", per_token" if settings.per_token else "",
        ]
    )
    return f"{budget}, pool {settings.pool:g}{extra}, window {settings.window}, warm_up {settings.warm_up}"
