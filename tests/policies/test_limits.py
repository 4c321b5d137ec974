"""Effective model limits: windows, output limits and prices from litellm's model information, what a model
override changes, and a clear error for a model whose window nobody knows."""

from __future__ import annotations

import pytest

from policies.limits import HOSTED, LOCAL_CONTEXT_WINDOW, LimitsError, effective_policy, model_info
from policies.loader import PolicyError, load_policy
from tests.support.policies import bare_policy


def test_model_information_comes_from_litellm_and_respects_the_provider():
    assert model_info("openai/gpt-4.1")["max_input_tokens"] == 1_047_576
    assert model_info("gpt-4o-mini")["max_output_tokens"] == 16_384
    assert model_info("anthropic/claude-sonnet-4-5")["litellm_provider"] == "anthropic"
    # a vLLM server's "gpt-4.1" is not OpenAI's: its window is whatever that server gives it
    assert model_info("hosted_vllm/gpt-4.1") is None
    assert model_info("local/smollm2-135m-instruct") is None


def test_long_model_override_takes_the_new_models_window_not_the_embedded_defaults():
    default, _ = load_policy()
    assert default.long.context_window == 2048 and default.long_context.answer_reserve_tokens == 256
    policy, limits = effective_policy(default, long_model="openai/gpt-4.1")
    assert policy.long.model == "openai/gpt-4.1"
    assert policy.long.context_window == 1_047_576 and policy.long.max_output_tokens == 32_768
    assert policy.long.timeout == HOSTED.long_timeout_s  # not the 180 s given to SmolLM2
    assert policy.long.input_cost_per_mtok is None  # priced by litellm's cost map, as the ledger does
    assert policy.long_context.answer_reserve_tokens == HOSTED.answer_reserve_tokens
    assert limits.long_packing_tokens == 1_047_576 - 1024
    long = limits.models[1]
    assert (long.window_source, long.price_source, long.input_cost_per_mtok) == ("litellm", "litellm", 2.0)
    assert any("answer_reserve_tokens 256 -> 1,024" in c for c in limits.changes)
    text = "\n".join(limits.lines())
    assert "long: openai/gpt-4.1: window 1,047,576 (litellm), output 32,768" in text
    assert "long route: packs up to 1,046,552 tokens" in text
    # the cheap route kept its local model, budget and timeout
    assert policy.cheap == default.cheap.model_copy(update={"context_window": 8192})
    assert policy.rag.context_budget_tokens == 1200


def test_cheap_model_override_scales_the_rag_budget_and_timeout():
    default, _ = load_policy()
    policy, limits = effective_policy(default, cheap_model="openai/gpt-4o-mini")
    assert (policy.cheap.context_window, policy.cheap.timeout) == (128_000, HOSTED.cheap_timeout_s)
    assert policy.rag.context_budget_tokens == HOSTED.rag_budget_tokens
    assert limits.direct_window_tokens == 128_000
    assert policy.long.model.startswith("local/") and limits.long_window_tokens == 2048


def test_a_model_litellm_does_not_know_needs_its_window():
    default, _ = load_policy()
    with pytest.raises(LimitsError, match=r"'hosted_vllm/qwen' is not in litellm's model information.*--long-window"):
        effective_policy(default, long_model="hosted_vllm/qwen")
    policy, limits = effective_policy(default, long_model="hosted_vllm/qwen", long_window=32_768)
    assert policy.long.context_window == 32_768 and limits.models[1].window_source == "flag"
    assert limits.models[1].price_source == "unpriced"

    unknown = bare_policy("local/smollm2-135m-instruct", "openai/my-proxy-model")
    with pytest.raises(PolicyError, match=r"give long.context_window in the policy"):
        effective_policy(unknown)
    # policies built in code (tests, benchmarks) keep the window assumed before, and say so
    policy, limits = effective_policy(unknown, strict=False)
    assert policy.long.context_window == 128_000 and any("assumed" in w for w in limits.warnings)
    # the local model's window is the context the in-process upstream opens
    assert policy.cheap.context_window == LOCAL_CONTEXT_WINDOW


def test_a_policys_own_limits_win_and_alternates_smaller_than_the_window_are_named():
    policy, limits = effective_policy(
        bare_policy(
            {"model": "openai/gpt-4o-mini", "context_window": 64000, "timeout": 20},
            {"model": "openai/gpt-4.1", "input_cost_per_mtok": 1.0, "output_cost_per_mtok": 4.0},
            long_alternates=[{"model": "openai/gpt-4"}],
            long_context={"window_tokens": 100000},
        )
    )
    assert (policy.cheap.context_window, policy.cheap.timeout) == (64_000, 20)
    assert limits.models[1].price_source == "policy" and limits.long_window_tokens == 100_000
    assert policy.long_alternates[0].context_window == 8192
    assert any("long_alternates.0 openai/gpt-4 has a window of 8,192" in w for w in limits.warnings)
    # resolving what was resolved changes nothing
    assert effective_policy(policy)[0] == policy


def test_an_answer_reserve_larger_than_the_window_is_refused():
    policy = bare_policy("local/smollm2-135m-instruct", "openai/gpt-4", long_context={"answer_reserve_tokens": 9000})
    with pytest.raises(LimitsError, match="leaves nothing"):
        effective_policy(policy)
