"""A policy's effective model limits: each model's context window, output limit and prices, and what the routes
pack for them.

A model's window and output limit come from the policy, else from litellm's model information (its bundled
cost map, read as a file: no network, no litellm import), else, for the in-process `local/` models, from the
context the local upstream gives them. A hosted model litellm does not know has no window to pack for: it must
be given one (`context_window` in the policy, `--cheap-window` / `--long-window` with a model override).

`--cheap-model` / `--long-model` replace the policy's model with that model and nothing the policy said about
its predecessor: the window, output limit, prices and timeout are the new model's, and the route's
sizing the policy tuned for the old model (the long route's `window_tokens` and answer reserve, the cheap
route's RAG budget) follows the new model's class. The class defaults for hosted models are the ones of
`policies/hosted-example.yaml`.
"""

from __future__ import annotations

import functools
import importlib.util
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from policies.loader import PolicyError
from policies.schema import ModelConfig, Policy

LOCAL_PREFIX = "local/"
# the context the in-process upstream (gateway.upstreams.local) opens every local model with
LOCAL_CONTEXT_WINDOW = 8192
# the windows assumed before model information was used, kept for policies built in code (tests, benchmarks)
# whose made-up model names litellm cannot know; a policy file gets an error instead
ASSUMED_LONG_WINDOW = 128_000
ASSUMED_CHEAP_WINDOW = 8192
COST_MAP_FILE = "model_prices_and_context_window_backup.json"


@dataclass(frozen=True)
class HostedDefaults:
    """Settings a hosted model gets when nothing was said about it (hosted-example.yaml's values)."""

    cheap_timeout_s: float = 60.0
    long_timeout_s: float = 300.0  # a prompt of a few hundred thousand tokens takes minutes to read and answer
    rag_budget_tokens: int = 3000
    answer_reserve_tokens: int = 1024


HOSTED = HostedDefaults()


class LimitsError(PolicyError):
    """A model whose window cannot be known, or limits that do not fit together."""


@dataclass(frozen=True)
class ModelLimits:
    role: str  # cheap, long, long_alternates[0], ...
    model: str
    context_window: int
    window_source: str  # policy, flag, litellm, local, assumed
    max_output_tokens: int | None
    input_cost_per_mtok: float | None
    output_cost_per_mtok: float | None
    price_source: str  # policy, litellm, or unpriced
    timeout_s: float
    max_retries: int

    def describe(self) -> str:
        output = f"{self.max_output_tokens:,}" if self.max_output_tokens else "?"
        if self.input_cost_per_mtok is None:
            price = "unpriced"
        else:
            price = f"${self.input_cost_per_mtok:g}/${self.output_cost_per_mtok or 0:g} per Mtok ({self.price_source})"
        return (
            f"{self.role}: {self.model}: window {self.context_window:,} ({self.window_source}), output "
            f"{output}, {price}, timeout {self.timeout_s:g}s, {self.max_retries} retries"
        )


@dataclass(frozen=True)
class EffectiveLimits:
    models: tuple[ModelLimits, ...]
    long_window_tokens: int  # what the long route packs for
    answer_reserve_tokens: int
    direct_window_tokens: int  # what the direct route packs for (the cheap model's window)
    rag_budget_tokens: int
    changes: tuple[str, ...] = ()  # what a model override changed in the policy, and why
    warnings: tuple[str, ...] = field(default=())

    @property
    def long_packing_tokens(self) -> int:
        """The most document and question tokens a long prompt carries: the window less the answer reserve."""
        return self.long_window_tokens - self.answer_reserve_tokens

    def lines(self) -> list[str]:
        """What `serve` prints at start-up and `policy check` shows."""
        out = [m.describe() for m in self.models]
        out.append(
            f"long route: packs up to {self.long_packing_tokens:,} tokens (window {self.long_window_tokens:,} "
            f"less {self.answer_reserve_tokens:,} kept for the answer)"
        )
        out.append(
            f"direct route: up to {self.direct_window_tokens - self.answer_reserve_tokens:,} tokens; "
            f"rag route: {self.rag_budget_tokens:,} tokens of passages"
        )
        out += [f"override: {c}" for c in self.changes]
        out += [f"warning: {w}" for w in self.warnings]
        return out

    def to_dict(self) -> dict:
        return {
            "models": [asdict(m) for m in self.models],
            "long_window_tokens": self.long_window_tokens,
            "answer_reserve_tokens": self.answer_reserve_tokens,
            "long_packing_tokens": self.long_packing_tokens,
            "direct_window_tokens": self.direct_window_tokens,
            "rag_budget_tokens": self.rag_budget_tokens,
            "changes": list(self.changes),
            "warnings": list(self.warnings),
        }


