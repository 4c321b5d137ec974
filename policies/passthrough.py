"""Which model names a client may use by pass-through: the policy's own models, plus `passthrough.allow`.

A pass-through model name picks the provider, and some providers' default endpoints are services on the gateway's
own machine or network (litellm's defaults: `ollama/` -> localhost:11434, `llamafile/` -> 127.0.0.1:8080,
`langgraph/` -> localhost:2024, `xinference/` -> 127.0.0.1:9997, ...), or run in the gateway's process (`local/`,
`vllm/`, `petals/`). A client naming such a model would make the gateway call a local service it never meant to
expose, so those providers are only reachable through a model the policy names itself (cheap, long, an alternate)
or an allow pattern that names the provider literally (`ollama/*`, `ollama/llama3`), never through a wildcard such
as `*` that merely matches it.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

from policies.schema import Policy

# litellm's providers (litellm.provider_list, 1.110) whose default endpoint is on the gateway's machine or network,
# that run a model in-process: found by their default api_base (localhost / 127.0.0.1 / 0.0.0.0) in litellm's sources, plus the gateway's own
# in-process `local/`.
LOCAL_SERVICE_PROVIDERS = frozenset(
    {
        "local",  # this gateway's in-process models (gateway/upstreams/local.py)
        "ollama",
        "ollama_chat",  # localhost:11434
        "llamafile",  # 127.0.0.1:8080
        "lm_studio",  # LM Studio's local server
        "langgraph",  # localhost:2024
        "langflow",  # localhost:7860
        "lemonade",  # localhost:8000
        "docker_model_runner",  # localhost:22088
        "xinference",  # 127.0.0.1:9997
        "hosted_vllm",
        "vllm",  # a vLLM server (vllm/: in-process)
        "oobabooga",
        "petals",
        "triton",
        "infinity",
        "nvidia_riva",  # self-hosted servers (petals: in-process)
        "a2a",  # 0.0.0.0:9999
        "litellm_proxy",  # a LiteLLM proxy, localhost:4000 in litellm's examples
        "ragflow",
    }
)


def provider_of(model: str) -> str | None:
    provider, sep, _ = model.partition("/")
    return provider.lower() if sep else None


def reaches_local_service(model: str) -> bool:
    return provider_of(model) in LOCAL_SERVICE_PROVIDERS


def policy_models(policy: Policy) -> set[str]:
    """The model names the policy itself configures."""
    return {c.model for c in (policy.cheap, policy.long, *policy.long_alternates)}


def is_policy_model(policy: Policy, model: str) -> bool:
    """Whether the policy itself configures `model` (policy_models without building the set: this runs on every
    pass-through request)."""
    return (
        model == policy.cheap.model
        or model == policy.long.model
        or any(c.model == model for c in policy.long_alternates)
    )


def passthrough_allowed(policy: Policy, model: str, gateway_models: tuple[str, ...] = ()) -> bool:
    """Whether any caller may use `model` by pass-through under this policy. gateway_models: models the gateway
    serves itself (its embedding model), which count as the policy's."""
    if model in policy.aliases or is_policy_model(policy, model) or model in gateway_models:
        return True
    patterns = policy.passthrough.allow
    provider = provider_of(model)
    if provider in LOCAL_SERVICE_PROVIDERS:
        patterns = [p for p in patterns if provider_of(p) == provider]
    # "*" matches every name (fnmatchcase's own answer), without its pattern-cache look-up and regex match
    return any(pattern == "*" or fnmatchcase(model, pattern) for pattern in patterns)
