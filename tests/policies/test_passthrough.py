"""Which model names pass through: the policy's own, the gateway's embedding model, `passthrough.allow`; providers
that reach local services only by a pattern that names them."""

from __future__ import annotations

import pytest

from policies.passthrough import passthrough_allowed
from tests.support.policies import DROP, Whole, make_policy, model_route


def policy(allow: list[str] | None = None):
    """gpt-4o-mini, Claude and an ollama alternate; `passthrough.allow` as given, else the default."""
    return make_policy(
        None,
        name="t",
        cheap=model_route("openai/gpt-4o-mini"),
        long=model_route("anthropic/claude-3-5-sonnet-20241022"),
        long_alternates=[model_route("ollama/llama3-policy")],
        routing=Whole(classifier=None),
        passthrough=DROP if allow is None else {"allow": allow},
    )


def test_by_default_only_the_policys_own_models_pass_through():
    p = policy()
    assert p.passthrough.allow == []
    for model in ("selfroute", "openai/gpt-4o-mini", "anthropic/claude-3-5-sonnet-20241022", "ollama/llama3-policy"):
        assert passthrough_allowed(p, model), model
    for model in ("gpt-4o", "openai/gpt-4.1", "local/smollm2-135m-instruct", "ollama/llama3"):
        assert not passthrough_allowed(p, model), model
    assert passthrough_allowed(p, "local/all-minilm-l6-v2", ("local/all-minilm-l6-v2",))


@pytest.mark.parametrize(
    "model",
    [
        "ollama/llama3",
        "OLLAMA/llama3",
        "ollama_chat/x",
        "llamafile/x",
        "lm_studio/x",
        "langgraph/agent",
        "hosted_vllm/x",
        "vllm/x",
        "xinference/x",
        "oobabooga/x",
        "local/smollm2-135m-instruct",
        "litellm_proxy/x",
        "a2a/x",
    ],
)
def test_a_wildcard_never_reaches_a_local_service(model):
    assert not passthrough_allowed(policy(["*"]), model)
    assert not passthrough_allowed(policy(["*/*", "?*"]), model)


def test_a_pattern_naming_the_provider_reaches_it():
    p = policy(["ollama/*", "local/smollm2-135m-instruct", "openai/*"])
    assert passthrough_allowed(p, "ollama/llama3") and passthrough_allowed(p, "local/smollm2-135m-instruct")
    assert passthrough_allowed(p, "openai/gpt-4.1") and not passthrough_allowed(p, "llamafile/x")
    assert not passthrough_allowed(p, "gpt-4o")  # a bare name is not openai/...
    assert passthrough_allowed(policy(["*"]), "gpt-4o") and passthrough_allowed(policy(["*"]), "gemini/x")
