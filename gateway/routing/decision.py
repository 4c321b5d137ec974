"""Decide the route of one request from its features: policy rules first, then the classifier,
then the policy's default route. No I/O: the model is loaded once by gateway.routing.model_files."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field

from classifier.model import RouteModel
from policies.schema import Policy, Route, RuleSpec

OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}
VERSION_CHARS = 16  # a model version as requests record it: this many hex digits of its file's sha256


@dataclass(frozen=True)
class RouteDecision:
    route: Route
    reason: str  # human-readable, e.g. "rule short-context: context_tokens=812 < 1500"
    rule: str | None = None  # name of the rule that fired
    probability: float | None = None  # classifier P(cheap route suffices), when a model is loaded
    features: dict[str, float] = field(default_factory=dict)


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else f"{value:.3g}"


def missing(value: float | None) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def rule_matches(rule: RuleSpec, features: dict[str, float]) -> bool:
    """A rule never matches a missing feature (e.g. top_score without a retrieval pass)."""
    value = features.get(rule.feature)
    return value is not None and not missing(value) and OPERATORS[rule.op](float(value), float(rule.value))


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

    @property
    def model_version(self) -> str | None:
        """The classifier's version as the ledger records it: the first 16 hex of its skops file's sha256."""
        if self.model is None or self.policy.routing.classifier is None or self.model.sha256 is None:
            return None
        return self.model.sha256[:VERSION_CHARS]

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
                reason = (
                    f"rule {name}: {rule.feature}={_fmt(float(features[rule.feature]))} {rule.op} {_fmt(rule.value)}"
                )
                return RouteDecision(rule.route, reason, name, probability, dict(features))
        classifier = self.policy.routing.classifier
        if probability is not None and classifier is not None:  # probability is None without a classifier
            threshold = classifier.threshold
            if probability >= threshold:
                reason = f"classifier: P(cheap)={probability:.2f} >= threshold {threshold:.2f}"
                return RouteDecision(Route.RAG, reason, None, probability, dict(features))
            reason = f"classifier: P(cheap)={probability:.2f} < threshold {threshold:.2f}"
            return RouteDecision(Route.LONG, reason, None, probability, dict(features))
        default = self.policy.routing.default_route
        why = "no classifier configured" if self.policy.routing.classifier is None else "no model loaded"
        return RouteDecision(default, f"default route {default} ({why})", None, None, dict(features))
