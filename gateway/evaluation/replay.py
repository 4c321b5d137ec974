"""Replay routing strategies over recorded answers of both routes: no model is called.

Every question carries the score of the cheap (RAG) answer and of the long-context answer. A
strategy picks a route per question and takes that route's recorded score; its tokens are our own
pipelines' prompt sizes on the real documents, its cost those tokens at a price pair.

Choices (documented in `selfroute eval replay --help` too):
- Fallback (Self-Route): RAG first; when the recorded RAG answer declares itself unanswerable
  (pipelines.unanswerable with the policy's patterns) the long route runs too. Both legs are paid.
- Verifier: RAG first; when the verifier's P(good) of the recorded RAG answer is below the threshold
  the long route runs too (both legs paid); a refusal it trusts stands. The decision is
  gateway.routing.escalation's, the one the live gateway applies; P(good) comes from the item (out of
  fold, or a given verifier model's score).
- "direct" (a rule sending the whole context to the cheap model) has no recorded answer. It is
  scored with the worse of the two recorded scores, so the router is never credited with quality
  nobody measured, and it costs the whole context at the cheap price. No fallback after direct.
- The classifier is scored only on documents it was not fitted on: P(cheap) comes from models
  retrained per fold, folds grouped by document with a fixed seed.
- Oracle: the better route per question, RAG on ties (cheaper).
- Provider prompt caching (off unless the prices carry a LongCache): items are replayed in file order, a
  session in which a document's questions come one after another (L-Eval's order). A long leg reads a warm
  cache when the same strategy sent an earlier long leg on the same documents (within LongCache.window
  questions, when set): its document block (ReplayItem.long_prefix_tokens) is billed at the cache read
  rate. A cold leg writes the block: at the write rate when the provider charges one (Anthropic's
  cache_control), else at the input price (OpenAI's automatic caching). Only a block that comes back
  unchanged is cached (every unit sent, in reading order: gateway.routing.prompt_cache's rule) and only from
  LongCache.min_prefix_tokens on (the long model's prompt_cache_min_tokens). Each strategy warms only what it sent: always-long warms every document
  on its first question, a router only on the questions it sent long. The cheap model's prompts
  (retrieved passages per question) are priced without caching.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gateway.evaluation.relative_choice import PairedAnswer, stream_order  # stream_order: imported from here too
from gateway.routing.decision import Router
from gateway.routing.escalation import CheapAnswerCheck
from policies.routes import DIRECT, FALLBACK, KEPT_REFUSAL, LONG, RAG, Route
from policies.schema import ModelConfig, Policy


@dataclass
class ReplayItem:
    doc_id: str
    group: str
    query: str
    rag_score: float
    lc_score: float
    rag_refused: bool  # the recorded RAG answer says the passages lack the answer
    rag_prompt_tokens: int
    long_prompt_tokens: int
    direct_prompt_tokens: int
    rag_output_tokens: int
    long_output_tokens: int
    features: dict[str, float]
    probability: float  # out-of-fold P(cheap route suffices)
    task: str | None = None
    verifier_score: float | None = None  # the verifier's P(good) of the recorded RAG answer (out of fold, or a model's)
    long_prefix_tokens: int = 0  # the long prompt's document block, when it is the same for every question (else 0)


@dataclass(frozen=True)
class LongCache:
    """The long model's provider prompt cache as the replay prices it (USD per million prompt tokens)."""

    read: float
    write: float | None = None  # a write premium (Anthropic); None: writing costs the input price (OpenAI)
    window: int | None = None  # warm only when the last long leg on the documents is at most this many questions back
    min_prefix_tokens: int = ModelConfig.model_fields["prompt_cache_min_tokens"].default  # the long model's
    source: str = ""


@dataclass(frozen=True)
class Prices:
    """USD per million tokens."""

    cheap_input: float
    cheap_output: float
    long_input: float
    long_output: float
    source: str
    long_cache: LongCache | None = None  # None: every leg priced as if nothing were cached


