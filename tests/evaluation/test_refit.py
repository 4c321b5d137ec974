"""The refit learn and the learning simulation share (gateway.evaluation.refit): thresholds chosen by the live rule."""

from __future__ import annotations

import random

import pytest

from gateway.evaluation.refit import (
    Blend,
    LabelledAnswers,
    _blended,
    choose_thresholds,
    fit_weights,
    refit_verifier,
)
from policies.schema import Policy

POLICY = Policy.model_validate(
    {
        "cheap": {"model": "c"},
        "long": {"model": "l"},
        "routing": {
            "classifier": None,
            "default_route": "rag",
            "verifier": {"model_path": "x", "threshold": 0.3, "refusal_threshold": 0.0},
        },
    }
)


def answers(n: int = 200) -> tuple[LabelledAnswers, list[float]]:
    """Every fourth answer a refusal, always worse than the long answer; the others good. The verifier's features
    are all the same (a refit can learn nothing); the scores in force are random."""
    rng = random.Random(0)
    refused = [i % 4 == 0 for i in range(n)]
    scores = [rng.random() for _ in range(n)]
    data = LabelledAnswers(
        answer_rows=[{"ans_support_passages": 0.5} for _ in range(n)],
        labels=[0 if r else 1 for r in refused],
        weights=[1.0] * n,
        groups=[f"g{i % 10}" for i in range(n)],
        refused=refused,
        escalated=[s < 0.3 for s in scores],  # what the policy in force did: its threshold alone
        route_rows=[None] * n,
    )
    return data, scores


def test_the_thresholds_move_the_escalations_to_the_wrong_refusals():
    data, scores = answers()
    pick = choose_thresholds(POLICY, scores, data, 0.3)
    assert pick.refusal_threshold is not None and pick.refusal_threshold >= 1.0  # every refusal escalates
    assert pick.share <= 0.3 + 1e-9 and pick.quality == 100.0


def test_without_a_better_refit_learn_writes_new_thresholds_for_the_model_in_force():
    data, scores = answers()
    refit = refit_verifier(data, scores, POLICY, feature_names=["ans_support_passages"])
    assert refit.action == "thresholds" and refit.model is None and refit.gain_points < 0.5
    assert refit.thresholds is not None and refit.thresholds.refusal_threshold == 1.0
    assert refit.quality_in_force == 100.0 and refit.quality_recorded < 85


def test_without_labels_the_threshold_holds_a_share_refusals_spending_first():
    from gateway.evaluation.refit import escalations, threshold_for_share, with_verifier_thresholds

    data, scores = answers()
    decisions = data.decisions()
    with_refusals = with_verifier_thresholds(POLICY, 0.3, 1.0)  # every refusal escalates: a quarter
    for share in (0.1, 0.4, 0.6):
        threshold = threshold_for_share(with_refusals, scores, data.refused, decisions, share)
        escalated = escalations(
            with_verifier_thresholds(with_refusals, threshold, 1.0), scores, data.refused, decisions
        )
        assert sum(escalated) == (50 if share < 0.25 else round(share * len(scores)))  # the refusals alone: 50
        assert all(e for e, r in zip(escalated, data.refused) if r)
    # the policy's own refusal rule off (0): the threshold alone spends the share
    threshold = threshold_for_share(POLICY, scores, data.refused, decisions, 0.3)
    assert sum(escalations(with_verifier_thresholds(POLICY, threshold, 0.0), scores, data.refused, decisions)) == 60


