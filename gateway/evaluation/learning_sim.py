"""The learning loop simulated on paired data, before anyone deploys it (`selfroute eval replay --simulate-learning`).

Questions arrive one at a time, in a seeded order that shuffles the documents and keeps each document's questions
together (a deployment sees a document's questions in a session). Every strategy decides with the live decision
functions (gateway.evaluation.replay.router_strategy: gateway.routing.decision and gateway.routing.escalation):

- the learning router starts from the shipped classifier and verifier; labels come as the gateway would make them:
  the judge on every escalation (both answers exist), and for `shadow_rate` of the accepted cheap answers a shadow
  long answer and the judge. The recorded scores stand in for the judge (the cheap answer is worse when its score
  is below the long one's), each verdict flipped with probability `judge_noise`. Shadow and judge legs are paid:
  a shadow costs a long leg, a judge a long-model call reading the question, passages and both answers.
  Every `refit_every` questions it runs what `selfroute learn` runs on the labels so far (gateway.evaluation.refit:
  escalation labels weight 1, shadow labels 1/shadow_rate; the same minimum label counts): the verifier refitted and
  kept only when it beats the model in force out of fold, the verifier and refusal thresholds re-chosen for the
  escalation share below, and with enough labels the classifier refitted the same way (its threshold keeping the
  long share the classifier in force sent long). The share: by default (`frozen-spend`) the escalation share the
  frozen router showed on the questions seen, less the share the learning legs cost and any spend over the frozen
  router's so far, so the learning router spends about what the frozen one spends (`learn --escalation-share`);
  `in-force`: learn's own default, the share the learning router's policy in force escalated; or, with
  `max_token_share`, the share that keeps the learning router's tokens (its learning legs included) at that share of
  always-long's, any excess so far caught up over the next refit period, a saving never spent later (a deployment
  that budgets against always-long rather than against the shipped router);
- the shipped router frozen (the same decisions, never refitted, no learning legs);
- always-long, always-RAG, and the oracle (the better recorded answer, RAG on ties).

Reported per window of questions: quality (mean recorded score, points) and cost (USD at the replay's prices, and
tokens of every leg), plus the totals after the first `after` questions (the trailing part of the stream).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from gateway.evaluation.refit import (
    MIN_LABELS,
    MIN_ROUTE_LABELS,
    Blend,
    Checked,
    LabelledAnswers,
    refit_classifier,
    refit_verifier,
    refit_won,
    threshold_for_share,
    with_verifier_thresholds,
)
from gateway.evaluation.relative_refit import (
    CheckedStream,
    refit_relative,
    relative_for_budget,
    relative_out_of_fold,
    with_pool_and_spend,
)
from gateway.evaluation.replay import (
    Leg,
    Outcome,
    Prices,
    ReplayItem,
    leg_cost,
    oracle,
    router_strategy,
    stream_order,
)
from gateway.routing.decision import RouteDecision, Router
from gateway.routing.escalation import CheapAnswerCheck
from gateway.routing.learning.judge import ANSWER_CHARS, JUDGE_PROMPT, PASSAGE_CHARS
from gateway.routing.learning.loop import shadow_probability, shadow_scale_after
from gateway.routing.score_window import Seen
from policies.routes import FALLBACK, KEPT_REFUSAL, RAG
from policies.schema import LearningSettings, Policy, ShadowBackoff

if TYPE_CHECKING:
    from classifier.estimators import Estimator
    from classifier.model import RouteModel
    from classifier.verifier import VerifierModel

JUDGE_OUTPUT_TOKENS = 12  # {"verdict": "both_wrong"}
FROZEN_SPEND, IN_FORCE = "frozen-spend", "in-force"  # the escalation share each refit holds (share_rule)
SHARE_RULES = (FROZEN_SPEND, IN_FORCE)
LABELS, SCORES = "labels", "scores"  # what sets a kept verifier's thresholds for the share (thresholds_from)
FIXED = "fixed"  # relative_from: the refit leaves routing.verifier.relative as it is (LABELS: chosen on the labels)
OUT_OF_FOLD = "out-of-fold"  # relative_from: chosen on the labels, put in force only when it holds out of fold (learn)
LEARNING = "learning router"
FROZEN = "shipped router (frozen)"
ALWAYS_LONG, ALWAYS_RAG, ORACLE = "always-long", "always-RAG", "oracle"
CONTROL = "budget control (no labels)"
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
    shadow_reference_tokens: int | None = None
    control_thresholds: list[dict[str, Any]] = field(default_factory=list)  # with control: "at", "share", "threshold"

    @property
    def strategies(self) -> tuple[str, ...]:
        return tuple(self.trailing)

    def to_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


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


def _frozen_spend_share(
    frozen_share: float, overhead: float, over_frozen_usd: float, mean_long_usd: float, upcoming: float
) -> float:
    """The escalation share that holds the frozen router's spend: its share on the questions seen, less the learning
    legs' running share (`overhead`), less what was spent over the frozen router so far (savings are not banked),
    caught up over the `upcoming` cheap-routed questions of the next refit period (shares of their long legs)."""
    overspent = max(0.0, over_frozen_usd)
    catch_up = overspent / mean_long_usd / max(upcoming, 1.0) if mean_long_usd else 0.0
    return min(1.0, max(0.0, frozen_share - overhead - catch_up))


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
    saving what it spent over the cap so far over the period. What it spent under the cap is not banked: spending it
    later would put the questions of that period over the cap (the stream before the first refit escalates little)."""
    per_question_cap = cap * long_tokens / seen
    allowance = per_question_cap - max(0.0, tokens - cap * long_tokens) / period
    per_share = cheap_fraction * long_leg_tokens  # tokens per question of escalating every cheap answer
    if per_share <= 0:
        return share_now
    return min(1.0, max(0.0, share_now + (allowance - tokens / seen) / per_share))


