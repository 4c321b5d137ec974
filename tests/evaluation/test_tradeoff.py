import dataclasses

import pytest

from gateway.evaluation.replay import (
    Router,
    baseline_totals,
    evaluate,
    router_strategy,
    with_threshold,
    with_verifier,
    without_pre_route,
)
from gateway.evaluation.tradeoff import Table, choose, quantile_grid
from tests.support.evaluation import PRICES, policy
from tests.support.evaluation import VERIFIED_ITEMS as ITEMS
from tests.support.evaluation import verified_item as item


def test_the_table_scores_a_setting_as_the_replay_does():
    pol = with_verifier(policy(), 0.5)
    table = Table(ITEMS, PRICES)
    fast = table.outcome(table.routes(pol), 0.5)
    long_tokens, long_cost, long_quality = baseline_totals(ITEMS, PRICES)
    slow = evaluate("x", router_strategy(Router(pol), True), ITEMS, PRICES, long_tokens, long_cost, long_quality)
    assert fast["quality"] == pytest.approx(slow.quality)
    assert fast["cost_vs_long"] == pytest.approx(slow.cost_vs_long)


def test_max_cost_share_picks_the_best_quality_under_the_cap():
    pick = choose(ITEMS, without_pre_route(policy()), PRICES, max_cost_share=0.5, tune_pre_route=False)
    # escalating the two answers the verifier doubts recovers both; escalating more only costs more
    assert pick.met and 0.2 < pick.verifier_threshold <= 0.6
    assert pick.quality == pytest.approx(5.5 / 6) and pick.long_share == pytest.approx(2 / 6)
    assert pick.cost_vs_long == pytest.approx((6 * 0.00102 + 2 * 0.0504) / (6 * 0.0504))
    # a cap too tight for any escalation: nothing escalated
    tight = choose(ITEMS, without_pre_route(policy()), PRICES, max_cost_share=0.01, tune_pre_route=False)
    assert not tight.met and tight.long_share == 0.0


def test_min_quality_delta_picks_the_cheapest_setting_that_beats_long():
    long_quality = sum(i.lc_score for i in ITEMS) / len(ITEMS)
    pick = choose(ITEMS, without_pre_route(policy()), PRICES, min_quality_delta=10.0, tune_pre_route=False)
    assert pick.met and pick.quality - long_quality >= 0.10 - 1e-9
    cheaper = [p for p in pick.points if p["cost_vs_long"] < pick.cost_vs_long - 1e-12]
    assert all(p["quality_vs_long_points"] < 10.0 for p in cheaper)
    impossible = choose(ITEMS, without_pre_route(policy()), PRICES, min_quality_delta=90.0, tune_pre_route=False)
    assert not impossible.met


def test_both_thresholds_are_tuned_together_when_the_policy_has_a_classifier():
    items = [item(0.0, 1.0, 0.1, 0.9), *ITEMS[:3]]  # a bad cheap answer the verifier trusts, but P(cheap) flags
    pick = choose(items, with_threshold(policy(), 0.5), PRICES, max_cost_share=0.6)
    assert pick.pre_threshold is not None and pick.quality == pytest.approx(1.0 * 3 / 4 + 0.25 * 1.0)
    with pytest.raises(ValueError):
        choose(items, policy(), PRICES)


def test_quantile_grid_covers_both_ends():
    grid = quantile_grid([0.2, 0.4, 0.6], 4)
    assert grid[0] == 0.0 and grid[-1] > 0.6 and 0.4 in grid


def test_the_table_prices_a_warm_cache_as_the_replay_does():
    from tests.support.evaluation import cached

    items = [
        dataclasses.replace(i, doc_id=doc, long_prefix_tokens=4000) for i, doc in zip(ITEMS + ITEMS, "aabbcaaabbcc")
    ]
    for prices in (cached(), cached(write=None), cached(window=2)):
        table = Table(items, prices)
        for t in (0.0, 0.5, 0.75, 1.0):
            pol = with_verifier(policy(), t)
            fast = table.outcome(table.routes(pol), t)
            slow = evaluate("x", router_strategy(Router(pol), True), items, prices, *baseline_totals(items, prices))
            assert fast["cost_vs_long"] == pytest.approx(slow.cost_vs_long)
            assert fast["quality"] == pytest.approx(slow.quality)


