"""The learning loop simulated on a small paired stream whose shipped verifier ranks answers backwards: labels from
escalations and shadows, refits, learning legs paid, the live decision functions."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from classifier.features import FEATURE_NAMES
from gateway.evaluation.learning_sim import (
    ALWAYS_LONG,
    CONTROL,
    FROZEN,
    LEARNING,
    ORACLE,
    SimQuestion,
    seed_summary,
    simulate,
    stream_order,
    targets,
)
from gateway.evaluation.replay import Prices, ReplayItem
from policies.schema import ClassifierSettings, Policy, ShadowBackoff

PRICES = Prices(1.0, 2.0, 10.0, 20.0, "test")
POLICY = Policy.model_validate(
    {
        "cheap": {"model": "c"},
        "long": {"model": "l"},
        "routing": {"classifier": None, "default_route": "rag", "verifier": {"model_path": "x", "threshold": 0.5}},
    }
)


def question(i: int, good: bool, features: dict, p_cheap: float, verifier_score: float) -> ReplayItem:
    """Question i of a stream, 20 to a document: the cheap answer scores 1 or 0 against the long answer's 1."""
    return ReplayItem(
        f"d{i // 20}",
        f"d{i // 20}",
        f"q{i}",
        float(good),
        1.0,
        False,
        500,
        5000,
        5000,
        20,
        30,
        features,
        p_cheap,
        verifier_score=verifier_score,
    )


def stream(n: int = 1200, seed: int = 1) -> list[SimQuestion]:
    """The cheap answer is good when its support is high; the 'shipped' verifier scores the opposite."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        support = rng.random()
        good = rng.random() < (0.9 if support > 0.4 else 0.2)
        item = question(i, good, {"context_tokens": 5000.0}, 0.5, verifier_score=1.0 - support)
        out.append(SimQuestion(item, {"ans_support_passages": support, "ans_refusal": 0.0}))
    return out


def test_the_stream_keeps_documents_together_and_is_seeded():
    items = [q.item for q in stream(200)]
    order = stream_order(items, 3)
    assert sorted(order) == list(range(200)) and order == stream_order(items, 3) != stream_order(items, 4)
    groups = [items[i].group for i in order]
    assert sum(a != b for a, b in zip(groups, groups[1:])) == len(set(groups)) - 1  # one run per document


@pytest.mark.parametrize("noise", [0.0, 0.2])
def test_learning_recovers_from_a_backwards_verifier_at_no_more_cost(noise):
    result = simulate(
        stream(),
        POLICY,
        PRICES,
        shadow_rate=0.05,
        judge_noise=noise,
        refit_every=100,
        window=300,
        after=600,
        feature_names=["ans_support_passages", "ans_refusal"],
    )
    learn, frozen, long = (result.trailing[n] for n in (LEARNING, FROZEN, ALWAYS_LONG))
    assert learn["quality"] >= frozen["quality"] + 5
    # the spend is held to the frozen router's over the whole stream (a window can drift with its documents)
    assert result.total[LEARNING]["cost_usd"] <= 1.05 * result.total[FROZEN]["cost_usd"]
    assert learn["learning_cost_usd"] > 0 and frozen["learning_cost_usd"] == 0  # shadow and judge legs are paid
    assert result.labels["escalation"] > 0 and result.labels["shadow"] > 0 and result.refits
    assert (result.labels["flipped"] > 0) is (noise > 0)
    assert len(result.windows) == 4 and result.trailing[ORACLE]["quality"] >= learn["quality"]
    assert targets(result)["vs_frozen_points"] == pytest.approx(learn["quality"] - frozen["quality"])


def test_without_labels_the_learning_router_is_the_frozen_one_plus_its_legs():
    result = simulate(
        stream(300),
        POLICY,
        PRICES,
        shadow_rate=0.05,
        judge_noise=0.0,
        refit_every=10_000,
        window=300,
        after=0,
        feature_names=["ans_support_passages", "ans_refusal"],
    )
    learn, frozen = result.total[LEARNING], result.total[FROZEN]
    assert learn["quality"] == frozen["quality"] and learn["escalated_share"] == frozen["escalated_share"]
    assert learn["cost_usd"] == pytest.approx(frozen["cost_usd"] + learn["learning_cost_usd"])


def test_a_token_budget_lets_the_loop_escalate_where_the_shipped_router_never_does():
    """The shipped threshold 0 never escalates, so holding its spend leaves no room; a budget of always-long's tokens
    does, and the loop stays within it once it refits (within what one refit period can overshoot)."""
    never = POLICY.model_copy(deep=True)
    assert never.routing.verifier is not None
    never.routing.verifier.threshold = 0.0
    common = dict(shadow_rate=0.05, judge_noise=0.0, refit_every=100, window=300, after=600)
    names = ["ans_support_passages", "ans_refusal"]
    held = simulate(stream(), never, PRICES, feature_names=names, **common)
    budget = simulate(stream(), never, PRICES, feature_names=names, max_token_share=0.5, **common)
    assert held.trailing[FROZEN]["escalated_share"] == 0 and held.trailing[LEARNING]["escalated_share"] < 0.02
    learn, frozen, long = (budget.trailing[n] for n in (LEARNING, FROZEN, ALWAYS_LONG))
    assert learn["escalated_share"] > 0.1 and learn["quality"] >= frozen["quality"] + 5
    # after the first refits it holds the cap (a saving before them is not spent later, so the whole stream is under)
    share = budget.trailing[LEARNING]["tokens"] / budget.trailing[ALWAYS_LONG]["tokens"]
    assert 0.4 < share <= 0.53, share
    assert budget.total[LEARNING]["tokens"] / budget.total[ALWAYS_LONG]["tokens"] < share


def route_stream(n: int = 1400, seed: int = 2) -> list[SimQuestion]:
    """Goodness written in a pre-route feature (the cheap answer is good when top_score is LOW) that the shipped
    classifier reads the other way; the verifier's score and features carry nothing."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        features = {name: rng.random() for name in FEATURE_NAMES}
        good = (features["top_score"] < 0.5) if rng.random() < 0.9 else (features["top_score"] >= 0.5)
        item = question(i, good, features, SHIPPED_ROUTE.cheap_probability(features), verifier_score=rng.random())
        out.append(SimQuestion(item, {"ans_support_passages": rng.random(), "ans_refusal": 0.0}))
    return out


