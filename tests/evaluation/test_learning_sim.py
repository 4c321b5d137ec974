"""The learning loop simulated on a small paired stream whose shipped verifier ranks answers backwards: labels from
escalations and shadows, refits, learning legs paid, the live decision functions."""

from __future__ import annotations

import random

import pytest

from gateway.evaluation.learning_sim import (
    ALWAYS_LONG,
    FROZEN,
    LEARNING,
    ORACLE,
    SimQuestion,
    simulate,
    stream_order,
    targets,
)
from gateway.evaluation.replay import Prices, ReplayItem
from policies.schema import Policy

PRICES = Prices(1.0, 2.0, 10.0, 20.0, "test")
POLICY = Policy.model_validate(
    {
        "cheap": {"model": "c"},
        "long": {"model": "l"},
        "routing": {"classifier": None, "default_route": "rag", "verifier": {"model_path": "x", "threshold": 0.5}},
    }
)


def stream(n: int = 1200, seed: int = 1) -> list[SimQuestion]:
    """The cheap answer is good when its support is high; the 'shipped' verifier scores the opposite."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        support = rng.random()
        good = rng.random() < (0.9 if support > 0.4 else 0.2)
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
            verifier_score=1.0 - support,
        )
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
    does, and the loop stays within it (over the whole stream, within what one refit period can overshoot)."""
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
    share = budget.total[LEARNING]["tokens"] / budget.total[ALWAYS_LONG]["tokens"]
    assert 0.4 < share <= 0.53, share