@functools.lru_cache(maxsize=1)
def _cost_map() -> dict:
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = Path(list(spec.submodule_search_locations)[0]) / COST_MAP_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def cost_map() -> dict:
    """litellm's bundled cost map (model -> prices and limits), read once as a file; {} without litellm."""
    return _cost_map()


def model_info(model: str) -> dict | None:
    """litellm's entry for a model string (`openai/gpt-4.1` is the map's `gpt-4.1`), or None. A provider's name
    without its prefix matches only an entry of that provider, so `hosted_vllm/gpt-4.1` is not OpenAI's."""
    if model.startswith(LOCAL_PREFIX):
        return None
    entries = _cost_map()
    provider, slash, name = model.partition("/")
    entry = entries.get(model)
    if isinstance(entry, dict):
        return entry
    if slash and isinstance(entries.get(name), dict) and entries[name].get("litellm_provider") == provider:
        return entries[name]
    return None


def is_local(config: ModelConfig) -> bool:
    return config.model.startswith(LOCAL_PREFIX)


def _window_of(entry: dict | None) -> int | None:
    if not entry:
        return None
    value = entry.get("max_input_tokens") or entry.get("max_tokens")
    return int(value) if value else None


def _resolve_model(
    config: ModelConfig, role: str, *, window: int | None, strict: bool, long_route: bool, flag: str
) -> tuple[ModelConfig, ModelLimits]:
    entry = model_info(config.model)
    update: dict = {}
    if window is not None:
        update["context_window"], source = window, "flag"
    elif config.context_window is not None:
        source = "policy"
    elif is_local(config):
        update["context_window"], source = LOCAL_CONTEXT_WINDOW, "local"
    elif _window_of(entry):
        update["context_window"], source = _window_of(entry), "litellm"
    elif strict:
        raise LimitsError(
            f"{role}.model: {config.model!r} is not in litellm's model information, so its context window is "
            f"unknown: give " + (f"its window with {flag} TOKENS" if flag else f"{role}.context_window in the policy")
        )
    else:
        update["context_window"], source = (ASSUMED_LONG_WINDOW if long_route else ASSUMED_CHEAP_WINDOW), "assumed"
    if config.max_output_tokens is None and entry and entry.get("max_output_tokens"):
        update["max_output_tokens"] = int(entry["max_output_tokens"])
    if not is_local(config):  # a hosted model's class defaults, where the policy said nothing
        if "timeout" not in config.model_fields_set:
            update["timeout"] = HOSTED.long_timeout_s if long_route else HOSTED.cheap_timeout_s
    resolved = config.model_copy(update=update)
    assert resolved.context_window is not None  # the policy gave it or a branch above set it
    prices: tuple[float | None, float | None, str]
    if resolved.input_cost_per_mtok is not None or resolved.output_cost_per_mtok is not None:
        prices = (resolved.input_cost_per_mtok or 0.0, resolved.output_cost_per_mtok or 0.0, "policy")
    elif entry and "input_cost_per_token" in entry:
        prices = (
            float(entry.get("input_cost_per_token") or 0) * 1e6,
            float(entry.get("output_cost_per_token") or 0) * 1e6,
            "litellm",
        )
    else:
        prices = (None, None, "unpriced")
    input_cost, output_cost, price_source = prices
    limits = ModelLimits(
        role,
        resolved.model,
        int(resolved.context_window),
        source,
        resolved.max_output_tokens,
        input_cost,
        output_cost,
        price_source,
        resolved.timeout,
        resolved.max_retries,
    )
    return resolved, limits