@dataclass(frozen=True)
class Leg:
    model: str  # "cheap" | "long"
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Outcome:
    route: str  # rag | long | direct | rag>long (rag then long) | kept-refusal
    score: float
    legs: tuple[Leg, ...]


def leg_cost(leg: Leg, prices: Prices, read: int = 0, written: int = 0) -> float:
    """`read` / `written`: prompt tokens of a long leg read from / written to the provider's cache (LongCache)."""
    if leg.model == "cheap":
        return (leg.prompt_tokens * prices.cheap_input + leg.output_tokens * prices.cheap_output) / 1e6
    cache = prices.long_cache
    cached = (
        0.0
        if cache is None
        else read * cache.read + written * (prices.long_input if cache.write is None else cache.write)
    )
    plain = leg.prompt_tokens - (0 if cache is None else read + written)
    return (plain * prices.long_input + cached + leg.output_tokens * prices.long_output) / 1e6


def cacheable_block(item: ReplayItem, cache: LongCache | None) -> int:
    """The tokens of the item's long prompt that a provider would cache: its stable document block, if long enough."""
    if cache is None or item.long_prefix_tokens < cache.min_prefix_tokens:
        return 0
    return min(item.long_prefix_tokens, item.long_prompt_tokens)


def warm_long_legs(items: Sequence[ReplayItem], sends_long: Sequence[bool], cache: LongCache | None) -> list[bool]:
    """Which items' long legs find the cache warm, replaying the items in order: a long leg warms its documents'
    block (a hit refreshes it), and a later long leg on the same documents reads it, within `cache.window`
    questions when set. `sends_long[i]`: the strategy sends item i to the long model (routed or escalated)."""
    warm = [False] * len(items)
    if cache is None:
        return warm
    last: dict[str, int] = {}
    for position, (item, sent) in enumerate(zip(items, sends_long)):
        if not sent or not cacheable_block(item, cache):
            continue
        before = last.get(item.doc_id)
        warm[position] = before is not None and (cache.window is None or position - before <= cache.window)
        last[item.doc_id] = position
    return warm


def long_leg_cost(item: ReplayItem, leg: Leg, prices: Prices, warm: bool) -> float:
    """A long leg's cost: its block read from the cache when warm, written to it when cold."""
    block = cacheable_block(item, prices.long_cache)
    return leg_cost(leg, prices, read=block if warm else 0, written=0 if warm else block)


def outcome_costs(items: Sequence[ReplayItem], outcomes: Sequence[Outcome], prices: Prices) -> list[float]:
    """Each outcome's cost, its long legs priced in sequence (warm_long_legs): the one cost function of the
    replay's strategies, its baseline and its threshold sweeps (the tradeoff Table applies the same two rules)."""
    warm = warm_long_legs(items, [any(leg.model == "long" for leg in o.legs) for o in outcomes], prices.long_cache)
    return [
        sum(long_leg_cost(item, leg, prices, hot) if leg.model == "long" else leg_cost(leg, prices) for leg in o.legs)
        for item, o, hot in zip(items, outcomes, warm)
    ]


def _rag(item: ReplayItem) -> Outcome:
    return Outcome(RAG, item.rag_score, (Leg("cheap", item.rag_prompt_tokens, item.rag_output_tokens),))


def _long(item: ReplayItem) -> Outcome:
    return Outcome(LONG, item.lc_score, (Leg("long", item.long_prompt_tokens, item.long_output_tokens),))


def _fallback(item: ReplayItem) -> Outcome:
    return Outcome(FALLBACK, item.lc_score, _rag(item).legs + _long(item).legs)


def _direct(item: ReplayItem) -> Outcome:
    return Outcome(
        DIRECT, min(item.rag_score, item.lc_score), (Leg("cheap", item.direct_prompt_tokens, item.rag_output_tokens),)
    )