def shipped_route_model():
    """A pre-route model that trusts the cheap route when top_score is HIGH (backwards for route_stream)."""
    from classifier.estimators import PRE_ROUTE, build_pipeline
    from classifier.model import RouteModel
    from classifier.training import feature_matrix

    rng = random.Random(5)
    rows = [{name: rng.random() for name in FEATURE_NAMES} for _ in range(400)]
    labels = [int(r["top_score"] >= 0.5) for r in rows]
    return RouteModel(build_pipeline("logistic", PRE_ROUTE, 0).fit(feature_matrix(rows), labels))


SHIPPED_ROUTE = shipped_route_model()


def test_the_loop_refits_the_pre_route_classifier_as_learn_does():
    """With learn's minimum of labelled requests the classifier decided, the classifier is refitted (it is not with a
    minimum the stream never reaches), and the refit one sends the bad questions long up front."""
    policy = POLICY.model_copy(deep=True)
    policy.routing.classifier = ClassifierSettings(model_path="x", threshold=0.05)
    assert policy.routing.verifier is not None
    policy.routing.verifier.threshold = 0.2  # escalates a fifth: the share the classifier refit is compared at
    common = dict(shadow_rate=0.3, judge_noise=0.0, refit_every=100, window=350, after=1000, share_rule="in-force")
    names = ["ans_support_passages", "ans_refusal"]
    learned = simulate(route_stream(), policy, PRICES, feature_names=names, route_model=SHIPPED_ROUTE, **common)
    never = simulate(
        route_stream(),
        policy,
        PRICES,
        feature_names=names,
        route_model=SHIPPED_ROUTE,
        min_route_labels=10**6,
        **common,
    )
    first = next(r for r in learned.refits if r["classifier"] == "model")
    assert first["classifier_labels"] >= 200 and {r["classifier"] for r in never.refits} == {"keep"}
    assert learned.refits[-1]["classifier_threshold"] != 0.05  # the new model's threshold, keeping the long share
    assert learned.trailing[LEARNING]["quality"] >= never.trailing[LEARNING]["quality"] + 3


