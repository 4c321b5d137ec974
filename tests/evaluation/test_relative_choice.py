"""Choosing the relative rule's parameters under a held-out protocol (gateway.evaluation.relative_choice): each unit
replayed through the live check in stream order, the issue's two targets, the cross-unit criterion and the nesting."""

import pytest

from gateway.evaluation.relative_choice import (
    PairedAnswer,
    RelativeChoice,
    UnitFigures,
    candidate_grid,
    choose_relative,
    held_out,
    replay_unit,
    stream_order,
    with_relative,
)
from policies.schema import RelativeThreshold
from tests.support.policies import verified_policy


def unit(n=200, doubted=10, refusals=10, prefix="d"):
    """n answers over 10 documents: `doubted` wrong cheap answers the verifier doubts (P(good) 0.05; the long answer
    right), `refusals` right cheap answers that refuse anyway (trusted, P(good) 0.9), the rest right and trusted;
    every cheap prompt 10 tokens, every long prompt 100."""
    answers = []
    for i in range(n):
        wrong, refused = i < doubted, doubted <= i < doubted + refusals
        answers.append(
            PairedAnswer(
                f"{prefix}{i % 10}", 0.05 if wrong else 0.9 - 0.001 * i, refused, 0.0 if wrong else 1.0, 1.0, 10, 100
            )
        )
    return answers


def test_a_unit_is_scored_on_both_targets_against_its_baselines():
    answers = unit()
    fixed = with_relative(verified_policy(threshold=0.5), None)  # escalates exactly the doubted answers
    f = replay_unit(fixed, answers, seeds=(0, 1))
    # always-long 1.0 is the better baseline; the router escalates the 10 wrong answers: quality 1.0
    assert f.gap_points == (pytest.approx(0.0), pytest.approx(0.0)) and f.within
    assert f.tokens[0] == pytest.approx((200 * 10 + 10 * 100) / (200 * 100))
    assert f.escalated == (0.05, 0.05)
    # Self-Route escalates the 10 refusals instead (right already): 0.95 at the same tokens; the router is better
    assert f.self_route_tokens == pytest.approx(0.15) and f.self_route_points[0] == pytest.approx(5.0)
    assert f.beats_self_route and f.both
    lax = replay_unit(with_relative(verified_policy(threshold=0.0), None), answers, seeds=(0,))
    assert lax.gap_points[0] == pytest.approx(-5.0) and not lax.within and not lax.beats_self_route  # a tie with SR
    capped = replay_unit(fixed, answers, seeds=(0,), max_token_share=0.1)
    assert not capped.within  # 0.15 of always-long's tokens is over a 0.1 cap


def test_the_choice_replays_the_live_relative_rule_and_prefers_the_targets_to_the_gap():
    policy = verified_policy(threshold=0.0)  # the warm-up's fixed threshold escalates nothing
    relative = RelativeThreshold(window=100, warm_up=10, pool=1.0, refusal_spend=1.0)
    everything = RelativeThreshold(window=100, warm_up=10, pool=1.0, long_share=1.0, min_share=1.0)
    candidates = [None, relative, everything]
    units = {"a": unit(prefix="a"), "b": unit(prefix="b"), "c": unit(n=300, prefix="c")}
    choice = choose_relative(policy, units, candidates, seeds=(0, 1, 2))
    # the fixed 0.0 escalates nothing; escalating everything closes the gap but spends 1.1 of always-long's tokens;
    # the relative rule spends the refusals' tokens on the doubted answers instead (those not decided in the warm-up
    # or before the window has seen a refusal to spend): Self-Route beaten on every unit, closer than the fixed rule
    assert choice.settings == relative
    assert all(f.beats_self_route for f in choice.per_unit.values())
    assert all(choice.table[1][u].gap_points[0] > choice.table[0][u].gap_points[1] + 2.0 for u in units)
    assert choice.table[2]["a"].gap_points[0] >= -0.5 - 1e-9 and not choice.table[2]["a"].within  # warm-up: one missed
    assert not any(f.beats_self_route for f in choice.table[0].values())
    nested = held_out(choice)
    assert [h.unit for h in nested] == ["a", "b", "c"]
    assert all(h.settings == relative and h.unit not in h.chosen_on for h in nested)


