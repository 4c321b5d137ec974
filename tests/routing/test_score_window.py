"""The verifier threshold relative to a key's own traffic (routing.verifier.relative): gateway.routing.score_window
and CheapAnswerCheck.verdict's use of it."""

import threading

import pytest
from pydantic import ValidationError

from gateway.routing.decision import RouteDecision, Router
from gateway.routing.escalation import CheapAnswerCheck
from gateway.routing.score_window import ScoreWindow, Seen
from policies.routes import FALLBACK, KEPT_REFUSAL, RAG
from policies.schema import Policy, RelativeThreshold
from tests.support.policies import BARE_MODELS, verified_policy


def relative_policy(threshold=0.5, refusal_threshold=None, **relative) -> Policy:
    policy = verified_policy(threshold=threshold, refusal_threshold=refusal_threshold)
    settings = {"window": 20, "warm_up": 10, "refusal_spend": 1.0, "pool": 1.0, **relative}
    policy.routing.verifier.relative = RelativeThreshold(**settings)
    return policy


def feed(check, decision, answers, key=None):
    """answers: (score, refused, long tokens); the verdicts in order."""
    return [check.verdict(decision, refused, score, key, tokens) for score, refused, tokens in answers]


def test_the_fixed_thresholds_decide_until_the_window_is_warm():
    check = CheapAnswerCheck(relative_policy(threshold=0.5, warm_up=10))
    decision = Router(check.policy).decide({})
    verdicts = feed(check, decision, [(0.4, False, 100)] * 10)
    assert all(v.escalate and v.threshold == 0.5 for v in verdicts)  # below the fixed 0.5
    assert len(check.windows.window(None)) == 10
    # warm now: no refusal in the window, so the relative rule escalates nothing (Self-Route would not either)
    nxt = check.verdict(decision, False, 0.1, None, 100)
    assert not nxt.escalate and nxt.threshold == 0.0 and "relative threshold 0.00" in nxt.note


def test_the_window_escalates_its_refusal_share_of_least_trusted_answers_within_the_refusals_spend():
    check = CheapAnswerCheck(relative_policy(threshold=0.0, window=20, warm_up=10, pool=1.0, refusal_spend=1.0))
    decision = Router(check.policy).decide({})
    # ten answers: scores 0.1 .. 1.0, two of them refusals of 100 long tokens each (Self-Route: 200 tokens)
    history = [(0.1 * (i + 1), i in (4, 7), 100) for i in range(10)]
    assert not any(v.escalate for v in feed(check, decision, history))  # warm-up at threshold 0.0
    rule = check.windows.window(None).in_force()
    # refusal share 2/10, pool 1.0: the P(good) below which 2 of 10 fall (0.3); budget 1.0 x 200 tokens
    assert rule.threshold == pytest.approx(0.3) and rule.budget_tokens == pytest.approx(200)
    low = check.verdict(decision, False, 0.05, None, 150)
    assert low.escalate and low.outcome == FALLBACK and low.threshold == pytest.approx(0.3)
    assert "this key's recent answers" in low.note and low.long_tokens == 150
    # the window now spent 150 of its 200 + 0 tokens: a second doubted answer of 100 tokens does not fit
    assert check.windows.window(None).in_force().budget_tokens == pytest.approx(50)
    over = check.verdict(decision, False, 0.05, None, 100)
    assert not over.escalate and over.outcome == RAG
    assert check.verdict(decision, False, 0.05, None, 40).escalate  # a shorter long leg still fits
    # a trusted refusal is kept, not escalated by Self-Route's rule
    kept = check.verdict(decision, True, 0.9, None, 10)
    assert not kept.escalate and kept.outcome == KEPT_REFUSAL