def _rows_with_p(questions: Sequence[SimQuestion], p_cheap: Sequence[float]) -> list[dict[str, float]]:
    """The verifier's inputs with the pre-route P(cheap) the decision was made on (the live check reads it too)."""
    return [q.answer_row | {"pre_route_probability": float(p)} for q, p in zip(questions, p_cheap)]


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
    share_rule: str = FROZEN_SPEND,
    shadow_reference_tokens: int | None = None,
    control: bool = False,
    thresholds_from: str = LABELS,
    min_model_labels: int = 0,
    relative_from: str = FIXED,
    verifier: VerifierModel | None = None,
    route_model: RouteModel | None = None,
    min_labels: int = MIN_LABELS,
    min_route_labels: int = MIN_ROUTE_LABELS,
    folds: int = 5,
    blend: Blend | None = None,
    blend_prior: float | None = None,
    escalation_weight: float = 1.0,
    shadow_backoff: ShadowBackoff | None = None,
) -> SimulationResult:
    """Run the stream once. `policy` must have a verifier (its thresholds, else the shipped verifier card's, are the
    frozen router's); `questions[i].item.verifier_score` is the shipped verifier's score of that answer and
    `item.probability` the shipped classifier's P(cheap). `verifier` / `route_model`: the shipped models, so the
    learning router re-scores answers when its P(cheap) changes and the classifier can be refitted (without
    `route_model` it is not). Every `refit_every` questions the refit is `selfroute learn`'s
    (gateway.evaluation.refit) on the labels so far, at the escalation share `share_rule` gives. Shadows are drawn
    with the live rule (gateway.routing.learning.loop.shadow_probability: `shadow_rate`, scaled down for a context
    over `shadow_reference_tokens`), each shadow label weighted 1 / its probability as `learn` weighs it.
    `control`: a budget control beside it, the shipped models with the same share rule applied every `refit_every`
    questions but no labels (no learning legs, no refits): its verifier threshold is set from the score
    distribution alone (refit.threshold_for_share), so what the learning router gains over it is the labels' and
    what it gains over the frozen router is the spend's and the labels' together. `thresholds_from`: when a refit
    keeps the verifier in force, its thresholds for the share are chosen on the labels (`labels`, learn's way) or set
    from the scores of every checked answer seen (`scores`: refit.Checked, the refusal rule in force kept).
    `min_model_labels`: as `learn --min-model-labels`, fewer labels never put a new verifier in force.
    `relative_from`: with a relative threshold (routing.verifier.relative), which decides once a window is warm, a
    refit re-chooses its pool and refusal_spend on the labels (`labels`: gateway.evaluation.relative_refit.
    refit_relative, within the share as a share of the checked answers' long tokens; `out-of-fold`: the same choice
    put in force only when it holds out of fold, relative_out_of_fold, as `selfroute learn` does) or leaves them
    (`fixed`);
    with `labels` the budget control re-chooses them for the same budget without labels (relative_for_budget).
    `blend` / `blend_prior` / `escalation_weight`: as `learn --blend-shipped` / `--blend-prior` /
    `--escalation-label-weight` (the shipped lines in every refit's training, weighing as `blend_prior` labels;
    escalation labels' weight in the fit). `shadow_backoff`: as the policy's routing.learning.shadow_backoff (its
    `scale` the start), the shadow scale moved after each refit by the function `selfroute learn` uses
    (gateway.routing.learning.loop.shadow_scale_after: lower when the refit lost to the model in force,
    refit.refit_won), the draws made at the scale in force and each shadow label weighted by 1 / its chance then."""
    from classifier.answer_features import ANSWER_FEATURE_NAMES
    from classifier.model import RouteModel
    from classifier.verifier import label_good

    if policy.routing.verifier is None or policy.routing.verifier.threshold is None:
        raise ValueError("the simulation needs a policy with routing.verifier and its threshold")
    if share_rule not in SHARE_RULES:
        raise ValueError(f"share_rule: one of {', '.join(SHARE_RULES)}")
    if thresholds_from not in (LABELS, SCORES):
        raise ValueError(f"thresholds_from: {LABELS} or {SCORES}")
    if relative_from not in (FIXED, LABELS, OUT_OF_FOLD):
        raise ValueError(f"relative_from: {FIXED}, {LABELS} or {OUT_OF_FOLD}")
    relative_refits = relative_from in (LABELS, OUT_OF_FOLD) and policy.routing.verifier.relative is not None
    names = list(feature_names or ANSWER_FEATURE_NAMES)
    shipped_refusal = policy.routing.verifier.refusal_threshold
    rng = random.Random(seed)
    shadows = LearningSettings(
        judge=True,
        shadow_rate=shadow_rate,
        shadow_reference_tokens=shadow_reference_tokens,
        shadow_backoff=shadow_backoff,
    )
    router = Router(policy)
    shipped_check = CheapAnswerCheck(policy)
    frozen = router_strategy(router, True, shipped_check)
    order = stream_order([q.item for q in questions], seed)
    strategies = (*STRATEGIES, CONTROL) if control else STRATEGIES
    tallies = {name: Tally() for name in strategies}
    trailing = {name: Tally() for name in strategies}
    windows: list[dict[str, Any]] = []
    current = {name: Tally() for name in strategies}
    # the budget control: the shipped models (the recorded scores), its verifier threshold re-set from them alone
    # its own check: a relative threshold's window (routing.verifier.relative) sees each answer once per strategy
    control_check = CheapAnswerCheck(policy)
    control_run = router_strategy(router, True, control_check)
    control_seen: list[tuple[float, bool, RouteDecision]] = []  # its checked cheap answers: score, refused, decision
    control_history: list[Seen] = []  # the same, as its relative threshold's window saw them
    control_escalations = 0
    control_thresholds: list[dict[str, Any]] = []

    # the learning router's models and policy in force; None: the shipped ones (the recorded scores)
    verifier_now: VerifierModel | None = verifier
    learn_policy = policy
    p_cheap = [q.item.probability for q in questions]  # P(cheap) of the classifier in force
    scores: list[float] = []
    for i, q in enumerate(questions):
        if q.item.verifier_score is None:  # the docstring's precondition: thresholds need every score
            raise ValueError(f"question {i} has no verifier_score (the shipped verifier's score is needed)")
        scores.append(q.item.verifier_score)
    labelled: list[dict[str, Any]] = []  # what the ledger would hold for each labelled cheap answer
    decided: list[tuple[int, float]] = []  # questions the classifier decided (no rule): index, P(cheap) in force
    seen_cheap: list[int] = []  # questions the pre-route sent to the checked cheap route
    seen_decisions: list[RouteDecision] = []  # the learning router's decision of each
    seen_history: list[Seen] = []  # each as the learning router's relative window saw it (the score it was decided on)
    frozen_escalations = 0
    live_escalations = 0  # the learning router's, on the seen cheap-routed questions
    long_tokens_seen = 0  # of the long legs those questions would need
    long_cost_seen = 0.0  # of the long legs the frozen router would pay on the seen cheap-routed questions
    learning_cost = 0.0
    refits: list[dict[str, Any]] = []
    counts = {"escalation": 0, "shadow": 0, "flipped": 0}

    def rescore() -> None:
        nonlocal scores
        if verifier_now is not None:
            scores = verifier_now.scores(_rows_with_p(questions, p_cheap))

    if verifier is not None:
        rescore()  # the shipped verifier's own scores (the recorded ones, unless P(cheap) was filled otherwise)
    learning_router = Router(learn_policy)
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
        if control:
            outcomes[CONTROL] = control_run(item)
            shipped_decision = router.decide(item.features, item.probability)
            if shipped_check.applies(shipped_decision) and shipped_decision.route == RAG:
                control_seen.append((float(item.verifier_score or 0.0), item.rag_refused, shipped_decision))
                control_escalations += outcomes[CONTROL].route == FALLBACK
                control_history.append(
                    Seen(
                        float(item.verifier_score or 0.0),
                        item.rag_refused,
                        float(item.long_prompt_tokens),
                        outcomes[CONTROL].route == FALLBACK,
                        item.probability,
                    )
                )
        as_learning = replace(item, probability=p_cheap[index], verifier_score=scores[index])
        decision = learning_router.decide(item.features, p_cheap[index])
        if decision.rule is None and decision.probability is not None:
            decided.append((index, p_cheap[index]))
        live = router_strategy(learning_router, True, learning_check)(as_learning)
        extra: list[Leg] = []
        checked = learning_check.applies(decision) and decision.route == RAG
        if checked:
            seen_cheap.append(index)
            seen_decisions.append(decision)
            frozen_escalations += outcomes[FROZEN].route == FALLBACK
            long_cost_seen += leg_cost(shadow_leg(item), prices)
            long_tokens_seen += shadow_leg(item).prompt_tokens + shadow_leg(item).output_tokens
            live_escalations += live.route == FALLBACK
            seen_history.append(
                Seen(
                    float(scores[index]),
                    item.rag_refused,
                    float(item.long_prompt_tokens),
                    live.route == FALLBACK,
                    p_cheap[index],
                )
            )
            truth = label_good(item.rag_score, item.lc_score)
            label, weight = None, 1.0
            if live.route == FALLBACK:  # both answers exist: the judge
                extra.append(judge_leg(item))
                label = truth
                counts["escalation"] += 1
            elif live.route in (RAG, KEPT_REFUSAL) and rng.random() < (
                chance := shadow_probability(shadows, item.features.get("context_tokens"))
            ):
                extra.extend([shadow_leg(item), judge_leg(item)])
                label, weight = truth, 1.0 / chance  # as learn weighs a shadow label
                counts["shadow"] += 1
            if label is not None:
                if rng.random() < judge_noise:
                    label = 1 - label
                    counts["flipped"] += 1
                labelled.append(
                    {
                        "index": index,
                        "label": label,
                        "weight": weight,
                        "row": question.answer_row | {"pre_route_probability": float(p_cheap[index])},
                        "escalated": live.route == FALLBACK,
                        "route_row": dict(item.features) if decision.rule is None else None,
                        "p_cheap": p_cheap[index],
                    }
                )
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
            current = {name: Tally() for name in strategies}
        if control and position % refit_every == 0 and control_seen and share_rule != IN_FORCE:
            # the learning router's share rule on the control's own spend (it has no learning legs)
            n_control, n_seen = len(control_seen), max(len(seen_cheap), 1)
            if max_token_share is not None:
                share = _token_budget_share(
                    max_token_share,
                    tallies[CONTROL].tokens,
                    tallies[ALWAYS_LONG].tokens,
                    position,
                    refit_every,
                    control_escalations / n_control,
                    n_control / position,
                    long_tokens_seen / n_seen,
                )
            else:
                share = _frozen_spend_share(
                    frozen_escalations / n_seen,
                    0.0,
                    tallies[CONTROL].cost_usd - tallies[FROZEN].cost_usd,
                    long_cost_seen / n_seen,
                    refit_every * n_control / position,
                )
            threshold = threshold_for_share(
                policy, [c[0] for c in control_seen], [c[1] for c in control_seen], [c[2] for c in control_seen], share
            )
            control_policy = with_verifier_thresholds(control_check.policy, threshold, shipped_refusal)
            if relative_refits:
                stream = CheckedStream(
                    [c[0] for c in control_seen],
                    [c[1] for c in control_seen],
                    [h.long_tokens for h in control_history],
                    [c[2] for c in control_seen],
                    [None] * len(control_seen),
                )
                pick = relative_for_budget(control_policy, stream, share)
                control_policy = with_pool_and_spend(control_policy, pick.pool, pick.refusal_spend)
            control_check = CheapAnswerCheck(
                control_policy,
                windows=control_check.windows,
                history=lambda _key, limit: control_history[-limit:],
            )
            control_run = router_strategy(Router(control_policy), True, control_check)
            control_thresholds.append({"at": position, "share": share, "threshold": threshold})
        ys = [entry["label"] for entry in labelled]
        if position % refit_every or len(labelled) < min_labels or len(set(ys)) < 2:
            continue
        n_seen = max(len(seen_cheap), 1)
        target: float | None = None  # share_rule IN_FORCE: learn's default, the share the policy in force escalated
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
        elif share_rule == FROZEN_SPEND:
            # hold the frozen router's spend: its escalation share on the questions seen, less the learning legs'
            # running share, less what the learning router spent over the frozen one so far, caught up over the
            # next refit period (shares of the long legs those questions need)
            target = _frozen_spend_share(
                frozen_escalations / n_seen,
                learning_cost / long_cost_seen if long_cost_seen else 0.0,
                tallies[LEARNING].cost_usd - tallies[FROZEN].cost_usd,
                long_cost_seen / n_seen,
                refit_every * n_seen / position,
            )
        data = LabelledAnswers(
            answer_rows=[entry["row"] for entry in labelled],
            labels=ys,
            weights=[entry["weight"] for entry in labelled],
            groups=[questions[entry["index"]].item.group for entry in labelled],
            refused=[questions[entry["index"]].item.rag_refused for entry in labelled],
            escalated=[entry["escalated"] for entry in labelled],
            route_rows=[entry["route_row"] for entry in labelled],
            p_cheap=[entry["p_cheap"] for entry in labelled],
        )
        in_force = (
            verifier_now.scores(data.answer_rows)
            if verifier_now is not None
            else [scores[entry["index"]] for entry in labelled]
        )
        every_checked = None
        if thresholds_from == SCORES:
            every_checked = Checked(
                [scores[i] for i in seen_cheap], [questions[i].item.rag_refused for i in seen_cheap], seen_decisions
            )
        refit = refit_verifier(
            data,
            in_force,
            learn_policy,
            feature_names=names,
            estimator=estimator,
            folds=folds,
            seed=seed,
            share=target,
            checked=every_checked,
            min_model_labels=min_model_labels,
            blend=blend,
            blend_prior=blend_prior,
            escalation_weight=escalation_weight,
        )
        if refit.action == "model":
            verifier_now = refit.model
        if refit.thresholds is not None:
            learn_policy = with_verifier_thresholds(
                learn_policy, refit.thresholds.threshold, refit.thresholds.refusal_threshold
            )
        route = None
        settings = learn_policy.routing.classifier
        if route_model is not None and settings is not None:
            route = refit_classifier(
                data,
                data.p_cheap,
                float(settings.threshold),
                [(dict(questions[i].item.features), p) for i, p in decided],
                estimator=estimator,
                folds=folds,
                seed=seed,
                min_labels=min_route_labels,
                blend=blend,
                blend_prior=blend_prior,
            )
            if route.action == "model" and route.threshold is not None:
                classifier = settings.model_copy(update={"threshold": route.threshold})
                learn_policy = learn_policy.model_copy(
                    update={"routing": learn_policy.routing.model_copy(update={"classifier": classifier})}
                )
                p_cheap = RouteModel(route.pipeline).cheap_probabilities([dict(q.item.features) for q in questions])
        if refit.action == "model" or (route is not None and route.action == "model"):
            rescore()
        if shadows.shadow_backoff is not None:  # as `selfroute learn` writes it after this refit
            scale = shadow_scale_after(shadows.shadow_backoff, refit_won(refit, route))
            backoff = shadows.shadow_backoff.model_copy(update={"scale": scale})
            shadows = shadows.model_copy(update={"shadow_backoff": backoff})
        relative_note = None
        if relative_refits:
            at = {q: k for k, q in enumerate(seen_cheap)}
            stream = CheckedStream(
                [scores[i] for i in seen_cheap],
                [questions[i].item.rag_refused for i in seen_cheap],
                [h.long_tokens for h in seen_history],
                seen_decisions,
                [None] * len(seen_cheap),
            )
            spent = sum(h.long_tokens for h in seen_history if h.escalated) / (sum(stream.long_tokens) or 1.0)
            picked = [at[entry["index"]] for entry in labelled]
            budget = target if target is not None else spent
            if relative_from == OUT_OF_FOLD:  # as `selfroute learn` does
                held = relative_out_of_fold(
                    learn_policy, stream, picked, ys, data.weights, data.groups, budget, folds=folds, seed=seed
                )
                chosen, relative_note = (held.refit.chosen if held.write else held.refit.in_force), held.decision
            else:
                found = refit_relative(learn_policy, stream, picked, ys, data.weights, budget)
                chosen, relative_note = found.chosen, found.decision
            learn_policy = with_pool_and_spend(learn_policy, chosen.pool, chosen.refusal_spend)
        # a relative threshold's window goes on across refits, as across a live reload (new settings: a new window
        # from the answers seen, as a live reload starts one from the ledger)
        learning_router = Router(learn_policy)
        learning_check = CheapAnswerCheck(
            learn_policy, windows=learning_check.windows, history=lambda _key, limit: seen_history[-limit:]
        )
        verifier_settings = learn_policy.routing.verifier
        assert verifier_settings is not None  # with_verifier_thresholds keeps it
        refits.append(
            {
                "at": position,
                "labels": len(labelled),
                "target_share": refit.share,
                "verifier": refit.action,
                "gain_points": refit.gain_points,
                "threshold": verifier_settings.threshold,
                "refusal_threshold": verifier_settings.refusal_threshold,
                "classifier": route.action if route is not None else None,
                "classifier_labels": route.labelled if route is not None else 0,
                "classifier_threshold": settings.threshold if settings is not None else None,
                "shadow_scale": shadows.shadow_backoff.scale if shadows.shadow_backoff is not None else None,
                **(
                    {
                        "pool": verifier_settings.relative.pool,
                        "refusal_spend": verifier_settings.relative.refusal_spend,
                        "relative": relative_note,
                    }
                    if verifier_settings.relative is not None
                    else {}
                ),
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
        shadow_reference_tokens=shadow_reference_tokens,
        control_thresholds=control_thresholds,
    )


def format_simulation(result: SimulationResult, title: str) -> str:
    long_total = result.trailing[ALWAYS_LONG]
    lines = [
        f"{title}: shadow {result.shadow_rate:.0%}, judge noise {result.judge_noise:.0%}, refit every "
        f"{result.refit_every}, order seed {result.order_seed}; labels {result.labels}"
    ]
    names = result.strategies
    header = f"{'window end':>10} " + " ".join(f"{name[:22]:>24}" for name in names)
    lines.append("quality (points) / cost (USD) per window")
    lines.append(header)
    for w in result.windows:
        lines.append(
            f"{w['end']:>10} "
            + " ".join(f"{w[name]['quality']:>10.1f} / {w[name]['cost_usd']:>10.4f}" for name in names)
        )
    trailing_n = long_total["questions"]
    lines.append(f"after question {result.after} ({trailing_n} questions):")
    for name in names:
        t = result.trailing[name]
        share = t["tokens"] / long_total["tokens"] if long_total["tokens"] else float("nan")
        cost_share = t["cost_usd"] / long_total["cost_usd"] if long_total["cost_usd"] else float("nan")
        lines.append(
            f"  {name:<26} quality {t['quality']:6.2f}  cost ${t['cost_usd']:.4f} ({cost_share:.0%} of "
            f"always-long; learning legs ${t['learning_cost_usd']:.4f})  tokens {share:.0%} of always-long"
            f"  escalated {t['escalated_share']:.0%}"
        )
    return "\n".join(lines)


def _against(t: dict[str, Any], f: dict[str, Any], lg: dict[str, Any]) -> dict[str, Any]:
    token_share = t["tokens"] / lg["tokens"] if lg["tokens"] else float("nan")
    return {
        "vs_frozen_points": t["quality"] - f["quality"],
        "cost_vs_frozen": t["cost_usd"] / f["cost_usd"] if f["cost_usd"] else float("nan"),
        "beats_frozen_by_1_at_no_more_cost": t["quality"] >= f["quality"] + 1 and t["cost_usd"] <= f["cost_usd"],
        "vs_always_long_points": t["quality"] - lg["quality"],
        "token_share_of_always_long": token_share,
        "matches_always_long_at_35pct_tokens": t["quality"] >= lg["quality"] and token_share <= 0.35,
    }


def targets(result: SimulationResult) -> dict[str, Any]:
    """The issue's targets on the trailing part: learning >= frozen + 1 point at no more cost, and >= always-long
    at <= 35% of its tokens (shadow and judge legs included); with the budget control, the same for it
    (`control_...`) and the learning router's points over it."""
    t, f, lg = result.trailing[LEARNING], result.trailing[FROZEN], result.trailing[ALWAYS_LONG]
    out = _against(t, f, lg)
    if CONTROL in result.trailing:
        c = result.trailing[CONTROL]
        out |= {f"control_{k}": v for k, v in _against(c, f, lg).items()}
        out["vs_control_points"] = t["quality"] - c["quality"]
        out["cost_vs_control"] = t["cost_usd"] / c["cost_usd"] if c["cost_usd"] else float("nan")
    return out


SUMMARY_FIGURES = (
    "learning_quality",
    "frozen_quality",
    "vs_frozen_points",
    "cost_vs_frozen",
    "vs_always_long_points",
    "token_share_of_always_long",
    "learning_escalated_share",
)
CONTROL_FIGURES = (
    "control_quality",
    "control_vs_frozen_points",
    "control_cost_vs_frozen",
    "control_token_share_of_always_long",
    "vs_control_points",
    "cost_vs_control",
)


def seed_summary(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per part, the trailing figures over its runs (one per order seed): mean, min and max."""
    import statistics

    by_part: dict[str, list[dict[str, float]]] = {}
    for run in runs:
        t = run["targets"]
        control = {}
        if CONTROL in run["trailing"]:
            control = {k: t[k] for k in CONTROL_FIGURES if k in t} | {
                "control_quality": run["trailing"][CONTROL]["quality"]
            }
        by_part.setdefault(run["part"], []).append(
            control
            | {
                "learning_quality": run["trailing"][LEARNING]["quality"],
                "frozen_quality": run["trailing"][FROZEN]["quality"],
                "vs_frozen_points": t["vs_frozen_points"],
                "cost_vs_frozen": t["cost_vs_frozen"],
                "vs_always_long_points": t["vs_always_long_points"],
                "token_share_of_always_long": t["token_share_of_always_long"],
                "learning_escalated_share": run["trailing"][LEARNING]["escalated_share"],
            }
        )
    return {
        part: {
            k: {
                "mean": statistics.fmean(r[k] for r in rows),
                "min": min(r[k] for r in rows),
                "max": max(r[k] for r in rows),
            }
            for k in (*SUMMARY_FIGURES, *CONTROL_FIGURES)
            if all(k in r for r in rows)
        }
        for part, rows in by_part.items()
    }