def figures(both, gap):
    return UnitFigures(100, (gap, gap), (0.1, 0.1), (0.05, 0.05), (1.0, 1.0), 0.2, both, both)


def test_held_out_choices_use_only_the_other_units():
    x, y = RelativeThreshold(pool=1.0), RelativeThreshold(pool=2.0)
    table = {
        0: {"a": figures(True, -0.5), "b": figures(True, -0.5), "c": figures(False, -3.0)},
        1: {"a": figures(False, -2.0), "b": figures(False, -2.0), "c": figures(True, -0.2)},
    }
    choice = RelativeChoice(x, ["a", "b", "c"], table[0], table, [x, y])
    nested = {h.unit: h for h in held_out(choice)}
    # c held out: chosen on a and b, where x meets both; scored on c, where it does not
    assert nested["c"].settings == x and nested["c"].chosen_on == ("a", "b") and not nested["c"].figures.both
    # a held out: on b and c each meets one; the worst gap decides (x -3.0, y -2.0)
    assert nested["a"].settings == y and nested["a"].figures is table[1]["a"]


def test_the_grid_holds_the_fixed_rule_the_policys_own_settings_and_each_variant():
    policy = verified_policy(threshold=0.2)
    own = RelativeThreshold(window=500, warm_up=20, pool=1.5, refusal_spend=0.9, source="a benchmark")
    policy.routing.verifier.relative = own
    grid = candidate_grid(policy)
    assert grid[0] is None and grid[1] == own.model_copy(update={"source": None})
    assert all(g.window == 500 and g.warm_up == 20 for g in grid[1:])
    assert any(g.long_share for g in grid[1:]) and any(g.min_share for g in grid[1:])
    assert any(g.cheap_weight for g in grid[1:]) and any(g.per_token for g in grid[1:])
    assert len(grid) == len({g.model_dump_json() if g else "" for g in grid})


def test_stream_order_keeps_a_documents_questions_together():
    answers = unit(n=40)
    order = stream_order(answers, 1)
    assert sorted(order) == list(range(40)) and order == stream_order(answers, 1) != stream_order(answers, 2)
    groups = [answers[i].group for i in order]
    assert all(groups[k] == groups[k + 1] for k in range(39) if k % 4 != 3)  # ten documents of four questions


def test_a_unit_counts_only_when_it_meets_both_targets():
    from dataclasses import replace

    from gateway.evaluation.relative_choice import pick

    met = figures(True, -0.5)
    within_only, beats_only = replace(met, beats_self_route=False), replace(met, within=False, gap_points=(-2.0, -2.0))
    missed = figures(False, -3.0)
    # candidate 0: both targets on a; candidate 1: one target on each of a and b (a better worst gap), neither meets both
    table = {0: {"a": met, "b": missed}, 1: {"a": within_only, "b": beats_only}}
    assert pick(table, ["a", "b"]) == 0


def test_held_out_choices_can_be_made_on_given_training_units():
    x, y = RelativeThreshold(pool=1.0), RelativeThreshold(pool=2.0)
    table = {
        0: {"a": figures(True, -0.5), "b": figures(False, -3.0), "c": figures(True, -0.5)},
        1: {"a": figures(False, -2.0), "b": figures(True, -0.2), "c": figures(False, -2.0)},
    }
    choice = RelativeChoice(x, ["a", "b", "c"], table[0], table, [x, y])
    # b may be chosen only on c (a shares its answers), a only on b: their picks follow those units alone
    nested = {h.unit: h for h in held_out(choice, {"a": ["b"], "b": ["c", "b"], "c": []})}
    assert nested["b"].chosen_on == ("c",) and nested["b"].settings == x and not nested["b"].figures.both
    assert nested["a"].chosen_on == ("b",) and nested["a"].settings == y
    assert "c" not in nested  # nothing to choose on