def test_the_loop_learns_to_escalate_refusals_that_are_wrong():
    """Refusals the shipped policy keeps (refusal threshold 0.3, every refusal's P(good) above it) but that are always
    worse than the long answer: the refits raise the refusal threshold and escalate them."""
    rng = random.Random(3)
    questions = []
    for i in range(1200):
        refused = i % 5 == 0
        item = ReplayItem(
            f"d{i // 20}",
            f"d{i // 20}",
            f"q{i}",
            0.0 if refused else 1.0,
            1.0,
            refused,
            500,
            5000,
            5000,
            20,
            30,
            {"context_tokens": 5000.0},
            0.5,
            verifier_score=0.6 + 0.3 * rng.random(),
        )
        questions.append(SimQuestion(item, {"ans_support_passages": rng.random(), "ans_refusal": 0.0}))
    policy = POLICY.model_copy(deep=True)
    assert policy.routing.verifier is not None
    policy.routing.verifier.threshold, policy.routing.verifier.refusal_threshold = 0.0, 0.3
    result = simulate(
        questions,
        policy,
        PRICES,
        shadow_rate=0.1,
        judge_noise=0.0,
        refit_every=100,
        window=300,
        after=600,
        feature_names=["ans_support_passages", "ans_refusal"],
        max_token_share=0.5,
    )
    learn, frozen = result.trailing[LEARNING], result.trailing[FROZEN]
    assert frozen["escalated_share"] == 0 and learn["escalated_share"] > 0.15
    assert result.refits[-1]["refusal_threshold"] > 0.9 and learn["quality"] >= frozen["quality"] + 15


def test_the_budget_control_spends_as_the_learning_router_may_but_without_labels():
    """Under the same token budget the control (the shipped verifier, its threshold set from the scores alone)
    escalates as much but, the verifier ranking backwards, the wrong answers: the labels are what the learning router
    gains over it. It has no learning legs; holding the frozen spend, it is the frozen router."""
    never = POLICY.model_copy(deep=True)
    assert never.routing.verifier is not None
    never.routing.verifier.threshold = 0.0
    common = dict(shadow_rate=0.05, judge_noise=0.0, refit_every=100, window=300, after=600, control=True)
    names = ["ans_support_passages", "ans_refusal"]
    budget = simulate(stream(), never, PRICES, feature_names=names, max_token_share=0.5, **common)
    learn, control, frozen, long = (budget.trailing[n] for n in (LEARNING, CONTROL, FROZEN, ALWAYS_LONG))
    assert control["learning_cost_usd"] == 0 and control["escalated_share"] > 0.3
    assert 0.4 < control["tokens"] / long["tokens"] <= 0.53  # the same cap, all of it spent on escalations
    assert control["quality"] > frozen["quality"] and learn["quality"] >= control["quality"] + 5
    assert budget.control_thresholds and budget.control_thresholds[-1]["threshold"] > 0
    met = budget.to_dict() | {"part": "s", "targets": targets(budget)}
    assert met["targets"]["vs_control_points"] == pytest.approx(learn["quality"] - control["quality"])
    summary = seed_summary([met])["s"]
    assert summary["control_quality"]["mean"] == pytest.approx(control["quality"])
    held = simulate(stream(), POLICY, PRICES, feature_names=names, **common)  # POLICY escalates about half
    control, frozen = held.total[CONTROL], held.total[FROZEN]
    assert abs(control["escalated_share"] - frozen["escalated_share"]) < 0.05
    assert control["cost_usd"] <= 1.05 * frozen["cost_usd"]
    without = simulate(stream(), POLICY, PRICES, feature_names=names, **(common | {"control": False}))
    assert CONTROL not in without.trailing and without.trailing[LEARNING] == held.trailing[LEARNING]