def self_route(item: ReplayItem) -> Outcome:
    return _fallback(item) if item.rag_refused else _rag(item)


def oracle(item: ReplayItem) -> Outcome:
    return _rag(item) if item.rag_score >= item.lc_score else _long(item)


def router_strategy(
    router: Router, fallback: bool, check: CheapAnswerCheck | None = None
) -> Callable[[ReplayItem], Outcome]:
    """The policy's rules and classifier (with the out-of-fold probability); with `fallback`, the cheap
    answer is checked by gateway.routing.escalation exactly as the live gateway checks it (with the
    policy's verifier when it has one: the item's verifier_score is its P(good)). With a relative threshold
    (routing.verifier.relative) the check remembers the answers it saw: feed it items in arrival order
    (`in_stream_order`), one strategy per stream."""
    check = check or CheapAnswerCheck(router.policy)

    def choose(item: ReplayItem) -> Outcome:
        decision = router.decide(item.features, probability=item.probability)
        if decision.route == LONG:
            return _long(item)
        if decision.route == DIRECT:
            return _direct(item)  # no recorded direct answer: nothing to check
        if not fallback:
            return _rag(item)
        # one replay stream is one deployment (one key); the long leg's tokens are what the relative rule charges
        verdict = check.verdict(decision, item.rag_refused, item.verifier_score, None, item.long_prompt_tokens)
        if verdict.escalate:
            return _fallback(item)
        if verdict.outcome == KEPT_REFUSAL:
            return Outcome(KEPT_REFUSAL, item.rag_score, _rag(item).legs)
        return _rag(item)

    return choose


def with_threshold(policy: Policy, threshold: float) -> Policy:
    copy = policy.model_copy(deep=True)
    if copy.routing.classifier is not None:
        copy.routing.classifier.threshold = float(threshold)
    return copy


def with_verifier(policy: Policy, threshold: float) -> Policy:
    """The policy checking cheap answers with a verifier at this threshold."""
    from policies.schema import VerifierSettings

    copy = policy.model_copy(deep=True)
    settings = copy.routing.verifier or VerifierSettings()
    copy.routing.verifier = settings.model_copy(update={"threshold": float(threshold)})
    return copy


def without_verifier(policy: Policy) -> Policy:
    copy = policy.model_copy(deep=True)
    copy.routing.verifier = None
    return copy


def without_pre_route(policy: Policy) -> Policy:
    """Every question to the cheap route first (no rules, no classifier); its answer is still checked."""
    copy = policy.model_copy(deep=True)
    copy.routing.rules = []
    copy.routing.classifier = None
    copy.routing.default_route = Route.RAG
    return copy


def without_rules(policy: Policy) -> Policy:
    copy = policy.model_copy(deep=True)
    copy.routing.rules = []
    return copy


def with_keep_refusal(policy: Policy, enabled: bool = True) -> Policy:
    copy = policy.model_copy(deep=True)
    copy.routing.fallback.keep_refusal_when_absent = enabled
    return copy


@dataclass
class StrategyResult:
    name: str
    quality: float
    quality_vs_long_points: float
    route_shares: dict[str, float]
    prompt_tokens: int
    tokens_vs_long: float
    cost_usd: float
    cost_vs_long: float
    per_task: dict[str, float] = field(default_factory=dict)
    per_task_long: dict[str, float] = field(default_factory=dict)  # share answered long (directly or escalated)

    def to_dict(self) -> dict:
        return self.__dict__.copy()


def paired_answers(items: Sequence[ReplayItem]) -> list[PairedAnswer]:
    """The items as the relative rule's parameter choice reads them (gateway.evaluation.relative_choice): every item a
    checked cheap answer with its out-of-fold P(good) (items without one are left out)."""
    return [
        PairedAnswer(
            i.group,
            float(i.verifier_score),
            bool(i.rag_refused),
            float(i.rag_score),
            float(i.lc_score),
            float(i.rag_prompt_tokens),
            float(i.long_prompt_tokens),
            float(i.probability),
        )
        for i in items
        if i.verifier_score is not None and not math.isnan(i.verifier_score)
    ]


