"""Decide the route of one request from its features: policy rules first, then the classifier,
then the policy's default route. No I/O in `decide`; the model is loaded once by `load_route_model`."""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from classifier.model import RouteModel
from gateway.model_files import builtin_model_path, load_model
from policies.schema import Policy, Route, RuleSpec

BUILTIN_PREFIX = "builtin:"

OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}


@dataclass(frozen=True)
class RouteDecision:
    route: Route
    reason: str  # human-readable, e.g. "rule short-context: context_tokens=812 < 1500"
    rule: str | None = None  # name of the rule that fired
    probability: float | None = None  # classifier P(cheap route suffices), when a model is loaded
    features: dict[str, float] = field(default_factory=dict)


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else f"{value:.3g}"


def _missing(value: float | None) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def rule_matches(rule: RuleSpec, features: dict[str, float]) -> bool:
    """A rule never matches a missing feature (e.g. top_score without a retrieval pass)."""
    value = features.get(rule.feature)
    return not _missing(value) and OPERATORS[rule.op](float(value), float(rule.value))


def rule_label(rule: RuleSpec, index: int) -> str:
    return rule.name or f"rules[{index}]"


class Router:
    def __init__(self, policy: Policy, model: RouteModel | None = None):
        self.policy = policy
        self.model = model

    @property
    def threshold(self) -> float | None:
        settings = self.policy.routing.classifier
        return settings.threshold if settings is not None else None

    def cheap_probability(self, features: dict[str, float]) -> float | None:
        if self.model is None or self.policy.routing.classifier is None:
            return None
        return self.model.cheap_probability(features)

    def decide(self, features: dict[str, float], probability: float | None = None) -> RouteDecision:
        """probability: a P(cheap) computed elsewhere (the replay's out-of-fold models); by default
        the loaded model scores the features."""
        if self.policy.routing.classifier is None:
            probability = None
        elif probability is None:
            probability = self.cheap_probability(features)
        for index, rule in enumerate(self.policy.routing.rules):
            if rule_matches(rule, features):
                name = rule_label(rule, index)
                reason = f"rule {name}: {rule.feature}={_fmt(float(features[rule.feature]))} {rule.op} {_fmt(rule.value)}"
                return RouteDecision(rule.route, reason, name, probability, dict(features))
        if probability is not None:
            threshold = self.threshold
            if probability >= threshold:
                reason = f"classifier: P(cheap)={probability:.2f} >= threshold {threshold:.2f}"
                return RouteDecision("rag", reason, None, probability, dict(features))
            reason = f"classifier: P(cheap)={probability:.2f} < threshold {threshold:.2f}"
            return RouteDecision("long", reason, None, probability, dict(features))
        default = self.policy.routing.default_route
        why = "no classifier configured" if self.policy.routing.classifier is None else "no model loaded"
        return RouteDecision(default, f"default route {default} ({why})", None, None, dict(features))

    def keep_refusal(self, decision: RouteDecision) -> bool:
        """When the cheap route answered "unanswerable": keep that answer instead of escalating, if the
        policy allows it and the evidence says the answer is absent from the documents."""
        fallback = self.policy.routing.fallback
        if not fallback.keep_refusal_when_absent:
            return False
        return refusal_evidence(decision.features, decision.probability, fallback)


def refusal_evidence(features: dict[str, float], probability: float | None, fallback) -> bool:
    """Absent-answer evidence: weak best retrieval match AND a classifier confident the cheap route
    suffices (so a long read is not expected to find what retrieval missed)."""
    top = features.get("top_score")
    if _missing(top) or probability is None:
        return False
    return float(top) <= fallback.absent_max_top_score and probability >= fallback.absent_min_probability


def resolve_model_path(model_path: str, policy_file: Path | None) -> Path:
    """'builtin:default' -> the shipped model; other paths are relative to the policy file."""
    if model_path.startswith(BUILTIN_PREFIX):
        name = model_path[len(BUILTIN_PREFIX):]
        if name != "default":
            raise ValueError(f"unknown builtin model {model_path!r}; the only one is 'builtin:default'")
        return builtin_model_path()
    path = Path(model_path).expanduser()
    if not path.is_absolute() and policy_file is not None:
        path = Path(policy_file).parent / path
    return path


def load_route_model(policy: Policy, policy_file: Path | None = None) -> RouteModel | None:
    """The policy's classifier, or None when the policy routes without one."""
    settings = policy.routing.classifier
    if settings is None:
        return None
    return load_model(resolve_model_path(settings.model_path, policy_file))