def test_a_reference_token_count_shadows_long_contexts_less_as_the_live_loop_does():
    """Every context here is 5,000 tokens: a reference of 1,000 shadows a fifth as often (live rule:
    gateway.routing.learning.loop.shadow_probability)."""
    names = ["ans_support_passages", "ans_refusal"]
    common = dict(shadow_rate=0.2, judge_noise=0.0, refit_every=100, window=300, after=600)
    flat = simulate(stream(), POLICY, PRICES, feature_names=names, **common)
    tied = simulate(stream(), POLICY, PRICES, feature_names=names, shadow_reference_tokens=1000, **common)
    assert 0 < tied.labels["shadow"] < flat.labels["shadow"] / 3 and tied.shadow_reference_tokens == 1000
    assert tied.total[LEARNING]["learning_cost_usd"] < flat.total[LEARNING]["learning_cost_usd"]
    same = simulate(stream(), POLICY, PRICES, feature_names=names, shadow_reference_tokens=5000, **common)
    assert same.labels == flat.labels  # at or under the reference: shadow_rate itself


def test_scores_set_a_kept_verifiers_thresholds_when_asked():
    """thresholds_from="scores": a refit that keeps the verifier sets its threshold from every checked answer's score
    for the share (refit.Checked), never from the labels, and keeps the refusal rule in force (only a refit model that
    wins out of fold brings its own); learn's way re-chooses the refusal threshold on the labels at once."""
    rng = random.Random(3)
    questions = []
    for i in range(1200):
        refused = i % 5 == 0
        item = question(i, not refused, {"context_tokens": 5000.0}, 0.5, verifier_score=0.6 + 0.3 * rng.random())
        item = replace(item, rag_refused=refused)
        questions.append(SimQuestion(item, {"ans_support_passages": rng.random(), "ans_refusal": 0.0}))
    policy = POLICY.model_copy(deep=True)
    assert policy.routing.verifier is not None
    policy.routing.verifier.threshold, policy.routing.verifier.refusal_threshold = 0.0, 0.3
    common = dict(shadow_rate=0.1, judge_noise=0.0, refit_every=100, window=300, after=600, max_token_share=0.5)
    names = ["ans_support_passages", "ans_refusal"]
    labels = simulate(questions, policy, PRICES, feature_names=names, **common)
    scores = simulate(questions, policy, PRICES, feature_names=names, thresholds_from="scores", **common)
    assert labels.refits[0]["verifier"] == "thresholds" and labels.refits[0]["refusal_threshold"] > 0.9
    refusal, before_a_model = 0.3, []
    for refit in scores.refits:
        if refit["verifier"] == "thresholds":
            assert refit["refusal_threshold"] == refusal  # the rule in force
            if refusal == 0.3:
                before_a_model.append(refit)
        refusal = refit["refusal_threshold"]
    assert before_a_model
    for refit in before_a_model:  # the shipped scores: the threshold escalates the share asked of every answer
        below = sum(q.item.verifier_score < refit["threshold"] for q in questions) / len(questions)  # type: ignore[operator]
        assert abs(below - refit["target_share"]) < 0.05 and refit["target_share"] > 0.1
    with pytest.raises(ValueError, match="thresholds_from"):
        simulate(questions, policy, PRICES, feature_names=names, thresholds_from="x", **common)


def test_a_minimum_of_labels_keeps_the_verifier_in_force_until_it_is_reached():
    """min_model_labels (learn --min-model-labels): a refit that wins out of fold puts its model in force only once
    that many labels exist; before, only the thresholds change."""
    names = ["ans_support_passages", "ans_refusal"]
    common = dict(shadow_rate=0.05, judge_noise=0.0, refit_every=100, window=300, after=600, feature_names=names)
    free = simulate(stream(), POLICY, PRICES, **common)
    first = next(r for r in free.refits if r["verifier"] == "model")
    held = simulate(stream(), POLICY, PRICES, min_model_labels=first["labels"] + 1, **common)
    assert all(r["verifier"] != "model" for r in held.refits if r["labels"] <= first["labels"])
    assert any(r["verifier"] == "model" for r in held.refits)  # once there are enough
    never = simulate(stream(), POLICY, PRICES, min_model_labels=10**6, **common)
    assert {r["verifier"] for r in never.refits} <= {"thresholds", "keep"}
    assert never.trailing[LEARNING]["quality"] < free.trailing[LEARNING]["quality"]


