"""The test policy, built rather than written out as YAML in each test.

`policy_data(base)` is the policy most gateway tests run: both routes on the fake upstream at `base`
(tests/support/fake_upstream.py), priced so costs are visible, no classifier, the long route by default, any model
name passed through. A test states only what it changes: `make_policy(base, long={"model": "openai/sleep-30"})`.
Overrides merge into the defaults section by section (a dict into a dict, anything else replaces the value);
`DROP` removes a key. A route built by `fake_route` or `model_route` replaces the route whole (nothing of the
default's prices or window stays): `make_policy(base, cheap=fake_route(base, "slow", timeout=0.3))`.

It is not the shipped default (policies/default.yaml): that one runs SmolLM2 in-process with a classifier and a
verifier; tests that mean the shipped policy load it with `policies.loader.load_policy()`, or write it with
overrides merged the same way (`write_shipped_policy`).

Built on these: `routing_policy` (the routed-gateway tests: RAG by default, rules, the toy verifier, alternates),
`learning_policy`, `prompt_cache_policy` (a long route whose provider caches prompts), `bench_policy` (the
benchmarks'), and, for the decision logic without any upstream, `bare_policy`, `decision_policy`, `verified_policy`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from policies.loader import parse_policy, shipped_policy_path
from policies.schema import LearningSettings, ModelConfig, Policy

DROP: Any = object()  # as an override's value: remove that key from the policy


class Whole(dict):
    """An override that replaces its section instead of merging into it."""


def fake_route(base: str, model: str, **fields: Any) -> Whole:
    """A route on the fake upstream: `openai/<model>` at `base`, with the given fields and nothing else."""
    return Whole(model=f"openai/{model}", api_base=f"{base}/v1", **fields)


def model_route(model: str, **fields: Any) -> Whole:
    """A route on any litellm model string (a hosted provider, local/...), with the given fields and nothing else."""
    return Whole(model=model, **fields)


def policy_data(base: str | None, **overrides: Any) -> dict[str, Any]:
    """The test policy as the dict its YAML would load to, with `overrides` merged in (see the module docstring).
    Without a fake upstream (base None) there are no default routes: the overrides name both."""
    data: dict[str, Any] = {"name": "test", "aliases": ["selfroute"]}
    if base is not None:
        data["cheap"] = fake_route(
            base, "fake-cheap", input_cost_per_mtok=1.0, output_cost_per_mtok=2.0, context_window=8192
        )
        data["long"] = fake_route(
            base, "fake-long", input_cost_per_mtok=10.0, output_cost_per_mtok=20.0, context_window=16000
        )
    data["routing"] = {"classifier": None, "default_route": "long"}
    # the tests pass any name through to the fake upstream (not to providers of local services)
    data["passthrough"] = {"allow": ["*"]}
    return merged(data, overrides)


def merged(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`data` with `overrides` merged in: dicts key by key, other values replaced, DROP removing the key."""
    out = _plain(data)
    for key, value in overrides.items():
        if value is DROP:
            out.pop(key, None)
        elif isinstance(value, dict) and not isinstance(value, Whole) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = _plain(value)
    return out


def _plain(value: Any) -> Any:
    """A deep copy with every Whole a plain dict (what yaml.safe_dump can write)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def policy_yaml(base: str | None, **overrides: Any) -> str:
    return yaml.safe_dump(policy_data(base, **overrides), sort_keys=False)


def make_policy(base: str | None, **overrides: Any) -> Policy:
    """The test policy, parsed and validated as a policy file is."""
    return parse_policy(policy_yaml(base, **overrides), "test-policy.yaml")


def write_policy(path: Path, base: str | None, **overrides: Any) -> Path:
    """The test policy as a YAML file at `path` (for the CLI: `serve --policy`, `policy check`), returned."""
    path.write_text(policy_yaml(base, **overrides))
    return path


def rule(name: str, feature: str, op: str, value: float, route: str) -> dict[str, Any]:
    """One routing rule (routing.rules): `route` when `feature op value`."""
    return {"name": name, "feature": feature, "op": op, "value": value, "route": route}


VERIFIER_THRESHOLD = 0.5  # P(good) below this escalates, in the routing tests' policy


def routing_policy(
    base: str,
    cheap: str = "fake-cheap",
    rules: list[dict[str, Any]] | tuple = (),
    verifier: str | None = None,
    long: str = "fake-long",
    alternates: tuple[str, ...] = (),
    on_long_error: str = "return_cheap",
    long_window: int = 16000,
    verifier_threshold: float = VERIFIER_THRESHOLD,
    refusal_threshold: float | None = None,
) -> Policy:
    """The routing tests' policy: fake-upstream models by name, the RAG route by default with a small budget,
    fallback on, the verifier at `verifier` (a model file) if given (refusals left to its threshold unless
    `refusal_threshold` is set), only the policy's models passed through."""
    routing: dict[str, Any] = {
        "rules": list(rules),
        "default_route": "rag",
        "fallback": {"enabled": True, "on_long_error": on_long_error},
    }
    if verifier is not None:
        routing["verifier"] = {
            "model_path": verifier,
            "threshold": verifier_threshold,
            "refusal_threshold": refusal_threshold,
        }
    return make_policy(
        base,
        name="routing-test",
        cheap={"model": f"openai/{cheap}"},
        long={"model": f"openai/{long}", "context_window": long_window},
        long_alternates=[fake_route(base, m) for m in alternates],
        rag={"top_k": 4, "context_budget_tokens": 400},
        routing=routing,
        passthrough=DROP,
    )