def test_pool_and_spend_scale_the_rule():
    wide = CheapAnswerCheck(relative_policy(threshold=0.0, pool=2.0, refusal_spend=0.5))
    decision = Router(wide.policy).decide({})
    feed(wide, decision, [(0.1 * (i + 1), i in (4, 7), 100) for i in range(10)])
    rule = wide.windows.window(None).in_force()
    assert rule.threshold == pytest.approx(0.5) and rule.budget_tokens == pytest.approx(100)


def test_old_answers_leave_the_window():
    window = ScoreWindow(RelativeThreshold(window=10, warm_up=5, pool=1.0, refusal_spend=1.0))
    for _ in range(10):
        window.add(Seen(0.5, True, 100, True))
    assert window.in_force().threshold == pytest.approx(1.0 + 1e-9)  # every answer refused: all are candidates
    for _ in range(10):
        window.add(Seen(0.9, False, 100, False))
    rule = window.in_force()
    assert len(window) == 10 and rule.threshold == 0.0 and rule.budget_tokens == 0.0


def test_one_keys_traffic_does_not_move_another_keys_threshold():
    check = CheapAnswerCheck(relative_policy(threshold=0.0, warm_up=10))
    decision = Router(check.policy).decide({})
    feed(check, decision, [(0.1, True, 100)] * 20, key="noisy")  # all refusals: key "noisy" escalates a lot
    assert check.windows.window("noisy").in_force().threshold > 0.1
    quiet = feed(check, decision, [(0.1, False, 100)] * 15, key="quiet")
    assert not any(v.escalate for v in quiet)  # its own window: no refusals, nothing to escalate
    assert len(check.windows.window("quiet")) == 15 and len(check.windows.window("noisy")) == 20
    assert len(check.windows.window(None)) == 0


def test_a_keys_window_starts_from_its_recorded_answers():
    asked = []

    def history(key, limit):
        asked.append((key, limit))
        return [Seen(0.1 * (i + 1), i in (4, 7), 100, False) for i in range(10)] if key == "k" else []

    check = CheapAnswerCheck(relative_policy(threshold=0.0, warm_up=10), history=history)
    decision = Router(check.policy).decide({})
    assert check.verdict(decision, False, 0.05, "k", 100).escalate  # warm at once from the ledger's rows
    assert not check.verdict(decision, False, 0.05, "other", 100).escalate  # cold: the fixed threshold 0.0
    check.verdict(decision, False, 0.05, "k", 100)
    assert asked == [("k", 20), ("other", 20)]  # read once per key
    # a replacing check with the same settings keeps the windows (a reload, a refit); other settings start anew
    again = CheapAnswerCheck(check.policy, windows=check.windows)
    assert again.windows is check.windows
    changed = CheapAnswerCheck(relative_policy(threshold=0.0, warm_up=5), windows=check.windows)
    assert changed.windows is not check.windows


def test_without_long_tokens_or_the_setting_the_fixed_rule_decides_and_the_window_is_untouched():
    check = CheapAnswerCheck(relative_policy(threshold=0.5))
    decision = Router(check.policy).decide({})
    assert check.verdict(decision, False, 0.4).escalate and len(check.windows.window(None)) == 0
    plain = CheapAnswerCheck(verified_policy(threshold=0.5))
    assert plain.windows is None and plain.verdict(decision, False, 0.4, "k", 100).escalate


def test_concurrent_answers_of_a_key_are_all_counted():
    check = CheapAnswerCheck(relative_policy(threshold=0.0, window=10_000, warm_up=10))
    decision = Router(check.policy).decide({})

    def work():
        feed(check, decision, [(0.3, True, 10), (0.6, False, 10)] * 100, key="k")

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    window = check.windows.window("k")
    assert len(window) == 1600
    # spent never passes the refusals' spend: each escalation was decided against the answers before it
    assert window.in_force().budget_tokens >= 0


