"""The learning loop simulated on paired data, before anyone deploys it (`selfroute eval replay --simulate-learning`).

Questions arrive one at a time, in a seeded order that shuffles the documents and keeps each document's questions
together (a deployment sees a document's questions in a session). Every strategy decides with the live decision
functions (gateway.evaluation.replay.router_strategy: gateway.routing.decision and gateway.routing.escalation):

- the learning router starts from the shipped classifier and verifier; labels come as the gateway would make them:
  the judge on every escalation (both answers exist), and for `shadow_rate` of the accepted cheap answers a shadow
  long answer and the judge. The recorded scores stand in for the judge (the cheap answer is worse when its score
  is below the long one's), each verdict flipped with probability `judge_noise`. Shadow and judge legs are paid:
  a shadow costs a long leg, a judge a long-model call reading the question, passages and both answers.
  Every `refit_every` questions the verifier is refitted on the labels so far (escalation labels weight 1, shadow
  labels 1/shadow_rate: they stand for all the accepted answers), and its threshold is set from the scores of the
  questions seen so far, like `selfroute calibrate --from-ledger`: the escalation share the frozen router showed on
  them, less the share the learning legs cost and any spend over the frozen router's so far, so the learning router
  spends about what the frozen one spends; or, with `max_token_share`, the share that keeps the learning router's
  tokens (its learning legs included) at that share of always-long's, any excess so far caught up over the next
  refit period (a deployment that budgets against always-long rather than against the shipped router: a shipped
  router that never escalates leaves the spend-holding rule no room to escalate at all);
- the shipped router frozen (the same decisions, never refitted, no learning legs);
- always-long, always-RAG, and the oracle (the better recorded answer, RAG on ties).

Reported per window of questions: quality (mean recorded score, points) and cost (USD at the replay's prices, and
tokens of every leg), plus the totals after the first `after` questions (the trailing part of the stream).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from gateway.evaluation.replay import Leg, Outcome, Prices, ReplayItem, leg_cost, oracle, router_strategy
from gateway.routing.decision import Router
from gateway.routing.escalation import CheapAnswerCheck
from gateway.routing.learning.judge import ANSWER_CHARS, JUDGE_PROMPT, PASSAGE_CHARS
from policies.routes import FALLBACK, KEPT_REFUSAL, RAG
from policies.schema import Policy

if TYPE_CHECKING:
    from classifier.estimators import Estimator

JUDGE_OUTPUT_TOKENS = 12  # {"verdict": "both_wrong"}
MIN_LABELS = 40  # fewer labels (or only one class) keep the shipped verifier
LEARNING = "learning router"
FROZEN = "shipped router (frozen)"
ALWAYS_LONG, ALWAYS_RAG, ORACLE = "always-long", "always-RAG", "oracle"
STRATEGIES = (LEARNING, FROZEN, ALWAYS_LONG, ALWAYS_RAG, ORACLE)


@dataclass
class SimQuestion:
    item: ReplayItem  # probability: the shipped classifier's P(cheap); verifier_score: the shipped verifier's
    answer_row: dict[str, float]  # the verifier's features of the recorded cheap answer (pre-route P filled in)


@dataclass
class Tally:
    questions: int = 0
    score: float = 0.0
    cost_usd: float = 0.0
    tokens: int = 0
    learning_cost_usd: float = 0.0  # shadow and judge legs
    learning_tokens: int = 0
    escalated: int = 0
    long_answered: int = 0

    def add(self, outcome: Outcome, prices: Prices, extra: Sequence[Leg] = ()) -> None:
        self.questions += 1
        self.score += outcome.score
        self.cost_usd += sum(leg_cost(leg, prices) for leg in outcome.legs)
        self.tokens += sum(leg.prompt_tokens + leg.output_tokens for leg in outcome.legs)
        extra_cost = sum(leg_cost(leg, prices) for leg in extra)
        self.cost_usd += extra_cost
        self.learning_cost_usd += extra_cost
        extra_tokens = sum(leg.prompt_tokens + leg.output_tokens for leg in extra)
        self.tokens += extra_tokens
        self.learning_tokens += extra_tokens
        self.escalated += outcome.route == FALLBACK
        self.long_answered += any(leg.model == "long" for leg in outcome.legs)

    def to_dict(self) -> dict[str, Any]:
        n = max(self.questions, 1)
        return {
            "questions": self.questions,
            "quality": 100.0 * self.score / n,
            "cost_usd": self.cost_usd,
            "tokens": self.tokens,
            "learning_cost_usd": self.learning_cost_usd,
            "learning_tokens": self.learning_tokens,
            "escalated_share": self.escalated / n,
            "long_share": self.long_answered / n,
        }


@dataclass
class SimulationResult:
    order_seed: int
    shadow_rate: float
    judge_noise: float
    refit_every: int
    window: int
    after: int
    windows: list[dict[str, Any]]  # per window: "end" (its last position) and strategy -> Tally.to_dict()
    trailing: dict[str, dict[str, Any]]  # questions after `after`, per strategy
    total: dict[str, dict[str, Any]]
    labels: dict[str, int] = field(default_factory=dict)
    refits: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def stream_order(items: Sequence[ReplayItem], seed: int) -> list[int]:
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


def judge_leg(item: ReplayItem) -> Leg:
    """A judge call on the long model: the fixed prompt, the question, the passages (capped as the live judge caps
    them: gateway.routing.learning.judge) and both answers."""
    instructions = len(JUDGE_PROMPT) // 4 + 40
    passages = min(item.rag_prompt_tokens, PASSAGE_CHARS // 4)
    answers = min(item.rag_output_tokens, ANSWER_CHARS // 4) + min(item.long_output_tokens, ANSWER_CHARS // 4)
    return Leg("long", instructions + passages + answers + len(item.query) // 4, JUDGE_OUTPUT_TOKENS)


def shadow_leg(item: ReplayItem) -> Leg:
    return Leg("long", item.long_prompt_tokens, item.long_output_tokens)


def _long_outcome(item: ReplayItem) -> Outcome:
    return Outcome("long", item.lc_score, (Leg("long", item.long_prompt_tokens, item.long_output_tokens),))


def _rag_outcome(item: ReplayItem) -> Outcome:
    return Outcome(RAG, item.rag_score, (Leg("cheap", item.rag_prompt_tokens, item.rag_output_tokens),))


def _with_verifier_threshold(policy: Policy, threshold: float) -> Policy:
    assert policy.routing.verifier is not None  # simulate() refuses a policy without one
    verifier = policy.routing.verifier.model_copy(update={"threshold": float(threshold)})
    return policy.model_copy(update={"routing": policy.routing.model_copy(update={"verifier": verifier})})


def _quantile_threshold(scores: Sequence[float], share: float) -> float:
    """The P(good) below which `share` of `scores` fall (escalate when P(good) < threshold)."""
    ordered = sorted(scores)
    if not ordered or share <= 0:
        return 0.0
    if share >= 1:
        return 1.0 + 1e-9
    k = int(math.floor(share * len(ordered)))
    return ordered[min(k, len(ordered) - 1)]


def _token_budget_share(
    cap: float,
    tokens: int,
    long_tokens: int,
    seen: int,
    period: int,
    share_now: float,
    cheap_fraction: float,
    long_leg_tokens: float,
) -> float:
    """The escalation share for the next `period` questions that brings the learning router's tokens to `cap` of
    always-long's: its rate so far, changed linearly by each escalation's long leg (on the cheap-routed fraction),
    spending (or saving) the difference between the cap and what it used so far over the period."""
    per_question_cap = cap * long_tokens / seen
    allowance = per_question_cap + (cap * long_tokens - tokens) / period
    per_share = cheap_fraction * long_leg_tokens  # tokens per question of escalating every cheap answer
    if per_share <= 0:
        return share_now
    return min(1.0, max(0.0, share_now + (allowance - tokens / seen) / per_share))


def simulate(
    questions: Sequence[SimQuestion],
    policy: Policy,
    prices: Prices,
    *,
    shadow_rate: float,
    judge_noise: float,
    refit_every: int,
    seed: int = 0,
    window: int = 250,
    after: int = 1000,
    estimator: Estimator = "logistic",
    feature_names: Sequence[str] | None = None,
    max_token_share: float | None = None,
) -> SimulationResult:
    """Run the stream once. `policy` must have a verifier (its threshold, else the shipped verifier card's, is the
    frozen router's); `questions[i].item.verifier_score` is the shipped verifier's score of that answer."""
    import numpy as np

    from classifier.answer_features import ANSWER_FEATURE_NAMES
    from classifier.estimators import VERIFIER, build_pipeline
    from classifier.verifier import VerifierModel, label_good

    if policy.routing.verifier is None or policy.routing.verifier.threshold is None:
        raise ValueError("the simulation needs a policy with routing.verifier and its threshold")
    names = list(feature_names or ANSWER_FEATURE_NAMES)
    rng = random.Random(seed)
    router = Router(policy)
    frozen = router_strategy(router, True, CheapAnswerCheck(policy))
    order = stream_order([q.item for q in questions], seed)
    tallies = {name: Tally() for name in STRATEGIES}
    trailing = {name: Tally() for name in STRATEGIES}
    windows: list[dict[str, Any]] = []
    current = {name: Tally() for name in STRATEGIES}

    learned: VerifierModel | None = None
    learn_policy = policy
    labelled: list[tuple[int, int, float]] = []  # (question index, label, weight)
    seen_cheap: list[int] = []  # questions the pre-route sent to the checked cheap route
    frozen_escalations = 0
    live_escalations = 0  # the learning router's, on the seen cheap-routed questions
    long_tokens_seen = 0  # of the long legs those questions would need
    long_cost_seen = 0.0  # of the long legs the frozen router would pay on the seen cheap-routed questions
    learning_cost = 0.0
    refits: list[dict[str, Any]] = []
    counts = {"escalation": 0, "shadow": 0, "flipped": 0}
    learned_scores: list[float] = []

    def score_of(index: int) -> float:
        if learned is not None:
            return learned_scores[index]
        shipped = questions[index].item.verifier_score
        if shipped is None:  # the docstring's precondition; sorting and comparing scores need every one
            raise ValueError(f"question {index} has no verifier_score (the shipped verifier's score is needed)")
        return shipped

    learning_check = CheapAnswerCheck(learn_policy)

    for position, index in enumerate(order, start=1):
        question = questions[index]
        item = question.item
        outcomes = {
            FROZEN: frozen(item),
            ALWAYS_LONG: _long_outcome(item),
            ALWAYS_RAG: _rag_outcome(item),
            ORACLE: oracle(item),
        }
        decision = router.decide(item.features, item.probability)
        live = router_strategy(router, True, learning_check)(replace(item, verifier_score=score_of(index)))
        extra: list[Leg] = []
        checked = learning_check.applies(decision) and decision.route == RAG
        if checked:
            seen_cheap.append(index)
            frozen_escalations += outcomes[FROZEN].route == FALLBACK
            long_cost_seen += leg_cost(shadow_leg(item), prices)
            long_tokens_seen += shadow_leg(item).prompt_tokens + shadow_leg(item).output_tokens
            live_escalations += live.route == FALLBACK
            truth = label_good(item.rag_score, item.lc_score)
            label, weight = None, 1.0
            if live.route == FALLBACK:  # both answers exist: the judge
                extra.append(judge_leg(item))
                label = truth
                counts["escalation"] += 1
            elif live.route in (RAG, KEPT_REFUSAL) and rng.random() < shadow_rate:
                extra.extend([shadow_leg(item), judge_leg(item)])
                label, weight = truth, 1.0 / shadow_rate
                counts["shadow"] += 1
            if label is not None:
                if rng.random() < judge_noise:
                    label = 1 - label
                    counts["flipped"] += 1
                labelled.append((index, label, weight))
            learning_cost += sum(leg_cost(leg, prices) for leg in extra)
        outcomes[LEARNING] = live
        for name, outcome in outcomes.items():
            legs = extra if name == LEARNING else ()
            tallies[name].add(outcome, prices, legs)
            current[name].add(outcome, prices, legs)
            if position > after:
                trailing[name].add(outcome, prices, legs)
        if position % window == 0 or position == len(order):
            windows.append({"end": position, **{name: t.to_dict() for name, t in current.items()}})
            current = {name: Tally() for name in STRATEGIES}
        if position % refit_every == 0 and labelled:
            ys = [label for _, label, _ in labelled]
            if len(labelled) >= MIN_LABELS and len(set(ys)) == 2:
                model = VerifierModel(build_pipeline(estimator, VERIFIER, seed), names)
                model.fit(
                    [questions[i].answer_row for i, _, _ in labelled], np.asarray(ys), [w for _, _, w in labelled]
                )
                # every question's score at once (a deployment scores each as it comes; the model is the same)
                learned, learned_scores = model, model.scores([q.answer_row for q in questions])
                # hold the frozen router's spend: its escalation share on the questions seen, less the learning legs'
                # running share, less what the learning router spent over the frozen one so far, caught up over the
                # next refit period (shares of the long legs those questions need)
                n_seen = max(len(seen_cheap), 1)
                mean_long = long_cost_seen / n_seen
                share = frozen_escalations / n_seen
                overhead = learning_cost / long_cost_seen if long_cost_seen else 0.0
                overspent = tallies[LEARNING].cost_usd - tallies[FROZEN].cost_usd
                upcoming = max(refit_every * n_seen / position, 1.0)  # cheap-routed questions expected next
                catch_up = overspent / mean_long / upcoming if mean_long else 0.0
                target = min(1.0, max(0.0, share - overhead - catch_up))
                if max_token_share is not None:
                    target = _token_budget_share(
                        max_token_share,
                        tallies[LEARNING].tokens,
                        tallies[ALWAYS_LONG].tokens,
                        position,
                        refit_every,
                        live_escalations / n_seen,
                        n_seen / position,
                        long_tokens_seen / n_seen,
                    )
                threshold = _quantile_threshold([score_of(i) for i in seen_cheap], target)
                learn_policy = _with_verifier_threshold(policy, threshold)
                learning_check = CheapAnswerCheck(learn_policy)
                refits.append(
                    {
                        "at": position,
                        "labels": len(labelled),
                        "target_share": target,
                        "past_share": sum(score_of(i) < threshold for i in seen_cheap) / n_seen,
                        "threshold": threshold,
                    }
                )
    return SimulationResult(
        order_seed=seed,
        shadow_rate=shadow_rate,
        judge_noise=judge_noise,
        refit_every=refit_every,
        window=window,
        after=after,
        windows=windows,
        trailing={n: t.to_dict() for n, t in trailing.items()},
        total={n: t.to_dict() for n, t in tallies.items()},
        labels={**counts, "total": len(labelled)},
        refits=refits,
    )


def format_simulation(result: SimulationResult, title: str) -> str:
    long_total = result.trailing[ALWAYS_LONG]
    lines = [
        f"{title}: shadow {result.shadow_rate:.0%}, judge noise {result.judge_noise:.0%}, refit every "
        f"{result.refit_every}, order seed {result.order_seed}; labels {result.labels}"
    ]
    header = f"{'window end':>10} " + " ".join(f"{name[:22]:>24}" for name in STRATEGIES)
    lines.append("quality (points) / cost (USD) per window")
    lines.append(header)
    for w in result.windows:
        lines.append(
            f"{w['end']:>10} "
            + " ".join(f"{w[name]['quality']:>10.1f} / {w[name]['cost_usd']:>10.4f}" for name in STRATEGIES)
        )
    trailing_n = long_total["questions"]
    lines.append(f"after question {result.after} ({trailing_n} questions):")
    for name in STRATEGIES:
        t = result.trailing[name]
        share = t["tokens"] / long_total["tokens"] if long_total["tokens"] else float("nan")
        cost_share = t["cost_usd"] / long_total["cost_usd"] if long_total["cost_usd"] else float("nan")
        lines.append(
            f"  {name:<26} quality {t['quality']:6.2f}  cost ${t['cost_usd']:.4f} ({cost_share:.0%} of "
            f"always-long; learning legs ${t['learning_cost_usd']:.4f})  tokens {share:.0%} of always-long"
            f"  escalated {t['escalated_share']:.0%}"
        )
    return "\n".join(lines)


def targets(result: SimulationResult) -> dict[str, Any]:
    """The issue's targets on the trailing part: learning >= frozen + 1 point at no more cost, and >= always-long
    at <= 35% of its tokens (shadow and judge legs included)."""
    t, f, lg = result.trailing[LEARNING], result.trailing[FROZEN], result.trailing[ALWAYS_LONG]
    token_share = t["tokens"] / lg["tokens"] if lg["tokens"] else float("nan")
    return {
        "vs_frozen_points": t["quality"] - f["quality"],
        "cost_vs_frozen": t["cost_usd"] / f["cost_usd"] if f["cost_usd"] else float("nan"),
        "beats_frozen_by_1_at_no_more_cost": t["quality"] >= f["quality"] + 1 and t["cost_usd"] <= f["cost_usd"],
        "vs_always_long_points": t["quality"] - lg["quality"],
        "token_share_of_always_long": token_share,
        "matches_always_long_at_35pct_tokens": t["quality"] >= lg["quality"] and token_share <= 0.35,
    }