def _override(policy: Policy, role: str, model: str, changes: list[str]) -> Policy:
    """The policy with `role`'s model replaced by a fresh config of `model`, and that route's sizing made the new
    model's: nothing the policy tuned for the model it had carries over to a different one."""
    old: ModelConfig = getattr(policy, role)
    update: dict = {role: ModelConfig(model=model)}
    hosted = not model.startswith(LOCAL_PREFIX)
    changes.append(f"--{role}-model {model} replaces {old.model} (its window, prices and timeout with it)")
    if role == "long":
        settings = policy.long_context
        if settings.window_tokens is not None:
            changes.append(
                f"long_context.window_tokens {settings.window_tokens:,} dropped: the long route packs "
                "for the new model's window"
            )
        reserve = HOSTED.answer_reserve_tokens if hosted else settings.answer_reserve_tokens
        if reserve != settings.answer_reserve_tokens:
            changes.append(
                f"long_context.answer_reserve_tokens {settings.answer_reserve_tokens:,} -> {reserve:,} "
                "(a hosted model's)"
            )
        update["long_context"] = settings.model_copy(update={"window_tokens": None, "answer_reserve_tokens": reserve})
    else:
        budget = HOSTED.rag_budget_tokens if hosted else policy.rag.context_budget_tokens
        if budget != policy.rag.context_budget_tokens:
            changes.append(
                f"rag.context_budget_tokens {policy.rag.context_budget_tokens:,} -> {budget:,} (a hosted model's)"
            )
            update["rag"] = policy.rag.model_copy(update={"context_budget_tokens": budget})
    return policy.model_copy(update=update)


def effective_policy(
    policy: Policy,
    *,
    cheap_model: str | None = None,
    long_model: str | None = None,
    cheap_window: int | None = None,
    long_window: int | None = None,
    strict: bool = True,
) -> tuple[Policy, EffectiveLimits]:
    """The policy as the gateway runs it (overrides applied, every model's window, output limit and timeout filled
    in) and its effective limits. strict: a hosted model with no known window is a LimitsError
    (non-strict: the windows assumed before, for policies built in code)."""
    changes: list[str] = []
    for role, model in (("cheap", cheap_model), ("long", long_model)):
        if model:
            policy = _override(policy, role, model, changes)
    cheap, cheap_limits = _resolve_model(
        policy.cheap,
        "cheap",
        window=cheap_window if cheap_model else None,
        strict=strict,
        long_route=False,
        flag="--cheap-window" if cheap_model else "",
    )
    long, long_limits = _resolve_model(
        policy.long,
        "long",
        window=long_window if long_model else None,
        strict=strict,
        long_route=True,
        flag="--long-window" if long_model else "",
    )
    alternates, alternate_limits = [], []
    for i, config in enumerate(policy.long_alternates):
        resolved, limits = _resolve_model(
            config, f"long_alternates.{i}", window=None, strict=strict, long_route=True, flag=""
        )
        alternates.append(resolved)
        alternate_limits.append(limits)
    policy = policy.model_copy(update={"cheap": cheap, "long": long, "long_alternates": alternates})
    settings = policy.long_context
    window = settings.window_tokens or long_limits.context_window
    reserve = settings.answer_reserve_tokens
    warnings = []
    if window > long_limits.context_window:
        warnings.append(
            f"long_context.window_tokens {window:,} is more than the long model's window "
            f"{long_limits.context_window:,}: long prompts will be refused upstream"
        )
    if reserve >= window:
        raise LimitsError(
            f"long_context.answer_reserve_tokens {reserve:,} leaves nothing of the long route's window {window:,}"
        )
    for limits in alternate_limits:
        if limits.context_window < window:
            warnings.append(
                f"{limits.role} {limits.model} has a window of {limits.context_window:,}, less than the "
                f"{window:,} the long route packs for: a long prompt it is tried with may be refused"
            )
    if policy.rag.context_budget_tokens + reserve > cheap_limits.context_window:
        warnings.append(
            f"rag.context_budget_tokens {policy.rag.context_budget_tokens:,} and the answer reserve do "
            f"not fit the cheap model's window {cheap_limits.context_window:,}"
        )
    for limits in (cheap_limits, long_limits, *alternate_limits):
        if limits.window_source == "assumed":
            warnings.append(f"{limits.role} {limits.model}: window unknown, {limits.context_window:,} assumed")
    effective = EffectiveLimits(
        (cheap_limits, long_limits, *alternate_limits),
        window,
        reserve,
        cheap_limits.context_window,
        policy.rag.context_budget_tokens,
        tuple(changes),
        tuple(warnings),
    )
    return policy, effective