def in_stream_order(items: list[ReplayItem], policy: Policy, seed: int = 0) -> list[ReplayItem]:
    """The items as one deployment would see them (stream_order) when the policy's check depends on the answers
    before (routing.verifier.relative); otherwise as given (every other strategy is order-free)."""
    verifier = policy.routing.verifier
    if verifier is None or verifier.relative is None:
        return items
    return [items[i] for i in stream_order(items, seed)]


def evaluate(
    name: str,
    strategy: Callable[[ReplayItem], Outcome],
    items: list[ReplayItem],
    prices: Prices,
    long_tokens: int,
    long_cost: float,
    long_quality: float,
) -> StrategyResult:
    outcomes = [strategy(item) for item in items]
    n = len(outcomes)
    quality = sum(o.score for o in outcomes) / n
    tokens = sum(leg.prompt_tokens for o in outcomes for leg in o.legs)
    cost = sum(outcome_costs(items, outcomes, prices))
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.route] = counts.get(o.route, 0) + 1
    per_task: dict[str, list[float]] = {}
    per_task_long: dict[str, list[float]] = {}
    for item, o in zip(items, outcomes):
        per_task.setdefault(item.task or "all", []).append(o.score)
        per_task_long.setdefault(item.task or "all", []).append(float(o.route in (LONG, FALLBACK)))
    return StrategyResult(
        name=name,
        quality=quality,
        quality_vs_long_points=100.0 * (quality - long_quality),
        route_shares={route: count / n for route, count in sorted(counts.items())},
        prompt_tokens=tokens,
        tokens_vs_long=tokens / long_tokens if long_tokens else math.nan,
        cost_usd=cost,
        cost_vs_long=cost / long_cost if long_cost else math.nan,
        per_task={t: sum(v) / len(v) for t, v in sorted(per_task.items())},
        per_task_long={t: sum(v) / len(v) for t, v in sorted(per_task_long.items())},
    )


def baseline_totals(items: list[ReplayItem], prices: Prices) -> tuple[int, float, float]:
    outcomes = [_long(i) for i in items]
    return (
        sum(leg.prompt_tokens for o in outcomes for leg in o.legs),
        sum(outcome_costs(items, outcomes, prices)),
        sum(o.score for o in outcomes) / len(outcomes),
    )


def strategies(
    policy: Policy, verifier_threshold: float | None = None
) -> list[tuple[str, Callable[[ReplayItem], Outcome]]]:
    """The replay's strategies. With `verifier_threshold` (the items carry verifier scores), the verifier's
    strategies too: the cheap route always first then the verifier, and the pre-route with the verifier."""
    literal = without_verifier(policy)
    out = [
        ("always-long", _long),
        ("always-rag", _rag),
        ("self-route", self_route),
        ("rules+classifier", router_strategy(Router(literal), fallback=False)),
        ("router (rules+classifier+fallback)", router_strategy(Router(literal), fallback=True)),
    ]
    if not policy.routing.fallback.keep_refusal_when_absent:
        out.append(("router + keep-refusal option", router_strategy(Router(with_keep_refusal(literal)), True)))
    if verifier_threshold is not None:
        verified = with_verifier(policy, verifier_threshold)
        out.append(("verifier only (rag, then verifier)", router_strategy(Router(without_pre_route(verified)), True)))
        out.append(("rules+classifier+verifier", router_strategy(Router(verified), fallback=True)))
    out.append(("oracle", oracle))
    return out


