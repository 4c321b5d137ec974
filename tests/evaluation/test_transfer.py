"""Per held-out unit: the verifier against random escalation, the strategies, the threshold curve, one setting."""

import dataclasses

import pytest

from gateway.evaluation.tradeoff import choose_across_units
from gateway.evaluation.transfer import (
    escalation_transfer,
    format_threshold_curves,
    format_transfer_curve,
    format_units,
    gain_weighted_auc,
    threshold_curve,
    unit_reports,
)
from tests.support.evaluation import PRICES, policy
from tests.support.evaluation import VERIFIED_ITEMS as ITEMS
from tests.support.evaluation import verified_item as item


def test_verifier_against_random_escalation_at_the_same_share():
    # ITEMS: the two answers the verifier trusts least (0.1, 0.2) are the two the long route fixes (+1 each)
    at = {t["share"]: t for t in escalation_transfer(ITEMS, (1 / 3, 0.5))}
    gain = sum(i.lc_score - i.rag_score for i in ITEMS) / len(ITEMS)  # 1/6 a question on average
    assert at[1 / 3]["escalated"] == 2
    assert at[1 / 3]["verifier"] == pytest.approx(sum(i.rag_score for i in ITEMS) / 6 + 2 / 6)
    assert at[1 / 3]["random"] == pytest.approx(sum(i.rag_score for i in ITEMS) / 6 + (2 / 6) * gain)
    assert at[1 / 3]["points"] == pytest.approx(100 * (2 / 6 - (2 / 6) * gain))
    reversed_ = [dataclasses.replace(i, verifier_score=1 - i.verifier_score) for i in ITEMS]
    assert escalation_transfer(reversed_, (1 / 3,))[0]["points"] < 0  # a verifier ranking backwards loses to random
    assert gain_weighted_auc(ITEMS) == 1.0 and gain_weighted_auc(reversed_) == 0.0


def test_threshold_curve_runs_from_no_escalation_to_all():
    curve = threshold_curve(ITEMS, PRICES)
    assert min(p["escalated"] for p in curve) == 0.0 and max(p["escalated"] for p in curve) == 1.0
    lowest = min(curve, key=lambda p: p["tokens_vs_long"])
    assert lowest["tokens_vs_long"] == pytest.approx(1000 / 5000)  # always-RAG's tokens
    assert max(curve, key=lambda p: p["quality"])["quality"] == pytest.approx((1 + 1 + 1 + 1 + 1 + 0.5) / 6)


def test_unit_reports_and_one_setting_for_every_unit():
    items = [dataclasses.replace(i, group=f"a{n}") for n, i in enumerate(ITEMS)] + [
        dataclasses.replace(i, group=f"b{n}", verifier_score=1 - i.verifier_score) for n, i in enumerate(ITEMS)
    ]
    units = ["a"] * 6 + ["b"] * 6
    p = policy()
    p.routing.rules = []
    reports = unit_reports(items, units, p, PRICES, 0.5)
    assert [r.unit for r in reports] == ["a", "b"] and reports[0].n == 6 and reports[0].documents == 6
    assert reports[0].transfer_points > 0 > reports[1].transfer_points  # b's verifier ranks backwards
    assert {s.name for s in reports[0].strategies} >= {"always-long", "rules+classifier+verifier", "oracle"}
    table = format_units(reports, "held-out corpus")
    assert "| a " in table and "verifier − random @25%" in table
    assert "25%" in format_transfer_curve(reports) and "≤0.3" in format_threshold_curves(reports)
    # one shared setting: the cap binds on every unit; b's backwards verifier makes its margin the worst
    choice = choose_across_units(items, units, p, PRICES, max_share=0.9, tune_pre_route=False)
    assert choice.met and all(o["tokens_vs_long"] <= 0.9 + 1e-9 for o in choice.per_unit.values())
    assert choice.worst_margin_points == pytest.approx(
        min(o["vs_better_baseline_points"] for o in choice.per_unit.values())
    )
    impossible = choose_across_units(items, units, p, PRICES, max_share=0.05, tune_pre_route=False)
    assert not impossible.met  # even no escalation costs always-RAG's 0.2 of the tokens
    with pytest.raises(ValueError):
        choose_across_units(items, units, p, PRICES, max_share=0.5, on="dollars")


def test_items_without_verifier_scores_have_no_transfer_figure():
    bare = [item(1.0, 0.0, 0.9, None), item(0.0, 1.0, 0.2, None)]
    report = unit_reports(bare, ["x", "x"], policy(), PRICES, None)[0]
    assert report.transfer == [] and report.transfer_points is None and report.gain_auc is None
