"""Choosing the relative verifier threshold's pool and refusal_spend on labels (gateway.evaluation.relative_refit),
replayed by the live rule, and the learning simulation re-choosing them at each refit."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from gateway.evaluation.learning_sim import ALWAYS_LONG, CONTROL, LEARNING, SimQuestion, simulate
from gateway.evaluation.relative_refit import (
    CheckedStream,
    refit_relative,
    relative_escalations,
    relative_for_budget,
    with_pool_and_spend,
)
from gateway.evaluation.replay import Prices, ReplayItem
from gateway.routing.decision import RouteDecision
from policies.routes import Route
from policies.schema import Policy

PRICES = Prices(1.0, 2.0, 10.0, 20.0, "test")
POLICY = Policy.model_validate(
    {
        "cheap": {"model": "c"},
        "long": {"model": "l"},
        "routing": {
            "classifier": None,
            "default_route": "rag",
            "verifier": {
                "model_path": "x",
                "threshold": 0.0,
                "refusal_threshold": 0.0,
                "relative": {"refusal_spend": 0.9, "pool": 1.5, "window": 200, "warm_up": 20},
            },
        },
    }
)


def answers(n: int, bad_share: float, seed: int = 0) -> tuple[CheckedStream, list[int]]:
    """n checked answers, a tenth of them refusals; a bad answer scores low (the verifier ranks well)."""
    rng = random.Random(seed)
    scores, refused, labels = [], [], []
    for i in range(n):
        bad = rng.random() < bad_share
        labels.append(0 if bad else 1)
        scores.append(rng.random() * 0.5 if bad else 0.3 + 0.7 * rng.random())
        refused.append(i % 10 == 0)
    decision = RouteDecision(Route.RAG, "", None, None, {})
    return CheckedStream(scores, refused, [1000.0] * n, [decision] * n, [None] * n), labels


def test_the_labels_buy_a_wider_pool_where_the_cheap_answers_are_often_wrong():
    stream, labels = answers(600, 0.3)
    every = list(range(len(labels)))
    in_force = relative_escalations(POLICY, stream)
    assert 0.05 < sum(in_force) / len(in_force) < 0.12  # about 0.9 x the refusals' spend
    found = refit_relative(POLICY, stream, every, labels, [1.0] * len(labels), max_token_share=0.35)
    assert found.changed and found.chosen.token_share <= 0.35
    assert found.chosen.quality >= found.in_force.quality + 5
    assert (found.in_force.pool, found.in_force.refusal_spend) == (1.5, 0.9)
    # what it chose escalates, by the live rule, the share it reports
    chosen = relative_escalations(with_pool_and_spend(POLICY, found.chosen.pool, found.chosen.refusal_spend), stream)
    assert sum(chosen) / len(chosen) == pytest.approx(found.chosen.token_share)
    tight = refit_relative(POLICY, stream, every, labels, [1.0] * len(labels), max_token_share=0.06)
    assert tight.changed and tight.chosen.token_share <= 0.06  # the one in force is over this budget


def test_a_tie_on_the_labels_is_a_saving():
    """Every cheap answer good: no escalation gains a point, so the cheapest candidate as good replaces the one in
    force (the old refit gave a tie and a cheap win the same verdict)."""
    stream, _ = answers(600, 0.3)
    labels = [1] * 600
    found = refit_relative(POLICY, stream, list(range(600)), labels, [1.0] * 600, max_token_share=0.35)
    assert found.changed and found.chosen.token_share < found.in_force.token_share
    assert found.chosen.quality == found.in_force.quality == 100.0
    # with no label on the answers it would drop (labels only on a few good ones), nothing says they were good
    some = refit_relative(POLICY, stream, [0, 1, 2], [1, 0, 1], [1.0] * 3, max_token_share=0.35)
    assert some.chosen.token_share <= 0.35


def test_without_labels_the_budget_alone_sets_the_spend():
    stream, _ = answers(600, 0.3)
    pick = relative_for_budget(POLICY, stream, 0.2)
    assert 0.1 < pick.token_share <= 0.2
    assert relative_for_budget(POLICY, stream, 0.0).token_share == min(
        relative_for_budget(POLICY, stream, 0.0).token_share, 0.05
    )


def _question(i: int, good: bool, score: float, refused: bool) -> SimQuestion:
    item = ReplayItem(
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
        {"context_tokens": 5000.0},
        0.5,
        verifier_score=score,
    )
    return SimQuestion(replace(item, rag_refused=refused), {"ans_support_passages": score, "ans_refusal": 0.0})


def test_the_loop_re_chooses_the_relative_rule_on_its_labels():
    """Under a token budget, with cheap answers often wrong, the labels widen the relative rule and gain over the
    loop that leaves it fixed (whose refits only move the fixed thresholds, which decide the warm-up alone); the
    control widens it for its budget alone."""
    rng = random.Random(5)
    questions = []
    for i in range(1200):
        bad = rng.random() < 0.3
        score = rng.random() * 0.5 if bad else 0.3 + 0.7 * rng.random()
        questions.append(_question(i, not bad, score, i % 10 == 0))
    common = dict(
        shadow_rate=0.1, judge_noise=0.0, refit_every=100, window=300, after=600, max_token_share=0.35, control=True
    )
    names = ["ans_support_passages", "ans_refusal"]
    fixed = simulate(questions, POLICY, PRICES, feature_names=names, min_model_labels=10_000, **common)
    chosen = simulate(
        questions, POLICY, PRICES, feature_names=names, min_model_labels=10_000, relative_from="labels", **common
    )
    assert all(r["pool"] == 1.5 and r["refusal_spend"] == 0.9 for r in fixed.refits)
    assert any((r["pool"], r["refusal_spend"]) != (1.5, 0.9) for r in chosen.refits)
    learn, control = chosen.trailing[LEARNING], chosen.trailing[CONTROL]
    # the shadows' tokens leave the learning router less of the budget than the control
    assert learn["quality"] > fixed.trailing[LEARNING]["quality"] + 1
    assert learn["tokens"] <= 0.36 * chosen.trailing[ALWAYS_LONG]["tokens"]
    assert control["quality"] > fixed.trailing[CONTROL]["quality"]
    with pytest.raises(ValueError, match="relative_from"):
        simulate(questions, POLICY, PRICES, feature_names=names, relative_from="x", **common)


def test_the_loop_puts_a_relative_choice_in_force_only_when_it_holds_out_of_fold():
    """relative_from="out-of-fold" (what `selfroute learn` does): the same stream as above widens the rule where the
    choice holds out of fold (each document's labels spread the same signal), and a refit whose pick does not hold
    keeps the one in force; each refit says which."""
    rng = random.Random(5)
    questions = []
    for i in range(1200):
        bad = rng.random() < 0.3
        score = rng.random() * 0.5 if bad else 0.3 + 0.7 * rng.random()
        questions.append(_question(i, not bad, score, i % 10 == 0))
    common = dict(shadow_rate=0.1, judge_noise=0.0, refit_every=100, window=300, after=600, max_token_share=0.35)
    names = ["ans_support_passages", "ans_refusal"]
    fixed = simulate(questions, POLICY, PRICES, feature_names=names, min_model_labels=10_000, **common)
    held = simulate(
        questions, POLICY, PRICES, feature_names=names, min_model_labels=10_000, relative_from="out-of-fold", **common
    )
    notes = [r["relative"] for r in held.refits]
    assert any("out of fold" in n and not n.startswith("kept") for n in notes), notes
    assert any((r["pool"], r["refusal_spend"]) != (1.5, 0.9) for r in held.refits)
    assert held.trailing[LEARNING]["quality"] > fixed.trailing[LEARNING]["quality"] + 1
    assert held.trailing[LEARNING]["tokens"] <= 0.36 * held.trailing[ALWAYS_LONG]["tokens"]
