"""Refitting the router on labelled cheap answers, written once: `selfroute learn` runs it on the ledger's labels and
the learning simulation (gateway.evaluation.learning_sim) on its stream's, so the simulation measures what learn does.

The verifier: a refit scored out of fold (folds by document group; blended shipped lines train every fold and are
never scored) against the model in force, each at its best thresholds for the same escalation share of the labelled
cheap answers (`choose_thresholds`: the verifier threshold and the refusal threshold together; every candidate's
escalations are decided by the live rule, gateway.routing.escalation.CheapAnswerCheck.verdict). The share is the one
the policy in force escalated on those answers (from what was recorded), or one asked for; the gain is averaged over
that share and COMPARISON_SHARES (a policy escalating nothing would otherwise never see a refit win). Replay quality: the
weighted share of labelled answers as good as the long route's (an escalated one is; an accepted one when its label
says so). Shadow labels stand for all accepted answers (weight 1 / shadow_rate), so weighted shares estimate the
traffic's.

Outcomes: a refit better than the model in force by MIN_GAIN_POINTS replaces it, with its thresholds; else the model
in force with re-chosen thresholds, when they beat what the policy in force did on those answers by MIN_GAIN_POINTS
(or a share was asked for); else nothing changes. Re-choosing the refusal threshold is what lets a deployment learn
whether its refusals are right (LaRA's hallu task) or usually wrong (L-Eval) without a new model.

The pre-route classifier: refitted the same way on the labelled requests it decided (no rule did) once there are
MIN_ROUTE_LABELS of them, compared at the share the policy in force sent long after their cheap answer (here sent long
up front); a better one gets the threshold that keeps the share of recorded requests the classifier in force sent
long.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.routing.decision import RouteDecision
from gateway.routing.escalation import CheapAnswerCheck
from policies.routes import Route
from policies.schema import Policy

if TYPE_CHECKING:
    from classifier.verifier import VerifierModel

MIN_GAIN_POINTS = 0.5  # replay quality gain (points) a change needs before it replaces what is in force
MIN_LABELS = 50  # fewer labelled cheap answers (or one class only): nothing is refitted
MIN_ROUTE_LABELS = 200  # labelled requests the classifier decided before it is refitted
# labelled answers before a refit may replace the verifier in force (learn / the simulation's default): on ~60 labels
# an out-of-fold win replaced the shipped verifier and cost 4-6 points on L-Eval (BENCHMARKS.md section 12)
MIN_MODEL_LABELS = 200
REFUSAL_STEPS = 8  # refusal thresholds tried: quantiles of the refused answers' P(good) in this many steps
# the verifier refit is compared with the model in force at these escalation shares too, not only at the one in
# force: a policy that escalates (almost) nothing, as the shipped default does, would otherwise never see a refit win
COMPARISON_SHARES = (0.1, 0.2, 0.3)


@dataclass
class LabelledAnswers:
    """Labelled cheap answers, as the ledger records them (gateway.routing.learning.features_record)."""

    answer_rows: list[dict[str, float]]  # the verifier's features
    labels: list[int]  # 1: the cheap answer was good enough
    weights: list[float]  # 1, or 1 / shadow_rate for a shadow label
    groups: list[str]  # the documents' group (folds by document)
    refused: list[bool]  # the cheap answer said the passages lack the answer
    escalated: list[bool]  # the policy in force escalated it
    route_rows: list[dict[str, float] | None]  # pre-route features where the classifier decided (no rule), else None
    p_cheap: list[float | None] = field(default_factory=list)  # the pre-route P(cheap) the decision was made on

    def decisions(self) -> list[RouteDecision]:
        """Each answer's decision as the check sees it (a cheap route, its features and P(cheap))."""
        p = self.p_cheap or [None] * len(self.labels)
        return [RouteDecision(Route.RAG, "", None, pi, dict(row or {})) for row, pi in zip(self.route_rows, p)]


