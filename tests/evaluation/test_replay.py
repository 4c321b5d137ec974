import dataclasses

import pytest

from gateway.evaluation.replay import (
    gap_recovery,
    oracle,
    router_strategy,
    run_strategies,
    self_route,
    sweep,
    threshold_grid,
)
from gateway.routing.decision import Router
from tests.support.evaluation import PRICES, cached, item, policy

ITEMS = [
    item(1.0, 1.0, 0.9),
    item(0.0, 1.0, 0.2),
    item(0.0, 1.0, 0.8, refused=True),
    item(1.0, 0.0, 0.7),
    item(0.5, 0.5, 0.6, context=1000),  # short: direct
    item(1.0, 1.0, 0.9, cross_refs=30),  # dense references: long
]


def by_name(results):
    return {r.name: r for r in results}


def test_strategies_and_their_accounting():
    results = by_name(run_strategies(ITEMS, policy(), PRICES))
    long, rag = results["always-long"], results["always-rag"]
    assert long.quality == pytest.approx(4.5 / 6) and long.tokens_vs_long == 1.0 and long.cost_vs_long == 1.0
    assert long.route_shares == {"long": 1.0}
    assert rag.quality == pytest.approx(3.5 / 6) and rag.tokens_vs_long == pytest.approx(1000 / 5000)
    # self-route: the refusal escalates; both legs are paid
    sr = results["self-route"]
    assert sr.quality == pytest.approx(4.5 / 6)
    assert sr.prompt_tokens == 6 * 1000 + 5000
    assert sr.route_shares == pytest.approx({"rag": 5 / 6, "rag>long": 1 / 6})
    # rules + classifier: direct, long by rule, long by P=0.2, rag for the others; direct scored min(rag, lc)
    rc = results["rules+classifier"]
    assert rc.route_shares == pytest.approx({"direct": 1 / 6, "long": 2 / 6, "rag": 3 / 6})
    assert rc.quality == pytest.approx((1 + 1 + 0 + 1 + 0.5 + 1) / 6)
    product = results["router (rules+classifier+fallback)"]
    assert product.quality == pytest.approx((1 + 1 + 1 + 1 + 0.5 + 1) / 6)
    assert results["oracle"].quality == pytest.approx(5.5 / 6)
    for r in results.values():
        assert results["oracle"].quality >= r.quality - 1e-12
    expected_long_cost = 6 * (5000 * 10 + 20 * 20) / 1e6
    assert long.cost_usd == pytest.approx(expected_long_cost)


def test_keep_refusal_keeps_the_cheap_answer_and_its_single_leg():
    refusing = [item(0.0, 1.0, 0.8, refused=True, top=0.2)]
    kept = router_strategy(Router(policy(keep_refusal_when_absent=True, absent_max_top_score=0.3)), True)(refusing[0])
    assert kept.route == "kept-refusal" and kept.score == 0.0 and len(kept.legs) == 1
    escalated = router_strategy(Router(policy()), True)(refusing[0])
    assert escalated.route == "rag>long" and len(escalated.legs) == 2
    assert self_route(refusing[0]).route == "rag>long"
    assert oracle(item(0.5, 0.5, 0.1)).route == "rag"  # ties go to the cheaper route


def test_threshold_sweep_spans_all_rag_to_all_long():
    plain = [item(r, l, p) for r, l, p in [(1, 0, 0.9), (0, 1, 0.1), (1, 1, 0.5), (0, 1, 0.3)]]
    grid = threshold_grid([i.probability for i in plain], steps=10)
    assert grid[0] == 0.0 and grid[-1] > 0.9
    points = sweep(plain, policy(), PRICES, fallback=False, steps=10)
    assert points[0]["long_share"] == 0.0 and points[-1]["long_share"] == 1.0
    assert points[-1]["cost_vs_long"] == pytest.approx(1.0)