def test_the_policy_rejects_a_warm_up_longer_than_the_window_and_unknown_fields():
    base = {**BARE_MODELS, "routing": {"classifier": None, "default_route": "rag"}}

    def verifier(relative):
        return {**base, "routing": {**base["routing"], "verifier": {"threshold": 0.2, "relative": relative}}}

    with pytest.raises(ValidationError, match=r"warm_up \(500\) must not exceed window \(100\)"):
        Policy.model_validate(verifier({"window": 100, "warm_up": 500}))
    with pytest.raises(ValidationError, match="share"):
        Policy.model_validate(verifier({"share": 0.2}))
    with pytest.raises(ValidationError, match="refusal_spend"):
        Policy.model_validate(verifier({"refusal_spend": 0}))
    ok = Policy.model_validate(verifier({}))
    assert ok.routing.verifier.relative == RelativeThreshold(refusal_spend=0.9, pool=1.5, window=1000, warm_up=50)


def test_long_share_budgets_on_every_answers_long_tokens_instead_of_the_refusals():
    window = ScoreWindow(RelativeThreshold(window=20, warm_up=5, pool=1.0, long_share=0.1))
    for i in range(10):  # one refusal of 100 tokens among ten answers of 100 tokens: always-long sends 1000
        window.add(Seen(0.1 * (i + 1), i == 0, 100, False))
    rule = window.in_force()
    assert rule.budget_tokens == pytest.approx(100)  # 0.1 x 1000, not refusal_spend x the refusal's 100 (90)
    window.add(Seen(0.05, False, 60, True))
    assert window.in_force().budget_tokens == pytest.approx(0.1 * 1060 - 60)


def test_min_share_widens_the_candidates_when_few_answers_refuse():
    settings = {"window": 20, "warm_up": 5, "pool": 1.0, "refusal_spend": 1.0}
    narrow, wide = ScoreWindow(RelativeThreshold(**settings)), ScoreWindow(RelativeThreshold(**settings, min_share=0.3))
    for i in range(10):
        for w in (narrow, wide):
            w.add(Seen(0.1 * (i + 1), i == 9, 100, False))  # one refusal in ten: share 0.1
    assert narrow.in_force().threshold == pytest.approx(0.2)  # the lowest 1 of 10 below it
    assert wide.in_force().threshold == pytest.approx(0.4)  # at least 3 of 10


def test_cheap_weight_ranks_by_p_good_and_p_cheap_together():
    check = CheapAnswerCheck(relative_policy(threshold=0.0, window=20, warm_up=10, pool=1.0, cheap_weight=0.5))
    # ten answers, two refusals: candidates the lowest 2 of 10 by (P(good) + P(cheap)) / 2
    for i in range(10):
        decision = RouteDecision(RAG, "test", probability=0.5)
        check.verdict(decision, i in (4, 7), 0.1 * (i + 1), None, 10)
    # P(good) 0.15 is low, but the pre-route was sure the cheap answer suffices (0.95): rank 0.55, kept
    sure = check.verdict(RouteDecision(RAG, "test", probability=0.95), False, 0.15, None, 10)
    assert not sure.escalate and "rank 0.55" in sure.note
    doubted = check.verdict(RouteDecision(RAG, "test", probability=0.05), False, 0.15, None, 10)
    assert doubted.escalate  # rank 0.10, below the window's second-lowest rank


def test_per_token_ranks_doubt_per_long_token():
    check = CheapAnswerCheck(relative_policy(threshold=0.0, window=20, warm_up=10, pool=1.0, per_token=True))
    decision = Router(check.policy).decide({})
    feed(check, decision, [(0.5, i in (4, 7), 100) for i in range(10)])  # ranks -0.005, two refusals
    # as doubted as P(good) 0.2 but on a 1000-token long leg: -0.0008 per token, above the window's ranks: kept
    assert not check.verdict(decision, False, 0.2, None, 1000).escalate
    # P(good) 0.6 on a 10-token long leg: -0.04, the lowest rank: escalated (the window's refusals spent 200)
    assert check.verdict(decision, False, 0.6, None, 10).escalate
    assert RelativeThreshold(per_token=True).model_dump()["per_token"] is True