CACHE_PRICES = {"cached_input_cost_per_mtok": 1.0, "cache_write_cost_per_mtok": 12.5}


def prompt_cache_policy(
    base: str,
    *,
    name: str,
    long: str = "fake-long",
    cheap: str = "fake-cheap",
    cache_control: bool | None = None,
    window: int = 16000,
    min_tokens: int | None = None,
) -> Policy:
    """The test policy with a long route whose provider caches prompts (read and write prices; `cache_control`
    and `prompt_cache_min_tokens` as given, else the schema's defaults), only the policy's models passed through."""
    long_route: dict[str, Any] = {"model": f"openai/{long}", "context_window": window, **CACHE_PRICES}
    if cache_control is not None:
        long_route["cache_control"] = cache_control
    if min_tokens is not None:
        long_route["prompt_cache_min_tokens"] = min_tokens
    return make_policy(
        base,
        name=name,
        cheap={"model": f"openai/{cheap}", "context_window": DROP},
        long=long_route,
        passthrough=DROP,
    )


def shipped_policy_data(**overrides: Any) -> dict[str, Any]:
    """The shipped default (policies/default.yaml) as a dict, with `overrides` merged in as for the test policy."""
    return merged(yaml.safe_load(shipped_policy_path().read_text()), overrides)


def write_shipped_policy(path: Path, **overrides: Any) -> Path:
    """The shipped default with `overrides`, as a YAML file at `path` (without the shipped file's comments)."""
    path.write_text(yaml.safe_dump(shipped_policy_data(**overrides), sort_keys=False))
    return path


def bench_policy(path: Path, upstream_port: int, long_window: int, **overrides: Any) -> Path:
    """The benchmarks' policy file (bench_replicas, bench_routed): bench-cheap and bench-long on the instant upstream
    at `upstream_port`, priced as small and large hosted models, the long window `long_window`."""
    base = f"http://127.0.0.1:{upstream_port}"
    return write_policy(
        path,
        base,
        cheap=fake_route(base, "bench-cheap", context_window=8192, input_cost_per_mtok=0.15, output_cost_per_mtok=0.6),
        long=fake_route(
            base, "bench-long", context_window=long_window, input_cost_per_mtok=2.0, output_cost_per_mtok=8.0
        ),
        passthrough=DROP,
        **overrides,
    )


def bare_policy(cheap: str | dict[str, Any], long: str | dict[str, Any], **sections: Any) -> Policy:
    """A policy of only what is given, every other field at the schema's default; a route by its model string or
    as a dict of its fields."""
    routes = {role: {"model": r} if isinstance(r, str) else r for role, r in (("cheap", cheap), ("long", long))}
    return parse_policy(yaml.safe_dump({**routes, **_plain(sections)}, sort_keys=False), "test-policy.yaml")


BARE_MODELS = {"cheap": {"model": "openai/cheap"}, "long": {"model": "openai/long"}}  # never called


def decision_policy(rules=(), classifier=True, threshold=0.5, default="long", **fallback) -> Policy:
    """A policy for the decision logic alone (gateway.routing.decision): rules, a classifier threshold, fallback."""
    routing = {"rules": list(rules), "default_route": default, "fallback": fallback}
    routing["classifier"] = {"threshold": threshold} if classifier else None
    return Policy.model_validate({**BARE_MODELS, "routing": routing})


def learning_policy(
    base: str, verifier_file, judge: str = "judge", long: str = "fake-long", store_texts=False, **learning
) -> Policy:
    """The routing tests' policy with the toy verifier, the cheap model scripted, and learning on: the judge
    `judge` on the fake upstream, `learning` settings, the texts kept in the ledger if `store_texts`."""
    policy = routing_policy(base, cheap="cheap-scripted", verifier=str(verifier_file), long=long)
    settings = LearningSettings(
        judge=True,
        judge_model=ModelConfig(
            model=f"openai/{judge}", api_base=f"{base}/v1", input_cost_per_mtok=5.0, output_cost_per_mtok=5.0
        ),
        **learning,
    )
    return policy.model_copy(
        update={
            "routing": policy.routing.model_copy(update={"learning": settings}),
            "ledger": policy.ledger.model_copy(update={"store_texts": store_texts}),
        }
    )


def verified_policy(threshold=0.5, refusal_threshold=None, **routing) -> Policy:
    """A policy for the answer check alone (gateway.routing.escalation): RAG by default, a verifier at `threshold`;
    refusal_threshold None (the verifier alone decides refusals) unless a test sets it."""
    return Policy.model_validate(
        {
            **BARE_MODELS,
            "routing": {
                "classifier": None,
                "default_route": "rag",
                "verifier": {
                    "model_path": "unused.skops",
                    "threshold": threshold,
                    "refusal_threshold": refusal_threshold,
                },
                **routing,
            },
        }
    )
