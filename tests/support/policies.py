"""The test policy, built rather than written out as YAML in each test.

`policy_data(base)` is the policy most gateway tests run: both routes on the fake upstream at `base`
(tests/support/fake_upstream.py), priced so costs are visible, no classifier, the long route by default, any model
name passed through. A test states only what it changes: `make_policy(base, long={"model": "openai/sleep-30"})`.
Overrides merge into the defaults section by section (a dict into a dict, anything else replaces the value);
`DROP` removes a key. A route built by `fake_route` or `model_route` replaces the route whole (nothing of the
default's prices or window stays): `make_policy(base, cheap=fake_route(base, "slow", timeout=0.3))`.

It is not the shipped default (policies/default.yaml): that one runs SmolLM2 in-process with a classifier and a
verifier; tests that mean the shipped policy load it with `policies.loader.load_policy()`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from policies.loader import parse_policy
from policies.schema import Policy

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
) -> Policy:
    """The routing tests' policy: fake-upstream models by name, the RAG route by default with a small budget,
    fallback on, the verifier at `verifier` (a model file) if given, only the policy's models passed through."""
    routing: dict[str, Any] = {
        "rules": list(rules),
        "default_route": "rag",
        "fallback": {"enabled": True, "on_long_error": on_long_error},
    }
    if verifier is not None:
        routing["verifier"] = {"model_path": verifier, "threshold": VERIFIER_THRESHOLD}
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