@dataclass
class Checked:
    """Every checked cheap answer of the period, labelled or not (the ledger records them all): the model in force's
    P(good), whether it refused, its decision. With it a refit that keeps the model in force sets the thresholds for
    the share from the score distribution (threshold_for_share) instead of choosing them on the labels."""

    scores: list[float]
    refused: list[bool]
    decisions: list[RouteDecision]


@dataclass
class Blend:
    """Shipped paired lines added to every refit's training data (never scored): features for both models."""

    route_rows: list[dict]
    answer_rows: list[dict]
    labels: list[int]
    weights: list[float]
    groups: list[str]

    @classmethod
    def from_scores(
        cls,
        route_rows: list[dict],
        answer_rows: list[dict],
        rag_scores: Sequence[float],
        lc_scores: Sequence[float],
        groups: list[str],
    ) -> Blend:
        """Paired lines as a blend, labelled and weighted from their recorded RAG and long-context scores as
        `selfroute train` labels and weights them (`learn --blend-shipped` and the simulation's --sim-blend-prior)."""
        from classifier.training import label_from_scores
        from classifier.verifier import choice_weights

        rag = [float(r) for r in rag_scores]
        lc = [float(c) for c in lc_scores]
        return cls(
            route_rows=route_rows,
            answer_rows=answer_rows,
            labels=[label_from_scores(r, c) for r, c in zip(rag, lc)],
            weights=[float(w) for w in choice_weights(rag, lc)],
            groups=groups,
        )


@dataclass
class Thresholds:
    threshold: float  # escalate when P(good) < this
    refusal_threshold: float | None  # a refusal escalates when P(good) < this (None: the threshold alone)
    quality: float  # replay quality (points) of these thresholds on the labelled answers
    share: float  # the weighted share of the labelled answers they escalate


@dataclass
class VerifierRefit:
    action: str  # "model" (a new verifier and its thresholds), "thresholds" (new thresholds only) or "keep"
    decision: str
    share: float  # the escalation share the comparison and the new thresholds hold
    quality_recorded: float  # what the policy in force did on the labelled answers
    quality_in_force: float  # the model in force at its best thresholds for `share`
    quality_refit: float  # the refit, out of fold, at its best thresholds for `share`
    thresholds: Thresholds | None = None  # to write (action model or thresholds)
    model: VerifierModel | None = None  # to write (action model)
    gain_points: float = 0.0  # the refit's gain over the model in force, averaged over `share` and COMPARISON_SHARES


@dataclass
class ClassifierRefit:
    action: str  # "model" or "keep"
    decision: str
    labelled: int
    long_share: float = 0.0
    quality_in_force: float | None = None
    quality_refit: float | None = None
    threshold: float | None = None
    long_before: float = 0.0  # the share of recorded decided requests the classifier in force sent long
    pipeline: Any = None


def weighted_quality(escalated: Sequence[bool], labels: Sequence[int], weights: Sequence[float]) -> float:
    """Points: an escalated answer is as good as the long route's, an accepted one when its label says so."""
    total = sum(weights)
    good = sum(w * (1.0 if e else float(y)) for e, y, w in zip(escalated, labels, weights))
    return 100.0 * good / total if total else 0.0


def replay_quality(scores, labels, weights, share: float) -> float:
    """Points: escalate the `share` least-trusted (weighted), the rest stand on their labels."""
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    total = sum(weights)
    budget, good = share * total, 0.0
    for i in order:
        if budget > 0:
            budget -= weights[i]
            good += weights[i]  # escalated: as good as long
        else:
            good += weights[i] * labels[i]
    return 100.0 * good / total if total else 0.0


def with_verifier_thresholds(policy: Policy, threshold: float, refusal_threshold: float | None) -> Policy:
    if policy.routing.verifier is None:
        raise ValueError("the policy has no routing.verifier")
    verifier = policy.routing.verifier.model_copy(
        update={"threshold": float(threshold), "refusal_threshold": refusal_threshold}
    )
    return policy.model_copy(update={"routing": policy.routing.model_copy(update={"verifier": verifier})})


