"""Policies validate at load; errors name the file, the line and the field."""

from __future__ import annotations

from importlib import resources

import pytest

from gateway.cli import main
from policies.loader import PolicyError, load_policy, parse_policy


@pytest.mark.parametrize("name", ["default.yaml", "hosted-example.yaml"])
def test_shipped_policies_are_valid(name):
    policy, path = load_policy(resources.files("policies").joinpath(name))
    assert policy.aliases and policy.cheap.model and policy.long.model
    assert path.name == name


def test_default_policy_runs_locally():
    policy, _ = load_policy()
    assert policy.cheap.model.startswith("local/") and policy.long.model.startswith("local/")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "name: x\ncheap: {model: a}\nlong:\n  model: b\n  timeout: -1\n",
            "p.yaml:5: long.timeout: Input should be greater than 0",
        ),
        ("name: x\ncheap: {model: a}\nlong: {model: b}\nbogus: 1\n", "p.yaml:4: bogus: Extra inputs are not permitted"),
        ("name: x\ncheap: {model: a}\n", "p.yaml:1: long: Field required"),
        (
            "cheap: {model: a}\nlong: {model: b}\nrouting:\n  rules:\n    - {feature: context_tokens, op: '~', value: 1, route: rag}\n",
            "p.yaml:5: routing.rules.0.op",
        ),
        ("cheap: {model: a, api_key_env: 'sk-abc123 secret'}\nlong: {model: b}\n", "p.yaml:1: cheap.api_key_env"),
        ("cheap: {model: a}\nlong: {model: b}\n  bad indent: [\n", "p.yaml:3: invalid YAML"),
        ("- just\n- a list\n", "p.yaml:1: a policy must be a YAML mapping"),
        # nested past Python's recursion limit: was a RecursionError (a 500 from POST /v1/admin/reload)
        ("cheap: " + "[" * 10_000 + "]" * 10_000 + "\n", "p.yaml: invalid YAML: nested too deeply"),
    ],
)
def test_errors_name_file_line_and_field(text, expected):
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, "p.yaml")
    assert expected in str(caught.value)


def test_unknown_rule_feature_is_rejected():
    with pytest.raises(PolicyError) as caught:
        parse_policy(
            "cheap: {model: a}\nlong: {model: b}\nrouting:\n  rules:\n"
            "    - {feature: context_tokenz, op: '<', value: 1, route: rag}\n",
            "p.yaml",
        )
    assert "p.yaml:5" in str(caught.value) and "context_tokenz" in str(caught.value)


def test_policy_check_command(tmp_path, capsys):
    assert main(["policy", "check"]) == 0
    out = capsys.readouterr().out
    assert ": valid" in out and "chunk_tokens: 200" in out  # defaults are filled in
    bad = tmp_path / "bad.yaml"
    bad.write_text("cheap: {model: a}\nlong: {model: b, timeout: zero}\n")
    assert main(["policy", "check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2: long.timeout" in err