def test_a_blend_prior_pulls_the_refits_towards_the_shipped_lines_less_as_labels_come_in():
    """blend / blend_prior (learn --blend-shipped --blend-prior): shipped lines that say the shipped verifier's
    backwards direction, weighing as a million labels, keep every refit there; weighing as ten, the labels win."""
    from gateway.evaluation.refit import Blend

    names = ["ans_support_passages", "ans_refusal"]
    common = dict(shadow_rate=0.05, judge_noise=0.0, refit_every=100, window=300, after=600, feature_names=names)
    rng = random.Random(5)
    support = [rng.random() for _ in range(400)]
    backwards = Blend(
        route_rows=[{} for _ in support],
        answer_rows=[{"ans_support_passages": s, "ans_refusal": 0.0} for s in support],
        labels=[int(s < 0.5) for s in support],
        weights=[1.0] * len(support),
        groups=[f"shipped{i % 20}" for i in range(len(support))],
    )
    free = simulate(stream(), POLICY, PRICES, **common)
    weak = simulate(stream(), POLICY, PRICES, blend=backwards, blend_prior=10.0, **common)
    strong = simulate(stream(), POLICY, PRICES, blend=backwards, blend_prior=1e6, **common)
    assert strong.trailing[LEARNING]["quality"] < free.trailing[LEARNING]["quality"] - 5
    assert weak.trailing[LEARNING]["quality"] > strong.trailing[LEARNING]["quality"] + 5
    assert any(r["verifier"] == "model" for r in weak.refits)


def test_a_shadow_backoff_slows_shadows_where_refits_lose_and_keeps_them_while_they_win():
    """shadow_backoff (as the policy's, moved after each refit by the function `learn` uses): where the shipped
    verifier already ranks the answers right, no refit beats it and the shadows fall to min_scale of the rate, their
    legs' cost with them. Where it ranks them backwards every refit wins, and holds the rate, until one is in force
    (here from 300 labels); then, with nothing left to win, the rate falls."""
    names = ["ans_support_passages", "ans_refusal"]
    common = dict(shadow_rate=0.2, judge_noise=0.0, refit_every=100, window=300, after=600, feature_names=names)
    backoff = ShadowBackoff(factor=0.5, min_scale=0.1)
    right = [
        SimQuestion(replace(q.item, verifier_score=1.0 - float(q.item.verifier_score or 0.0)), q.answer_row)
        for q in stream()
    ]
    flat = simulate(right, POLICY, PRICES, **common)
    slowed = simulate(right, POLICY, PRICES, shadow_backoff=backoff, **common)
    assert flat.refits and all(r["gain_points"] < 0.5 for r in flat.refits)  # nothing to win against it
    assert [r["shadow_scale"] for r in slowed.refits][-1] == 0.1 and flat.refits[0]["shadow_scale"] is None
    assert slowed.labels["shadow"] < flat.labels["shadow"] / 2
    assert slowed.total[LEARNING]["learning_cost_usd"] < 0.6 * flat.total[LEARNING]["learning_cost_usd"]
    kept = simulate(stream(), POLICY, PRICES, shadow_backoff=backoff, min_model_labels=300, **common)
    in_force = next(k for k, r in enumerate(kept.refits) if r["verifier"] == "model")
    assert in_force > 2 and all(r["gain_points"] >= 0.5 and r["shadow_scale"] == 1.0 for r in kept.refits[:in_force])
    assert kept.refits[-1]["shadow_scale"] < 0.5 and kept.labels["shadow"] > 2 * slowed.labels["shadow"]