def escalations(
    policy: Policy, scores: Sequence[float], refused: Sequence[bool], decisions: Sequence[RouteDecision]
) -> list[bool]:
    """Which answers the policy's check escalates, by the live rule."""
    check = CheapAnswerCheck(policy)
    return [check.verdict(d, bool(r), float(s)).escalate for s, r, d in zip(scores, refused, decisions)]


def refusal_candidates(policy: Policy, scores: Sequence[float], refused: Sequence[bool]) -> list[float | None]:
    """The refusal thresholds to try, the one in force first: the policy's rule off (None) stays off; otherwise 0
    (refusals left to the threshold), quantiles of the refused answers' P(good) and 1 (every refusal escalates,
    Self-Route's rule); only the one in force without a labelled refusal."""
    settings = policy.routing.verifier
    if settings is None or settings.refusal_threshold is None:
        return [None]
    in_force = float(settings.refusal_threshold)
    refused_scores = sorted(float(s) for s, r in zip(scores, refused) if r and not math.isnan(float(s)))
    if not refused_scores:
        return [in_force]  # no labelled refusal: nothing says the rule in force is wrong
    picks = {0.0, 1.0}
    for k in range(1, REFUSAL_STEPS):
        # just above the k-th quantile: that share of refusals escalates
        picks.add(math.nextafter(refused_scores[int(k * len(refused_scores) / REFUSAL_STEPS)], math.inf))
    return [in_force, *sorted(picks - {in_force})]  # the one in force first: it stays on a tie


def _threshold_for_weighted_share(scores, weights, budget: float) -> float:
    """The threshold that escalates (score < threshold) the least-trusted answers up to `budget` weight."""
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    spent, last = 0.0, None
    for position, i in enumerate(order):
        if spent + weights[i] > budget + 1e-9:
            if last is None:
                return 0.0
            return (scores[last] + scores[i]) / 2 if scores[i] > scores[last] else scores[last]
        spent += weights[i]
        last = i
        if position == len(order) - 1:
            return math.nextafter(float(scores[i]), math.inf)
    return 0.0


def threshold_for_share(
    policy: Policy, scores: Sequence[float], refused: Sequence[bool], decisions: Sequence[RouteDecision], share: float
) -> float:
    """No labels: the verifier threshold that escalates `share` of these answers under the policy's refusal rule (the
    refusals it escalates spend first), by the live rule; 0 when the refusals alone spend it. The simulation's
    budget control (the learning router's budget rule without its labels) sets its threshold so."""
    by_refusal = escalations(
        with_verifier_thresholds(policy, 0.0, _refusal_in_force(policy)), scores, refused, decisions
    )
    rest = [i for i, e in enumerate(by_refusal) if not e]
    budget = share * len(scores) - sum(by_refusal)
    if budget <= 0 or not rest:
        return 0.0
    return _threshold_for_weighted_share([scores[i] for i in rest], [1.0] * len(rest), budget)


def _refusal_in_force(policy: Policy) -> float | None:
    settings = policy.routing.verifier
    return None if settings is None or settings.refusal_threshold is None else float(settings.refusal_threshold)


def choose_thresholds(policy: Policy, scores: Sequence[float], data: LabelledAnswers, share: float) -> Thresholds:
    """The verifier and refusal thresholds that give the best replay quality on the labelled answers while escalating
    at most `share` of them (weighted): for each refusal threshold, the verifier threshold spends what the refusals
    leave. When every refusal threshold alone spends more than `share`, the one that spends least."""
    decisions = data.decisions()
    total = sum(data.weights) or 1.0
    best: Thresholds | None = None
    fallback: Thresholds | None = None
    for refusal in refusal_candidates(policy, scores, data.refused):
        by_refusal = escalations(with_verifier_thresholds(policy, 0.0, refusal), scores, data.refused, decisions)
        spent = sum(w for e, w in zip(by_refusal, data.weights) if e)
        rest = [i for i, e in enumerate(by_refusal) if not e]
        threshold = 0.0
        if spent < share * total and rest:
            threshold = _threshold_for_weighted_share(
                [scores[i] for i in rest], [data.weights[i] for i in rest], share * total - spent
            )
        escalated = escalations(with_verifier_thresholds(policy, threshold, refusal), scores, data.refused, decisions)
        pick = Thresholds(
            threshold,
            refusal,
            weighted_quality(escalated, data.labels, data.weights),
            sum(w for e, w in zip(escalated, data.weights) if e) / total,
        )
        if spent > share * total + 1e-9:
            if fallback is None or pick.share < fallback.share:
                fallback = pick
            continue
        if best is None or (pick.quality, -pick.share) > (best.quality, -best.share):
            best = pick
    chosen = best or fallback
    assert chosen is not None  # refusal_candidates is never empty
    return chosen


