"""What the ledger keeps for learning about one routed request (request_features, migration 010).

A versioned JSON object: the pre-route features and P(cheap) the decision was made on, the classifier threshold in
force and the classifier's version (`classifier_model`: 16 hex of its file's sha256), the decision, and, for a checked
cheap answer, the verifier's features, P(good), its threshold, its version (`verifier_model`) and the outcome. `selfroute learn`, `whatif` and `calibrate --from-ledger` read it back and recompute decisions with the
live decision functions (gateway.routing.decision, gateway.routing.escalation). The question, passages and answers
are kept only when the policy sets `ledger.store_texts: true`.
"""

from __future__ import annotations

import hashlib
from typing import Any

from gateway.routing.decision import RouteDecision
from gateway.routing.escalation import Verdict

VERSION = 1


def pre_route(
    decision: RouteDecision, threshold: float | None, group: str | None = None, model: str | None = None
) -> dict[str, Any]:
    """The decision's part, recorded when the route is chosen. `group`: the documents' identity (a hash of
    content hashes), so refits can fold by document without keeping any text; `model`: the classifier's version
    (Router.model_version) that scored it."""
    return {
        "version": VERSION,
        "features": dict(decision.features),
        "p_cheap": decision.probability,
        "threshold": threshold,
        "classifier_model": model,
        "rule": decision.rule,
        "decision": str(decision.route),
        "group": hashlib.sha256(group.encode("utf-8")).hexdigest()[:16] if group else None,
    }


def add_verdict(
    record: dict[str, Any],
    verdict: Verdict,
    threshold: float | None,
    model: str | None = None,
    shadow_chance: float | None = None,
) -> dict[str, Any]:
    """The check's part: what the verifier read, its score, its version (CheapAnswerCheck.model_version) and the
    outcome. The threshold is the one the answer was decided with (a relative threshold's value for this key, else
    the policy's); `long_tokens`, what a relative threshold charged the answer's long leg (its key's window reads it
    back at start-up: gateway.ledger.labels.recent_answers); `shadow_chance`, with shadows on, the chance an accepted
    answer was shadowed under the settings in force (a shadow label stands for 1 / it; the shadow_backoff scale
    changes it between refits)."""
    record.update(
        {
            "verifier_features": verdict.features,
            "p_good": verdict.score,
            "verifier_threshold": verdict.threshold if verdict.threshold is not None else threshold,
            "verifier_model": model,
            "refused": verdict.refused,
            "escalated": verdict.escalate,
            "outcome": verdict.outcome,
        }
    )
    if verdict.long_tokens is not None:
        record["long_tokens"] = verdict.long_tokens
    if shadow_chance is not None:
        record["shadow_chance"] = shadow_chance
    return record


def add_texts(
    record: dict[str, Any], question: str | None, passages: list[str] | None, cheap: str | None, long: str | None = None
) -> dict[str, Any]:
    """Only with ledger.store_texts: the question, the passages sent to the cheap model and the answers."""
    record["texts"] = {
        "question": question,
        "passages": list(passages or []),
        "cheap_answer": cheap,
        "long_answer": long,
    }
    return record
