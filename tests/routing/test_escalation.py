import math
from dataclasses import replace

import pytest

from gateway.routing.decision import Router
from gateway.routing.escalation import (
    ESCALATED,
    REFUSAL_KEPT,
    CheapAnswer,
    CheapAnswerCheck,
    keep_refusal,
)
from policies.routes import DIRECT, FALLBACK, KEPT_REFUSAL, LONG, RAG
from policies.schema import Policy
from tests.support.policies import BARE_MODELS, decision_policy, verified_policy
from tests.support.routed import FixedModel, toy_verifier


@pytest.fixture(scope="module")
def verifier():
    return toy_verifier()


def test_keep_refusal_needs_the_option_and_both_pieces_of_evidence():
    features_weak = {"top_score": 0.2}
    features_strong = {"top_score": 0.8}
    off = decision_policy()
    assert keep_refusal(off.routing.fallback, Router(off, FixedModel(0.9)).decide(features_weak)) is False
    on = decision_policy(keep_refusal_when_absent=True, absent_max_top_score=0.35, absent_min_probability=0.5)
    fallback = on.routing.fallback
    router = Router(on, FixedModel(0.9))
    assert keep_refusal(fallback, router.decide(features_weak)) is True
    assert keep_refusal(fallback, router.decide(features_strong)) is False  # retrieval found a close match
    unsure = Router(on, FixedModel(0.2))
    assert keep_refusal(fallback, unsure.decide(features_weak)) is False  # classifier expects the long route
    assert keep_refusal(fallback, router.decide({"top_score": math.nan})) is False  # no retrieval evidence


def test_literal_rule_only_a_refused_cheap_answer_escalates():
    policy = decision_policy(threshold=0.5)
    check = CheapAnswerCheck(policy)
    assert not check.reads_whole_answer
    rag = Router(policy, FixedModel(0.9)).decide({"top_score": 0.8})
    assert rag.route == RAG
    assert check.check(rag, CheapAnswer("The pump is green.")).outcome == RAG
    verdict = check.check(rag, CheapAnswer("unanswerable"))
    assert verdict.escalate and verdict.outcome == FALLBACK and verdict.score is None
    assert verdict.reason(rag) == f"{rag.reason}; {ESCALATED}"
    long = Router(policy, FixedModel(0.1)).decide({"top_score": 0.8})
    assert not check.check(long, CheapAnswer("unanswerable")).escalate  # the long answer is never escalated
    disabled = decision_policy(enabled=False)
    assert (
        not CheapAnswerCheck(disabled)
        .check(Router(disabled, FixedModel(0.9)).decide({}), CheapAnswer("unanswerable"))
        .escalate
    )


def test_direct_answers_are_checked_too():
    policy = decision_policy(rules=[{"feature": "context_tokens", "op": "<", "value": 100, "route": "direct"}])
    decision = Router(policy, FixedModel(0.9)).decide({"context_tokens": 50})
    assert decision.route == DIRECT
    check = CheapAnswerCheck(policy)
    assert check.check(decision, CheapAnswer("unanswerable")).escalate
    assert check.check(decision, CheapAnswer("green")).outcome == DIRECT


def test_a_kept_refusal_is_not_escalated_and_says_why():
    policy = decision_policy(keep_refusal_when_absent=True, absent_max_top_score=0.35)
    decision = Router(policy, FixedModel(0.9)).decide({"top_score": 0.1})
    verdict = CheapAnswerCheck(policy).check(decision, CheapAnswer("unanswerable"))
    assert not verdict.escalate and verdict.outcome == KEPT_REFUSAL and verdict.note == REFUSAL_KEPT