def fit_weights(data: LabelledAnswers, escalation_weight: float = 1.0) -> list[float]:
    """The labels' weights in a refit's training (not in its replay, which estimates the traffic's quality): an
    escalation label times `escalation_weight` (they exist only for answers the check distrusted, a biased sample;
    shadow labels are drawn at random)."""
    return [w * (escalation_weight if e else 1.0) for w, e in zip(data.weights, data.escalated)]


def _blended(
    rows,
    data: LabelledAnswers,
    blend: Blend | None,
    blend_rows,
    blend_weight: float,
    blend_prior: float | None = None,
    escalation_weight: float = 1.0,
):
    """(rows, labels, groups, weights, n): the labelled answers first, then any blended shipped lines."""
    weights = fit_weights(data, escalation_weight)
    if blend is None:
        return list(rows), list(data.labels), list(data.groups), weights, len(rows)
    # the shipped lines together weigh blend_weight times the ledger labels, in their own proportions; with
    # blend_prior, as that many labelled answers whatever the ledger holds: a prior towards the shipped data whose
    # pull shrinks as labels come in
    total = blend_prior if blend_prior is not None else blend_weight * sum(data.weights)
    scale = total / (sum(blend.weights) or 1.0)
    return (
        [*rows, *blend_rows],
        [*data.labels, *blend.labels],
        [*data.groups, *(f"shipped:{g}" for g in blend.groups)],
        [*weights, *(w * scale for w in blend.weights)],
        len(rows),
    )


def _splits(labels, groups, n: int, folds: int, seed: int):
    """Grouped folds over the first n (the labelled answers); every fold also trains on all of the blended lines."""
    import numpy as np

    from classifier.training import grouped_folds

    shipped = np.arange(n, len(labels))
    ledger_folds = grouped_folds(labels[:n], groups[:n], min(folds, len(set(groups[:n]))), seed)
    return [(np.concatenate([train, shipped]), test) for train, test in ledger_folds]


