import yaml

from policies.edit import set_threshold
from policies.loader import parse_policy

POLICY = """# a policy with comments
name: t
cheap: {model: a/b}   # cheap
long: {model: a/c}
routing:
  # rules first
  rules: []
  classifier:
    model_path: builtin:default  # the shipped model
    threshold: 0.5
  default_route: long
"""


def test_threshold_written_in_place_keeping_comments():
    text = POLICY
    updated, kept = set_threshold(text, 0.6234, "calibrate: quantile of 100 out-of-fold P(cheap)")
    assert kept
    policy = parse_policy(updated)
    assert policy.routing.classifier.threshold == 0.6234
    assert policy.routing.classifier.threshold_source == "calibrate: quantile of 100 out-of-fold P(cheap)"
    # every other line is untouched: comments included, one line added
    assert [line for line in text.splitlines() if "threshold" not in line] == [
        line for line in updated.splitlines() if "threshold" not in line
    ]
    assert len(updated.splitlines()) == len(text.splitlines()) + 1
    again, _ = set_threshold(updated, 0.7, 'with "quotes": and colon')
    assert len(again.splitlines()) == len(updated.splitlines())
    assert parse_policy(again).routing.classifier.threshold_source == 'with "quotes": and colon'


def test_threshold_added_to_a_block_without_one():
    text = "# keep me\ncheap: {model: a/b}\nlong: {model: a/c}\nrouting:\n  classifier:\n    model_path: builtin:default  # note\n  default_route: long\n"
    updated, kept = set_threshold(text, 0.25, "s")
    assert kept and "# keep me" in updated and "# note" in updated
    assert parse_policy(updated).routing.classifier.threshold == 0.25
    assert parse_policy(updated).routing.default_route == "long"


def test_policy_without_classifier_block_is_rewritten_and_says_so():
    updated, kept = set_threshold("cheap: {model: a/b}\nlong: {model: a/c}\n", 0.4, "s")
    assert not kept
    assert yaml.safe_load(updated)["routing"]["classifier"] == {"threshold": 0.4, "threshold_source": "s"}


def test_a_nested_block_is_edited_in_place_and_a_missing_one_added():
    from policies.edit import set_values

    text = (
        "# header\nrouting:\n  verifier:\n    threshold: 0.2  # kept\n    relative:\n      pool: 1.5\n"
        "      window: 1000\n"
    )
    edited, kept = set_values(text, {"pool": 2.0, "per_token": True, "long_share": None}, "verifier.relative")
    assert kept and edited.startswith("# header\n") and "threshold: 0.2  # kept" in edited
    relative = yaml.safe_load(edited)["routing"]["verifier"]["relative"]
    assert relative == {"pool": 2.0, "window": 1000, "per_token": True, "long_share": None}
    added, kept = set_values("routing:\n  verifier:\n    threshold: 0.2\n", {"pool": 3.0}, "verifier.relative")
    assert not kept and yaml.safe_load(added)["routing"]["verifier"] == {"threshold": 0.2, "relative": {"pool": 3.0}}
    dropped, _ = set_values(text, {"relative": None}, "verifier")
    assert yaml.safe_load(dropped)["routing"]["verifier"]["relative"] is None
    # a nested block followed by another key: only the block's lines go
    middle = text.replace("      window: 1000\n", "      window: 1000\n    threshold_source: calibrated\n")
    dropped, kept = set_values(middle, {"relative": None}, "verifier")
    assert kept and yaml.safe_load(dropped)["routing"]["verifier"] == {
        "threshold": 0.2,
        "relative": None,
        "threshold_source": "calibrated",
    }