def test_gap_recovery_on_a_designed_ranking():
    # four questions; the two where long wins have the lowest P(cheap): a perfect classifier
    items = [item(0, 1, 0.1), item(0, 1, 0.2), item(1, 1, 0.8), item(1, 1, 0.9)]
    gap = gap_recovery(items)
    assert gap.quality_rag == 0.5 and gap.quality_long == 1.0
    assert gap.cpt50 == 0.25 and gap.cpt80 == 0.5
    # PGR curve 0, .5, 1, 1, 1 at shares 0, .25, .5, .75, 1 -> trapezoid area .75
    assert gap.apgr == pytest.approx(0.75) and gap.apgr_oracle == pytest.approx(0.75)
    reversed_items = [item(0, 1, 0.9), item(0, 1, 0.8), item(1, 1, 0.1), item(1, 1, 0.2)]
    assert gap_recovery(reversed_items).apgr == pytest.approx(0.25)  # curve 0, 0, 0, .5, 1
    assert gap_recovery([item(1, 0, 0.5)]).apgr is None  # no gap to recover


# -- provider prompt caching on the long route -----------------------------------------------------------
# long prompt 5,000 tokens of which a 4,000-token document block, 20 output tokens; long: 10 in, 20 out per Mtok
COLD_NO_CACHE = (5000 * 10 + 20 * 20) / 1e6  # 0.0504
COLD_WRITE = (4000 * 12.5 + 1000 * 10 + 20 * 20) / 1e6  # the block written at 12.5: 0.0604
WARM = (4000 * 1.0 + 1000 * 10 + 20 * 20) / 1e6  # the block read at 1.0: 0.0144
RAG_COST = (1000 * 1.0 + 10 * 2.0) / 1e6


def on_doc(doc, rag=1.0, lc=1.0, p=0.9, refused=False, prefix=4000):
    return dataclasses.replace(item(rag, lc, p, refused=refused), doc_id=doc, group=doc, long_prefix_tokens=prefix)


def test_always_long_reads_the_block_after_each_documents_first_question():
    items = [on_doc("a"), on_doc("a"), on_doc("a"), on_doc("b"), on_doc("b")]
    results = by_name(run_strategies(items, policy(), cached()))
    assert results["always-long"].cost_usd == pytest.approx(2 * COLD_WRITE + 3 * WARM)
    # no write premium (OpenAI): a cold leg costs what it costs without a cache
    auto = by_name(run_strategies(items, policy(), cached(write=None)))
    assert auto["always-long"].cost_usd == pytest.approx(2 * COLD_NO_CACHE + 3 * WARM)
    # tokens are tokens, cached or not
    assert auto["always-long"].prompt_tokens == 5 * 5000


def test_a_strategy_warms_only_what_it_sent_long():
    # self-route escalates the 2nd and 3rd questions on "a" and the 1st on "b": a's 2nd is cold (its 1st went rag)
    items = [on_doc("a"), on_doc("a", refused=True), on_doc("a", refused=True), on_doc("b", refused=True), on_doc("b")]
    results = by_name(run_strategies(items, policy(), cached()))
    sr = results["self-route"]
    assert sr.cost_usd == pytest.approx(5 * RAG_COST + COLD_WRITE + WARM + COLD_WRITE)
    long_cost = 2 * COLD_WRITE + 3 * WARM
    assert sr.cost_vs_long == pytest.approx(sr.cost_usd / long_cost)