def refit_verifier(
    data: LabelledAnswers,
    in_force_scores: Sequence[float],
    policy: Policy,
    *,
    feature_names: Sequence[str],
    estimator: Any = "logistic",
    folds: int = 5,
    seed: int = 0,
    share: float | None = None,
    blend: Blend | None = None,
    blend_weight: float = 1.0,
    card: dict[str, Any] | None = None,
    checked: Checked | None = None,
    min_model_labels: int = 0,
    blend_prior: float | None = None,
    escalation_weight: float = 1.0,
) -> VerifierRefit:
    """The verifier's refit against the model in force (`in_force_scores`: its P(good) of the labelled answers).
    `min_model_labels`: with fewer labelled answers a refit never replaces the model in force, however it compares
    (on a few dozen labels an out-of-fold win is often noise); only the thresholds may change. `blend_prior`: the
    blended shipped lines weigh as that many labelled answers (else `blend_weight` times the labels);
    `escalation_weight`: escalation labels' weight in the fit (fit_weights)."""
    import numpy as np

    from classifier.verifier import Split, classification_metrics, new_verifier, protocol_scores

    rows, labels, groups, weights, n = _blended(
        data.answer_rows,
        data,
        blend,
        blend.answer_rows if blend else None,
        blend_weight,
        blend_prior,
        escalation_weight,
    )
    splits = [Split(train, test, "fold") for train, test in _splits(labels, groups, n, folds, seed)]
    y = np.asarray(labels)
    oof = [
        float(s)
        for s in protocol_scores(
            rows, y, splits, estimator=estimator, seed=seed, feature_names=feature_names, sample_weight=weights
        )[:n]
    ]
    total = sum(data.weights) or 1.0
    recorded_share = sum(w for e, w in zip(data.escalated, data.weights) if e) / total
    target = recorded_share if share is None else min(1.0, max(0.0, share))
    recorded = weighted_quality(data.escalated, data.labels, data.weights)
    now = choose_thresholds(policy, list(in_force_scores), data, target)
    new = choose_thresholds(policy, oof, data, target)
    gains = [new.quality - now.quality]
    for other in COMPARISON_SHARES:
        if abs(other - target) > 1e-9:
            gains.append(
                choose_thresholds(policy, oof, data, other).quality
                - choose_thresholds(policy, list(in_force_scores), data, other).quality
            )
    out = VerifierRefit("keep", "", target, recorded, now.quality, new.quality, gain_points=sum(gains) / len(gains))
    # why a refit stays out of force, for the decision text
    short = (
        f"the refit gains {out.gain_points:+.2f} points but has {n} labels, < {min_model_labels}"
        if out.gain_points >= MIN_GAIN_POINTS
        else f"the refit gains {out.gain_points:+.2f} points, < {MIN_GAIN_POINTS}"
    )
    if out.gain_points >= MIN_GAIN_POINTS and n >= min_model_labels:
        model = new_verifier(estimator, feature_names, seed)
        model.fit(rows, y, weights)
        metrics = classification_metrics(y[:n], oof)
        model.card = {
            "predicts": "P(the cheap route's answer is good enough), from deployment labels",
            "estimator": estimator,
            "feature_names": list(feature_names),
            "cv_metrics_grouped": {**metrics, "n_groups": len(set(groups[:n])), "seed": seed},
            "threshold": new.threshold,
            "refusal_threshold": new.refusal_threshold,
            "threshold_source": f"refit: the best thresholds escalating {target:.1%} out of fold",
            **(card or {}),
        }
        out.action, out.thresholds, out.model = "model", new, model
        out.decision = f"refit is better by {new.quality - now.quality:+.2f} points"
    elif share is not None and checked is not None:
        # no better model: the labels choose no thresholds either (chosen on the same few labels they would fit their
        # noise); the share is held on every checked answer's P(good), the refusal rule in force kept
        refusal = _refusal_in_force(policy)
        threshold = threshold_for_share(policy, checked.scores, checked.refused, checked.decisions, target)
        pick = with_verifier_thresholds(policy, threshold, refusal)
        escalated = escalations(pick, in_force_scores, data.refused, data.decisions())
        out.action = "thresholds"
        out.thresholds = Thresholds(
            threshold,
            refusal,
            weighted_quality(escalated, data.labels, data.weights),
            sum(w for e, w in zip(escalated, data.weights) if e) / total,
        )
        out.decision = (
            f"kept the verifier in force ({short}); its threshold for {target:.1%} of the checked answers from their "
            "scores"
        )
    elif share is not None or now.quality >= recorded + MIN_GAIN_POINTS:
        out.action, out.thresholds = "thresholds", now
        out.decision = (
            f"kept the verifier in force ({short}); new thresholds: {now.quality:.2f} vs {recorded:.2f} points as "
            "recorded"
        )
    else:
        out.decision = f"kept the verifier in force ({short}), its re-chosen thresholds {now.quality - recorded:+.2f}"
    return out


def refit_won(verifier: VerifierRefit, classifier: ClassifierRefit | None = None) -> bool:
    """Whether a refit beat the model in force out of fold (what the shadow rate follows: routing.learning.
    shadow_backoff): the verifier's gain reached MIN_GAIN_POINTS, whether or not it had the labels to go into force
    (below --min-model-labels a win says more labels would pay), or the classifier's refit was better."""
    return verifier.gain_points >= MIN_GAIN_POINTS or (classifier is not None and classifier.action == "model")