def run_strategies(
    items: list[ReplayItem], policy: Policy, prices: Prices, verifier_threshold: float | None = None
) -> list[StrategyResult]:
    items = in_stream_order(items, policy)  # a relative threshold reads the answers before each one
    long_tokens, long_cost, long_quality = baseline_totals(items, prices)
    return [
        evaluate(name, fn, items, prices, long_tokens, long_cost, long_quality)
        for name, fn in strategies(policy, verifier_threshold)
    ]


# -- threshold sweeps ----------------------------------------------------------------------------
def threshold_grid(probabilities: list[float], steps: int = 100) -> list[float]:
    """Thresholds at the probabilities' quantiles (so long shares spread evenly), plus both ends."""
    ranked = sorted(probabilities)
    picks = {ranked[min(len(ranked) - 1, round(i * (len(ranked) - 1) / steps))] for i in range(steps + 1)}
    return sorted(picks | {0.0, min(1.0, math.nextafter(ranked[-1], math.inf))})


def sweep(items: list[ReplayItem], policy: Policy, prices: Prices, fallback: bool, steps: int = 100) -> list[dict]:
    """Quality and cost of the router across classifier thresholds."""
    long_tokens, long_cost, long_quality = baseline_totals(items, prices)
    points = []
    for t in threshold_grid([i.probability for i in items], steps):
        strategy = router_strategy(Router(with_threshold(policy, t)), fallback)
        r = evaluate(f"t={t:.4f}", strategy, items, prices, long_tokens, long_cost, long_quality)
        long_share = r.route_shares.get(LONG, 0.0)
        points.append(
            {
                "threshold": t,
                "quality": r.quality,
                "cost_vs_long": r.cost_vs_long,
                "tokens_vs_long": r.tokens_vs_long,
                "long_share": long_share,
            }
        )
    return points


@dataclass
class GapRecovery:
    """RouteLLM-style summaries of the classifier alone routing between RAG and long."""

    quality_rag: float
    quality_long: float
    cpt50: float | None  # share of long calls needed to recover 50% of the RAG-to-long quality gap
    cpt80: float | None
    apgr: float | None  # average performance gap recovered over long-call shares 0..1
    apgr_oracle: float | None  # the same with perfect ordering, for scale (random ordering: 0.5)
    curve: list[tuple[float, float]]  # (long-call share, PGR)


def _pgr_curve(items: list[ReplayItem], order: list[int], q_rag: float, gap: float) -> list[tuple[float, float]]:
    n = len(items)
    total = sum(i.rag_score for i in items)
    curve = [(0.0, (total / n - q_rag) / gap)]
    for k, index in enumerate(order, start=1):
        total += items[index].lc_score - items[index].rag_score
        curve.append((k / n, (total / n - q_rag) / gap))
    return curve


def _area(curve: list[tuple[float, float]]) -> float:
    return sum((x1 - x0) * (y0 + y1) / 2 for (x0, y0), (x1, y1) in zip(curve, curve[1:]))


def gap_recovery(items: list[ReplayItem]) -> GapRecovery:
    """Route the k least-likely-cheap questions long, for k = 0..n (classifier only: no rules, no
    fallback), and measure how much of the quality gap between always-RAG and always-long returns."""
    n = len(items)
    q_rag = sum(i.rag_score for i in items) / n
    q_long = sum(i.lc_score for i in items) / n
    gap = q_long - q_rag
    if n == 0 or gap <= 0:
        return GapRecovery(q_rag, q_long, None, None, None, None, [])
    order = sorted(range(n), key=lambda i: (items[i].probability, i))
    curve = _pgr_curve(items, order, q_rag, gap)
    best = sorted(range(n), key=lambda i: (-(items[i].lc_score - items[i].rag_score), i))

    def cpt(target: float) -> float | None:
        return next((share for share, pgr in curve if pgr >= target - 1e-12), None)

    return GapRecovery(
        q_rag, q_long, cpt(0.5), cpt(0.8), _area(curve), _area(_pgr_curve(items, best, q_rag, gap)), curve
    )