def test_the_cache_window_and_the_smallest_cached_block():
    items = [on_doc("a"), on_doc("b"), on_doc("a"), on_doc("a")]  # a: positions 0, 2, 3
    windowed = by_name(run_strategies(items, policy(), cached(window=1)))["always-long"]
    assert windowed.cost_usd == pytest.approx(3 * COLD_WRITE + WARM)  # 0 -> 2 is two questions: cold again
    assert by_name(run_strategies(items, policy(), cached(window=2)))["always-long"].cost_usd == pytest.approx(
        2 * COLD_WRITE + 2 * WARM
    )
    # a block under the provider's minimum, or none (a block chosen per question), is never cached
    small = [on_doc("a", prefix=1000), on_doc("a", prefix=1000)]
    assert by_name(run_strategies(small, policy(), cached()))["always-long"].cost_usd == pytest.approx(
        2 * COLD_NO_CACHE
    )
    unstable = [on_doc("a", prefix=0), on_doc("a", prefix=0)]
    assert by_name(run_strategies(unstable, policy(), cached()))["always-long"].cost_usd == pytest.approx(
        2 * COLD_NO_CACHE
    )


def test_without_a_cache_the_costs_are_the_independent_legs():
    items = [on_doc("a"), on_doc("a", refused=True), on_doc("a", p=0.1), on_doc("b")]
    with_blocks = by_name(run_strategies(items, policy(), PRICES))
    without = by_name(run_strategies([dataclasses.replace(i, long_prefix_tokens=0) for i in items], policy(), PRICES))
    for name, r in with_blocks.items():
        assert r.cost_usd == pytest.approx(without[name].cost_usd)
    assert with_blocks["always-long"].cost_usd == pytest.approx(4 * COLD_NO_CACHE)


def test_a_relative_threshold_is_replayed_in_stream_order_by_the_live_check():
    """routing.verifier.relative: run_strategies feeds each strategy the items in stream_order (one deployment),
    and the router's figures are the live CheckAnswerCheck's verdicts over that stream."""
    import random

    from gateway.evaluation.replay import baseline_totals, evaluate, in_stream_order, stream_order
    from policies.routes import FALLBACK
    from policies.schema import RelativeThreshold, VerifierSettings

    rng = random.Random(5)
    items = [
        dataclasses.replace(
            item(rng.random(), rng.random(), 0.9, refused=rng.random() < 0.3, verifier=rng.random()),
            group=f"doc{i // 10}",
        )
        for i in range(120)
    ]
    relative = policy()
    relative.routing.verifier = VerifierSettings(
        threshold=0.0, refusal_threshold=None, relative=RelativeThreshold(window=40, warm_up=10)
    )
    fixed = relative.model_copy(deep=True)
    fixed.routing.verifier.relative = None
    assert in_stream_order(items, fixed) is items
    ordered = in_stream_order(items, relative)
    assert ordered == [items[i] for i in stream_order(items, 0)] != items
    results = by_name(run_strategies(items, relative, PRICES, verifier_threshold=0.0))
    strategy = router_strategy(Router(relative), True)
    manual = iter([strategy(i) for i in ordered])
    expected = evaluate("x", lambda _: next(manual), ordered, PRICES, *baseline_totals(ordered, PRICES))
    got = results["rules+classifier+verifier"]
    assert got.quality == pytest.approx(expected.quality) and got.route_shares == expected.route_shares
    # warm, the window escalated about its refusal share (0.3) x refusal_spend (0.9) of least-trusted answers
    assert 0.15 < got.route_shares.get(FALLBACK, 0) < 0.3
    # at the fixed threshold 0.0 (refusal rule off) nothing escalates
    fixed_router = by_name(run_strategies(items, fixed, PRICES, 0.0))["rules+classifier+verifier"]
    assert fixed_router.route_shares.get(FALLBACK, 0) == 0


def test_paired_answers_carry_what_the_relative_rules_choice_reads():
    from gateway.evaluation.relative_choice import PairedAnswer
    from gateway.evaluation.replay import paired_answers

    items = [
        item(0.2, 0.9, 0.3, refused=True, verifier=0.4),
        item(1.0, 1.0, 0.8),
        item(1.0, 0.0, 0.5, verifier=float("nan")),
    ]
    # answers without a P(good) (no verifier score, or NaN) cannot be decided by the rule: left out
    assert paired_answers(items) == [PairedAnswer("d", 0.4, True, 0.2, 0.9, 1000.0, 5000.0, 0.3)]