def test_verifier_escalates_doubted_answers_and_lets_trusted_refusals_stand(verifier):
    policy = verified_policy(threshold=0.5)
    check = CheapAnswerCheck(policy, verifier)
    assert check.reads_whole_answer and check.threshold == 0.5
    decision = Router(policy).decide({})
    passages = ["The maintenance password for the Zephyr pump is BLUE-HERON-42."]
    grounded = CheapAnswer("It is BLUE-HERON-42.", "What is the password?", passages)
    invented = CheapAnswer("It is PURPLE-GIRAFFE-99, printed on the lid.", "What is the password?", passages)
    refusal = CheapAnswer("unanswerable", "What is the password?", passages)
    accepted = check.check(decision, grounded)
    assert not accepted.escalate and accepted.outcome == RAG and accepted.score >= 0.5
    assert accepted.note.startswith("verifier: P(good)=")
    escalated = check.check(decision, invented)
    assert escalated.escalate and escalated.outcome == FALLBACK and escalated.score < 0.5
    assert f"P(good)={escalated.score:.2f} < 0.50" in escalated.reason(decision)
    kept = check.check(decision, refusal)
    assert not kept.escalate and kept.outcome == KEPT_REFUSAL and "refusal kept" in kept.note
    # the same answers under the literal rule: only the refusal escalates
    literal = CheapAnswerCheck(decision_policy(classifier=False, default="rag"))
    assert [literal.check(decision, a).escalate for a in (grounded, invented, refusal)] == [False, False, True]


def test_threshold_from_the_policy_else_the_card(verifier):
    assert CheapAnswerCheck(verified_policy(threshold=0.7), verifier).threshold == 0.7
    from_card = CheapAnswerCheck(verified_policy(threshold=None), verifier)
    assert from_card.threshold == pytest.approx(verifier.threshold)
    # a verifier given to a policy without routing.verifier is not used
    assert CheapAnswerCheck(decision_policy(), verifier).verifier is None


def test_the_verdict_is_a_pure_function_of_refusal_and_score(verifier):
    check = CheapAnswerCheck(verified_policy(threshold=0.4), verifier)
    decision = Router(check.policy).decide({})
    assert check.verdict(decision, False, 0.39).escalate
    assert not check.verdict(decision, False, 0.40).escalate
    assert check.verdict(decision, True, 0.9).outcome == KEPT_REFUSAL
    assert check.verdict(decision, True, None).escalate  # no score: the literal rule
    long = Router(verified_policy(default_route="long")).decide({})
    assert long.route == LONG and not check.verdict(long, True, 0.0).escalate


def test_a_refusal_escalates_below_the_refusal_threshold_even_when_the_verifier_trusts_it(verifier):
    check = CheapAnswerCheck(verified_policy(threshold=0.3, refusal_threshold=0.8), verifier)
    decision = Router(check.policy).decide({})
    doubted = check.verdict(decision, True, 0.5)  # above the threshold, below the refusal threshold
    assert doubted.escalate and doubted.outcome == FALLBACK and "refusal with P(good)=0.50 < 0.80" in doubted.note
    assert check.verdict(decision, True, 0.8).outcome == KEPT_REFUSAL  # trusted enough: the refusal stands
    assert not check.verdict(decision, False, 0.5).escalate  # the refusal threshold reads refusals only
    assert check.verdict(decision, False, 0.2).escalate
    # the schema's default is Self-Route's rule: every refusal escalates, whatever the verifier says
    default = Policy.model_validate(
        {**BARE_MODELS, "routing": {"classifier": None, "default_route": "rag", "verifier": {"threshold": 0.0}}}
    )
    assert default.routing.verifier.refusal_threshold == 1.0
    assert CheapAnswerCheck(default, verifier).verdict(decision, True, 0.99).escalate
    # ...unless the keep-refusal option's evidence says the answer is absent
    keeping = verified_policy(
        threshold=0.0, refusal_threshold=1.0, fallback={"keep_refusal_when_absent": True, "absent_max_top_score": 0.35}
    )
    weak = replace(Router(keeping).decide({"top_score": 0.1}), probability=0.9)
    assert CheapAnswerCheck(keeping, verifier).verdict(weak, True, 0.5).outcome == KEPT_REFUSAL


def test_a_check_that_cannot_escalate_holds_nothing(verifier):
    decision = Router(verified_policy()).decide({})
    never = CheapAnswerCheck(verified_policy(threshold=0.0, refusal_threshold=None), verifier)
    assert not never.can_escalate and never.applies(decision) and not never.holds(decision)
    for escalating in (
        verified_policy(threshold=0.0, refusal_threshold=1.0),
        verified_policy(threshold=0.2, refusal_threshold=None),
    ):
        check = CheapAnswerCheck(escalating, verifier)
        assert check.can_escalate and check.holds(decision) and not check.holds(decision, has_document=False)
    literal = CheapAnswerCheck(decision_policy(classifier=False, default="rag"))
    assert literal.can_escalate and literal.holds(Router(literal.policy).decide({}))
    assert not CheapAnswerCheck(decision_policy(enabled=False)).can_escalate