def test_a_warm_cache_changes_the_threshold_chosen_under_a_cost_cap():
    from tests.support.evaluation import cached

    # six questions on one document; the verifier doubts the two bad cheap answers most
    items = [dataclasses.replace(i, long_prefix_tokens=4000) for i in ITEMS]
    cold = choose(items, without_pre_route(policy()), PRICES, max_cost_share=0.4, tune_pre_route=False)
    # without a cache, escalating the two doubted answers costs (6 rag + 2 long) / 6 long = 0.354: within the cap
    assert cold.met and cold.long_share == pytest.approx(2 / 6) and cold.quality == pytest.approx(5.5 / 6)
    assert cold.cost_vs_long == pytest.approx((6 * 0.00102 + 2 * 0.0504) / (6 * 0.0504))
    # with it, always-long pays one cold leg and five warm ones (0.0504 + 5 * 0.0144 = 0.1224), so one
    # escalation alone is already (6 * 0.00102 + 0.0504) / 0.1224 = 0.462 of it: nothing can be escalated
    warm = choose(items, without_pre_route(policy()), cached(write=None), max_cost_share=0.4, tune_pre_route=False)
    assert warm.met and warm.long_share == 0.0 and warm.verifier_threshold < cold.verifier_threshold
    assert warm.cost_vs_long == pytest.approx(6 * 0.00102 / (0.0504 + 5 * 0.0144))
    # a cap that fits two escalations again: the first writes the block, the second reads it
    two = choose(items, without_pre_route(policy()), cached(write=None), max_cost_share=0.6, tune_pre_route=False)
    assert two.long_share == pytest.approx(2 / 6)
    assert two.cost_vs_long == pytest.approx((6 * 0.00102 + 0.0504 + 0.0144) / (0.0504 + 5 * 0.0144))


def test_refusals_escalate_below_the_refusal_threshold_in_the_table_as_in_the_replay():
    from gateway.evaluation.tradeoff import choose_across_units

    refusals = [
        dataclasses.replace(item(1.0, 0.0, 0.9, 0.9), rag_refused=True),  # a right refusal the verifier trusts
        dataclasses.replace(item(0.0, 1.0, 0.9, 0.6), rag_refused=True),  # a wrong one it trusts less
    ]
    items = ITEMS + refusals
    table = Table(items, PRICES)
    long_tokens, long_cost, long_quality = baseline_totals(items, PRICES)
    for refusal in (None, 0.0, 0.7, 1.0):
        pol = with_verifier(without_pre_route(policy()), 0.3)
        pol.routing.verifier.refusal_threshold = refusal
        fast = table.outcome(table.routes(pol), 0.3, None, refusal)
        slow = evaluate("x", router_strategy(Router(pol), True), items, PRICES, long_tokens, long_cost, long_quality)
        assert fast["quality"] == pytest.approx(slow.quality) and fast["long_share"] == pytest.approx(
            slow.route_shares.get("rag>long", 0.0)
        )
    # across units, the refusal threshold is chosen too: between the two refusals' P(good). The targets come first:
    # escalating one doubted answer and the doubted refusal beats Self-Route (both refusals) at as many tokens, where
    # escalating both doubted answers too would have more quality but more tokens than Self-Route
    pol = with_verifier(without_pre_route(policy()), 0.3)
    choice = choose_across_units(items, ["u"] * len(items), pol, PRICES, max_share=0.9, tune_pre_route=False)
    assert 0.6 < choice.refusal_threshold <= 0.9 and 0.1 < choice.verifier_threshold <= 0.2
    u = choice.per_unit["u"]
    assert u["self_route_quality"] == pytest.approx(4.5 / 8) and u["self_route_tokens_vs_long"] == pytest.approx(0.45)
    assert u["quality"] == pytest.approx(6.5 / 8) and u["tokens_vs_long"] == pytest.approx(0.45)
    assert u["beats_self_route"] == 1.0