def _route_fit_predict(estimator, seed: int, x_train, y_train, w_train, x_test):
    """A pre-route pipeline (classifier.estimators, the shipped model's settings) fitted with the labels' weights."""
    import numpy as np

    from classifier.estimators import PRE_ROUTE, build_pipeline

    if len(set(y_train.tolist())) < 2:
        return None, np.full(len(x_test), float(y_train[0]) if len(y_train) else 0.5)
    pipeline = build_pipeline(estimator, PRE_ROUTE, seed).fit(x_train, y_train, model__sample_weight=w_train)
    return pipeline, pipeline.predict_proba(x_test)[:, list(pipeline.classes_).index(1)]


def refit_classifier(
    data: LabelledAnswers,
    in_force_p: Sequence[float | None],
    threshold: float,
    decided: Sequence[tuple[dict[str, float], float]],
    *,
    estimator: Any = "logistic",
    folds: int = 5,
    seed: int = 0,
    min_labels: int = MIN_ROUTE_LABELS,
    blend: Blend | None = None,
    blend_weight: float = 1.0,
    blend_prior: float | None = None,
) -> ClassifierRefit:
    """The pre-route classifier's refit on the labelled answers it decided (`data.route_rows` not None;
    `in_force_p`: the model in force's P(cheap) of each answer); `decided`: every recorded request it decided (its
    features and the P(cheap) in force), for the new threshold."""
    import numpy as np

    from classifier.training import feature_matrix

    keep = [i for i, r in enumerate(data.route_rows) if r]
    if len(keep) < min_labels or len({data.labels[i] for i in keep}) < 2:
        return ClassifierRefit(
            "keep",
            f"not refitted: {len(keep)} labelled requests the classifier decided (need {min_labels}, both good and "
            "not)",
            len(keep),
        )
    sub = LabelledAnswers(
        [data.answer_rows[i] for i in keep],
        [data.labels[i] for i in keep],
        [data.weights[i] for i in keep],
        [data.groups[i] for i in keep],
        [data.refused[i] for i in keep],
        [data.escalated[i] for i in keep],
        [data.route_rows[i] for i in keep],
    )
    route_rows = [r for r in sub.route_rows if r is not None]
    rows, labels, groups, weights, n = _blended(
        route_rows, sub, blend, blend.route_rows if blend else None, blend_weight, blend_prior
    )
    x, y, w = feature_matrix(rows), np.asarray(labels, dtype=int), np.asarray(weights, dtype=float)
    oof = np.zeros(n)
    for train, test in _splits(labels, groups, n, folds, seed):
        oof[test] = _route_fit_predict(estimator, seed, x[train], y[train], w[train], x[test])[1]
    current = [0.5 if (pi := in_force_p[i]) is None else float(pi) for i in keep]
    # the share of these answers the policy in force sent long after they were seen, now sent long up front
    share = sum(wi for e, wi in zip(sub.escalated, sub.weights) if e) / (sum(sub.weights) or 1.0)
    q_now, q_new = (replay_quality(list(s), sub.labels, sub.weights, share) for s in (current, oof))
    out = ClassifierRefit("keep", "", len(keep), share, q_now, q_new)
    if q_new < q_now + MIN_GAIN_POINTS:
        out.decision = (
            f"kept the classifier in force: the refit gains {q_new - q_now:+.2f} points (< {MIN_GAIN_POINTS})"
        )
        return out
    pipeline, _ = _route_fit_predict(estimator, seed, x, y, w, x[:1])
    # the new threshold keeps the share of recorded requests the classifier in force sent long
    new_threshold = float(threshold)  # nothing it decided recorded: the one in force
    if decided:
        from classifier.verifier import threshold_for_escalation_share

        out.long_before = sum(1 for _, p in decided if p < threshold) / len(decided)
        scores = pipeline.predict_proba(feature_matrix([r for r, _ in decided]))[:, list(pipeline.classes_).index(1)]
        new_threshold = float(threshold_for_escalation_share([float(p) for p in scores], out.long_before))
    out.action, out.threshold, out.pipeline = "model", new_threshold, pipeline
    out.decision = f"refit is better by {q_new - q_now:+.2f} points"
    return out
