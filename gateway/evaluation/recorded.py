"""Recorded traffic replayed: decisions recomputed from the ledger's stored features (request_features) with the live
decision functions (gateway.routing.decision.Router, gateway.routing.escalation.CheapAnswerCheck), for
`selfroute whatif`, `selfroute learn` and `selfroute calibrate --from-ledger`, which all read it with `read_recorded`.

Costs are estimated from what the ledger recorded for each request: its always-long counterfactual stands for a
long answer (a request answered long records that very leg as its counterfactual), and its cheap leg (the request's
cost less the long leg, or the whole cost of an accepted cheap answer) for a cheap one; a request whose cheap
answer was never produced (it went long) is given the median recorded cheap cost, and the candidate's verdict on it
is unknown: counted as accepted and reported as `unseen_cheap`. Quality is estimated only where a label exists
(gateway.ledger.labels.RecordedRequest.label): a cheap answer labelled worse than the long one loses a point, any
other answer is as good as the long route's.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from classifier.model import ModelFileError, RouteModel
from gateway.ledger.dialect import database_error_types
from gateway.ledger.errors import LedgerError
from gateway.ledger.keys import expiry_time
from gateway.ledger.labels import RecordedRequest, recorded_requests
from gateway.routing.decision import Router
from gateway.routing.escalation import CHECKED_ROUTES, CheapAnswerCheck
from gateway.routing.model_files import load_route_model, load_verifier_model
from policies.loader import PolicyError, load_policy
from policies.routes import FALLBACK, LONG
from policies.schema import Policy

if TYPE_CHECKING:
    from classifier.verifier import VerifierModel


class RecordedReadError(Exception):
    """The policy, its model files or the ledger could not be read; the message says which and why."""


@dataclass
class RecordedTraffic:
    """A policy, its models as the live gateway loads them, and the routed requests it recorded (with labels)."""

    policy: Policy
    policy_file: Path
    requests: list[RecordedRequest]
    route_model: RouteModel | None = None
    verifier: VerifierModel | None = None


def since_time(age: str) -> float:
    """Unix seconds `age` ago (30m, 12h, 7d, 4w)."""
    return 2 * time.time() - expiry_time(age)  # expiry_time is now + age: mirror it into the past


def read_recorded(
    policy_path: Path, location: str | Path, since: str, *, models: bool = True, own_requests: bool = False
) -> RecordedTraffic:
    """The one reader of recorded features: the policy at `policy_path`, its route model and verifier (`models`), and
    the requests recorded since the age `since` (only the policy's own with `own_requests`)."""
    # a tuple mypy can check (it does not read a starred name in an except clause)
    errors: tuple[type[BaseException], ...] = (
        PolicyError,
        ModelFileError,
        OSError,
        ValueError,
        LedgerError,
        *database_error_types()[0],
    )
    try:
        policy, policy_file = load_policy(policy_path)
        found = RecordedTraffic(policy, policy_file, [])
        if models:
            found.route_model = load_route_model(policy, policy_file)
            found.verifier = load_verifier_model(policy, policy_file)
        found.requests = recorded_requests(
            location, since=since_time(since), policy=policy.name if own_requests else None
        )
    except errors as exc:
        raise RecordedReadError(str(exc)) from exc
    return found


def _numbers(values: dict[str, Any] | None) -> dict[str, float]:
    """Stored features back as floats: null (a NaN when recorded, a feature absent) is NaN again."""
    return {k: (math.nan if v is None else float(v)) for k, v in (values or {}).items()}


@dataclass
class Replayed:
    request: RecordedRequest
    route: str  # what the policy would answer with: direct, rag, long, rag>long, kept-refusal
    cost_usd: float  # estimated
    unseen_cheap: bool = False  # a cheap route for a request whose cheap answer was never produced
    p_cheap: float | None = None
    p_good: float | None = None

    @property
    def answered_long(self) -> bool:
        return self.route in (LONG, FALLBACK)

    def quality(self) -> float | None:
        """1 when the answer is as good as the long route's, 0 when a cheap answer labelled worse stands."""
        label = self.request.label()
        if label is None:
            return None
        return 1.0 if self.answered_long or label else 0.0


def cheap_cost(request: RecordedRequest) -> float | None:
    """The recorded cost of the request's cheap leg, when it had one."""
    if request.features.get("p_good") is None and request.features.get("refused") is None:
        return None  # no cheap answer was checked: it went long (or was not checked)
    if request.features.get("escalated"):
        return max(request.cost_usd - request.counterfactual_cost_usd, 0.0)
    return request.cost_usd


def replay(requests: Sequence[RecordedRequest], policy: Policy, model=None, verifier=None) -> list[Replayed]:
    """Each request's answer under `policy` (with its classifier `model` and `verifier`, loaded by the caller)."""
    router = Router(policy, model)
    check = CheapAnswerCheck(policy, verifier)
    known = [c for c in (cheap_cost(r) for r in requests) if c is not None]
    median_cheap = statistics.median(known) if known else 0.0
    decisions = [router.decide(_numbers(r.features.get("features"))) for r in requests]
    # the verifier scores every checked answer in one call (a call per row is slow on a loaded machine)
    pending: list[tuple[int, dict[str, float]]] = []
    for i, (request, decision) in enumerate(zip(requests, decisions)):
        answer = request.features.get("verifier_features")
        if (
            check.verifier is not None
            and answer is not None
            and decision.route in CHECKED_ROUTES
            and check.applies(decision)
            and cheap_cost(request) is not None
        ):
            row = _numbers(answer)
            if "pre_route_probability" in row and decision.probability is not None:
                row["pre_route_probability"] = decision.probability  # the candidate's P(cheap) feeds its verifier
            pending.append((i, row))
    scores = (
        dict(zip((i for i, _ in pending), check.verifier.scores([row for _, row in pending])))
        if pending and check.verifier is not None
        else {}
    )
    out = []
    for i, (request, decision) in enumerate(zip(requests, decisions)):
        long_cost = request.counterfactual_cost_usd
        if decision.route == LONG:
            out.append(Replayed(request, LONG, long_cost, p_cheap=decision.probability))
            continue
        cheap = cheap_cost(request)
        if cheap is None:  # never answered cheaply: its verdict is unknown
            out.append(Replayed(request, decision.route, median_cheap, True, decision.probability))
            continue
        if decision.route not in CHECKED_ROUTES or not check.applies(decision):
            out.append(Replayed(request, decision.route, cheap, False, decision.probability))
            continue
        score = scores.get(i)
        if check.verifier is None and policy.routing.verifier is not None:
            score = request.features.get("p_good")  # no model given: the recorded score
        # in recorded order, per key: a relative threshold (routing.verifier.relative) reads each key's answers before
        long_tokens = request.features.get("long_tokens")
        verdict = check.verdict(decision, bool(request.features.get("refused")), score, request.key_id, long_tokens)
        cost = cheap + (long_cost if verdict.escalate else 0.0)
        out.append(Replayed(request, verdict.outcome, cost, False, decision.probability, score))
    return out


def summary(replayed: Sequence[Replayed]) -> dict[str, Any]:
    """Route mix, estimated cost against always-long, labelled quality."""
    always_long = sum(r.request.counterfactual_cost_usd for r in replayed)
    cost = sum(r.cost_usd for r in replayed)
    qualities = [q for q in (r.quality() for r in replayed) if q is not None]
    return {
        "requests": len(replayed),
        "routes": dict(sorted(Counter(r.route for r in replayed).items())),
        "long_share": sum(r.answered_long for r in replayed) / len(replayed) if replayed else 0.0,
        "cost_usd": cost,
        "always_long_cost_usd": always_long,
        "cost_share": cost / always_long if always_long else None,
        "unseen_cheap": sum(r.unseen_cheap for r in replayed),
        "labelled": len(qualities),
        "quality": 100.0 * sum(qualities) / len(qualities) if qualities else None,
    }


def recorded_summary(requests: Sequence[RecordedRequest]) -> dict[str, Any]:
    """What happened: the recorded routes and costs, as `summary` counts them."""
    replayed = []
    for r in requests:
        route = r.route or r.features.get("decision") or LONG
        replayed.append(
            Replayed(r, route, r.cost_usd, p_cheap=r.features.get("p_cheap"), p_good=r.features.get("p_good"))
        )
    return summary(replayed)


def thresholds_for_cost_share(
    requests: Sequence[RecordedRequest], max_cost_share: float, steps: int = 200
) -> tuple[float, dict[str, Any]] | None:
    """The verifier threshold answering the most requests long (escalating the least-trusted answers first) with the
    estimated cost at most `max_cost_share` of always-long, from the recorded P(good) alone (no labels). Requests
    that went long stay long. None when no recorded request was checked by a verifier."""
    scored: list[tuple[RecordedRequest, float, float]] = [
        (r, r.features["p_good"], cost)
        for r in requests
        if r.features.get("p_good") is not None and (cost := cheap_cost(r)) is not None
    ]
    if not scored:
        return None
    always_long = sum(r.counterfactual_cost_usd for r in requests)
    ids = {r.id for r, _, _ in scored}
    fixed = sum(r.cost_usd for r in requests if r.id not in ids)  # not checked by the verifier: as recorded
    candidates = sorted({0.0, 1.0, *[p for _, p, _ in scored]})
    if len(candidates) > steps:
        candidates = [candidates[int(i * (len(candidates) - 1) / steps)] for i in range(steps + 1)]
    best = None
    for t in candidates:
        cost = fixed + sum(cheap + (r.counterfactual_cost_usd if p < t else 0.0) for r, p, cheap in scored)
        share = cost / always_long if always_long else 0.0
        escalated = sum(p < t for _, p, _ in scored)
        if share <= max_cost_share + 1e-12 and (best is None or escalated > best[1]["escalated"]):
            best = (
                t,
                {
                    "threshold": t,
                    "cost_share": share,
                    "escalated": escalated,
                    "checked": len(scored),
                    "escalated_share": escalated / len(scored),
                },
            )
    return best
