import math

import pytest

from gateway.routing.decision import Router
from gateway.routing.model_files import load_route_model, resolve_model_path
from policies.loader import PolicyError, parse_policy
from tests.support.policies import decision_policy
from tests.support.routed import FixedModel


@pytest.mark.parametrize(
    "op, value, fires_at, silent_at",
    [
        ("<", 1500, 1499, 1500),
        ("<=", 1500, 1500, 1501),
        (">", 20, 21, 20),
        (">=", 20, 20, 19),
        ("==", 3, 3, 4),
        ("!=", 3, 4, 3),
    ],
)
def test_each_operator_fires_as_written(op, value, fires_at, silent_at):
    policy = decision_policy([{"name": "r", "feature": "context_tokens", "op": op, "value": value, "route": "direct"}])
    router = Router(policy, FixedModel(0.9))
    hit = router.decide({"context_tokens": fires_at})
    assert hit.route == "direct" and hit.rule == "r"
    assert hit.reason == f"rule r: context_tokens={fires_at} {op} {value}"
    miss = router.decide({"context_tokens": silent_at})
    assert miss.rule is None and miss.route == "rag"


def test_first_matching_rule_wins_and_unnamed_rules_get_an_index_name():
    policy = decision_policy(
        [
            {"feature": "cross_ref_count", "op": ">=", "value": 20, "route": "long"},
            {"name": "second", "feature": "cross_ref_count", "op": ">=", "value": 5, "route": "rag"},
        ]
    )
    router = Router(policy, None)
    assert router.decide({"cross_ref_count": 25}).rule == "rules[0]"
    assert router.decide({"cross_ref_count": 25}).route == "long"
    assert router.decide({"cross_ref_count": 7}).rule == "second"


def test_missing_feature_never_matches_even_not_equal():
    policy = decision_policy([{"name": "weak", "feature": "top_score", "op": "!=", "value": 0.5, "route": "long"}])
    decision = Router(policy, FixedModel(0.8)).decide({"top_score": math.nan})
    assert decision.rule is None and decision.route == "rag"


def test_classifier_threshold_both_sides_and_reason():
    policy = decision_policy(threshold=0.6)
    above = Router(policy, FixedModel(0.71)).decide({})
    assert above.route == "rag" and above.probability == 0.71
    assert above.reason == "classifier: P(cheap)=0.71 >= threshold 0.60"
    at = Router(policy, FixedModel(0.6)).decide({})
    assert at.route == "rag"
    below = Router(policy, FixedModel(0.42)).decide({})
    assert below.route == "long" and below.reason == "classifier: P(cheap)=0.42 < threshold 0.60"
    # a probability passed in (the replay's out-of-fold model) is used instead of the loaded model
    model = FixedModel(0.99)
    assert Router(policy, model).decide({}, probability=0.1).route == "long" and model.seen == []


def test_default_route_without_classifier():
    no_classifier = Router(decision_policy(classifier=False, default="rag"), FixedModel(0.9)).decide({})
    assert no_classifier.route == "rag" and no_classifier.probability is None
    assert "no classifier" in no_classifier.reason
    no_model = Router(decision_policy(default="long"), None).decide({})
    assert no_model.route == "long" and "no model" in no_model.reason


def test_rule_decision_still_carries_the_probability_and_features():
    policy = decision_policy(
        [{"name": "short", "feature": "context_tokens", "op": "<", "value": 1500, "route": "direct"}]
    )
    decision = Router(policy, FixedModel(0.3)).decide({"context_tokens": 812})
    assert decision.reason == "rule short: context_tokens=812 < 1500"
    assert decision.probability == 0.3 and decision.features == {"context_tokens": 812}


def test_rule_on_unknown_feature_fails_at_load_with_the_known_names():
    text = """
cheap: {model: openai/cheap}
long: {model: openai/long}
routing:
  rules:
    - feature: context_tokns
      op: "<"
      value: 10
      route: direct
"""
    with pytest.raises(PolicyError) as err:
        parse_policy(text, "p.yaml")
    message = str(err.value)
    assert "p.yaml:6" in message and "context_tokns" in message and "context_tokens" in message


def test_model_paths_resolve_builtin_and_relative_to_the_policy(tmp_path):
    assert resolve_model_path("builtin:default", None).name == "default.skops"
    assert resolve_model_path("models/m.skops", tmp_path / "policy.yaml") == tmp_path / "models" / "m.skops"
    assert resolve_model_path(str(tmp_path / "abs.skops"), None) == tmp_path / "abs.skops"
    with pytest.raises(ValueError):
        resolve_model_path("builtin:other", None)
    assert load_route_model(decision_policy(classifier=False)) is None