def test_with_every_checked_answer_a_kept_verifier_takes_the_scores_threshold_for_the_share():
    from gateway.evaluation.refit import Checked, threshold_for_share

    data, scores = answers()
    policy = POLICY.model_copy(deep=True)
    assert policy.routing.verifier is not None
    policy.routing.verifier.refusal_threshold = 0.2
    rng = random.Random(1)
    every = Checked([rng.random() for _ in range(1000)], [i % 4 == 0 for i in range(1000)], data.decisions() * 5)
    refit = refit_verifier(data, scores, policy, feature_names=["ans_support_passages"], share=0.3, checked=every)
    assert refit.action == "thresholds" and refit.thresholds is not None
    assert refit.thresholds.refusal_threshold == 0.2  # the labels would escalate every refusal (1.0): not asked
    assert refit.thresholds.threshold == threshold_for_share(policy, every.scores, every.refused, every.decisions, 0.3)
    labels = refit_verifier(data, scores, policy, feature_names=["ans_support_passages"], share=0.3)
    assert labels.thresholds is not None and labels.thresholds.refusal_threshold == 1.0


def opposed(n: int = 200) -> LabelledAnswers:
    """Shadow labels (weight 5, accepted answers) good when the feature is high; escalation labels (weight 1) the
    other way round: the biased sample the check picked."""
    rng = random.Random(1)
    xs = [rng.random() for _ in range(n)]
    escalated = [i % 2 == 0 for i in range(n)]
    return LabelledAnswers(
        answer_rows=[{"ans_support_passages": x} for x in xs],
        labels=[int((x > 0.5) != e) for x, e in zip(xs, escalated)],
        weights=[1.0 if e else 5.0 for e in escalated],
        groups=[f"g{i % 10}" for i in range(n)],
        refused=[False] * n,
        escalated=escalated,
        route_rows=[None] * n,
    )


def direction(refit) -> float:
    """The refitted verifier's P(good) at a high feature minus at a low one."""
    high, low = refit.model.scores([{"ans_support_passages": 0.9}, {"ans_support_passages": 0.1}])
    return high - low


def test_escalation_labels_weigh_in_the_fit_only():
    data = opposed()
    weights = fit_weights(data, 0.0)
    assert [w for w, e in zip(weights, data.escalated) if e] == [0.0] * 100
    assert [w for w, e in zip(weights, data.escalated) if not e] == [5.0] * 100
    flat = [0.5] * len(data.labels)  # the model in force ranks nothing: any refit that ranks wins
    alone = refit_verifier(data, flat, POLICY, feature_names=["ans_support_passages"], share=0.3, escalation_weight=0)
    both = refit_verifier(data, flat, POLICY, feature_names=["ans_support_passages"], share=0.3, escalation_weight=5)
    assert alone.action == "model" and direction(alone) > 0.5  # the shadows' direction, unmixed
    assert direction(both) < direction(alone) - 0.2  # the escalations' opposite direction pulls it back
    assert alone.quality_recorded == both.quality_recorded  # the replay's weights stay the labels' own


def shipped_lines(n: int = 400) -> Blend:
    """Shipped lines good when the feature is low: the opposite of opposed()'s shadow labels."""
    xs = [i / n for i in range(n)]
    return Blend(
        route_rows=[{} for _ in xs],
        answer_rows=[{"ans_support_passages": x} for x in xs],
        labels=[int(x < 0.5) for x in xs],
        weights=[1.0] * n,
        groups=[f"s{i % 20}" for i in range(n)],
    )


def test_a_blend_prior_weighs_as_that_many_labels_whatever_the_ledger_holds():
    data, blend = opposed(), shipped_lines()
    for prior in (10.0, 5000.0):
        weights, n = _blended(data.answer_rows, data, blend, blend.answer_rows, 1.0, prior)[3:]
        assert sum(weights[n:]) == pytest.approx(prior) and weights[:n] == data.weights
    names, flat = ["ans_support_passages"], [0.5] * len(data.labels)
    weak = refit_verifier(data, flat, POLICY, feature_names=names, share=0.3, blend=blend, blend_prior=10.0)
    strong = refit_verifier(data, flat, POLICY, feature_names=names, share=0.3, blend=blend, blend_prior=1e5)
    assert weak.action == "model" and direction(weak) > 0.3  # ten labels' worth: the ledger's direction
    assert strong.quality_refit < weak.quality_refit  # the shipped lines' direction out of fold: worse here
