"""Self-Route's second step, written once: after the cheap route answered, keep its answer or escalate.

The live path (plain and streaming) and the offline replay both call `check_cheap_answer`, so the replay
measures exactly the rule the gateway applies.
"""
from __future__ import annotations

from dataclasses import dataclass

from gateway.routing.decision import RouteDecision, missing
from policies.routes import FALLBACK, KEPT_REFUSAL, RAG
from policies.schema import FallbackSettings, Policy

REFUSAL_KEPT = "refusal kept: evidence says the answer is absent"
ESCALATED = "cheap answer was unanswerable, fell back to long"


@dataclass(frozen=True)
class Verdict:
    escalate: bool  # answer again on the long route
    outcome: str  # RAG (answer accepted), KEPT_REFUSAL (a refusal let stand) or FALLBACK (escalated)
    note: str | None = None  # appended to the decision's reason

    def reason(self, decision: RouteDecision) -> str:
        return f"{decision.reason}; {self.note}" if self.note else decision.reason


ACCEPTED = Verdict(False, RAG)


def applies(policy: Policy, decision: RouteDecision) -> bool:
    """Whether the cheap answer of this decision is checked at all (it is held back while streaming if so)."""
    return decision.route == RAG and policy.routing.fallback.enabled


def check_cheap_answer(policy: Policy, decision: RouteDecision, refused: bool) -> Verdict:
    """`refused`: the cheap answer says the passages lack the answer (pipelines.unanswerable)."""
    if not applies(policy, decision) or not refused:
        return ACCEPTED
    if keep_refusal(policy.routing.fallback, decision):
        return Verdict(False, KEPT_REFUSAL, REFUSAL_KEPT)
    return Verdict(True, FALLBACK, ESCALATED)


def keep_refusal(fallback: FallbackSettings, decision: RouteDecision) -> bool:
    """Keep a refusal instead of escalating when the policy allows it and the evidence says the answer is
    absent: a weak best retrieval match AND a classifier confident the cheap route suffices (so a long read
    is not expected to find what retrieval missed)."""
    return fallback.keep_refusal_when_absent and refusal_evidence(decision.features, decision.probability, fallback)


def refusal_evidence(features: dict[str, float], probability: float | None, fallback: FallbackSettings) -> bool:
    """The absent-answer evidence alone (also scored by `selfroute eval absent`)."""
    top = features.get("top_score")
    if missing(top) or probability is None:
        return False
    return float(top) <= fallback.absent_max_top_score and probability >= fallback.absent_min_probability
