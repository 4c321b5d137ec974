import math

from gateway.routing.decision import Router
from gateway.routing.escalation import ESCALATED, REFUSAL_KEPT, check_cheap_answer, keep_refusal
from policies.routes import FALLBACK, KEPT_REFUSAL, RAG
from tests.routing.test_decision import FixedModel, make_policy


def test_keep_refusal_needs_the_option_and_both_pieces_of_evidence():
    features_weak = {"top_score": 0.2}
    features_strong = {"top_score": 0.8}
    off = make_policy()
    assert keep_refusal(off.routing.fallback, Router(off, FixedModel(0.9)).decide(features_weak)) is False
    on = make_policy(keep_refusal_when_absent=True, absent_max_top_score=0.35, absent_min_probability=0.5)
    fallback = on.routing.fallback
    router = Router(on, FixedModel(0.9))
    assert keep_refusal(fallback, router.decide(features_weak)) is True
    assert keep_refusal(fallback, router.decide(features_strong)) is False  # retrieval found a close match
    unsure = Router(on, FixedModel(0.2))
    assert keep_refusal(fallback, unsure.decide(features_weak)) is False  # classifier expects the long route
    assert keep_refusal(fallback, router.decide({"top_score": math.nan})) is False  # no retrieval evidence


def test_only_a_refused_rag_answer_escalates():
    policy = make_policy(threshold=0.5)
    rag = Router(policy, FixedModel(0.9)).decide({"top_score": 0.8})
    assert rag.route == RAG
    assert check_cheap_answer(policy, rag, refused=False).outcome == RAG
    verdict = check_cheap_answer(policy, rag, refused=True)
    assert verdict.escalate and verdict.outcome == FALLBACK
    assert verdict.reason(rag) == f"{rag.reason}; {ESCALATED}"
    long = Router(policy, FixedModel(0.1)).decide({"top_score": 0.8})
    assert not check_cheap_answer(policy, long, refused=True).escalate  # the long answer is never escalated
    disabled = make_policy(enabled=False)
    assert not check_cheap_answer(disabled, Router(disabled, FixedModel(0.9)).decide({}), refused=True).escalate


def test_a_kept_refusal_is_not_escalated_and_says_why():
    policy = make_policy(keep_refusal_when_absent=True, absent_max_top_score=0.35)
    decision = Router(policy, FixedModel(0.9)).decide({"top_score": 0.1})
    verdict = check_cheap_answer(policy, decision, refused=True)
    assert not verdict.escalate and verdict.outcome == KEPT_REFUSAL and verdict.note == REFUSAL_KEPT
