"""Which of a policy's hosted models have no key in the environment: a start-up warning and a readiness detail,
instead of a first request that fails with a 502 (litellm's validate_environment knows each provider's variables)."""

from __future__ import annotations

import logging
import os

from policies.schema import ModelConfig, Policy

logger = logging.getLogger(__name__)


def missing_key(config: ModelConfig) -> str | None:
    """The unset variable(s) a model needs, 'A or B' when any one will do, or None."""
    if config.model.startswith("local/"):
        return None
    if config.api_key_env:
        return None if os.environ.get(config.api_key_env) else config.api_key_env
    if config.api_base:  # a server of one's own (vLLM, a proxy): it may need no key at all
        return None
    try:
        import litellm

        found = litellm.validate_environment(model=config.model)
    except Exception:  # noqa: BLE001  (an unknown provider: nothing to say)
        return None
    if found.get("keys_in_environment"):
        return None
    names = [n for n in found.get("missing_keys") or [] if "KEY" in n or "TOKEN" in n]  # not OLLAMA_API_BASE
    return " or ".join(names) or None


def missing_credentials(policy: Policy) -> list[dict]:
    """[{role, model, missing}] for the policy's models whose key variable is unset."""
    models = [
        ("cheap", policy.cheap),
        ("long", policy.long),
        *((f"long_alternates.{i}", m) for i, m in enumerate(policy.long_alternates)),
    ]
    out = []
    for role, config in models:
        missing = missing_key(config)
        if missing:
            out.append({"role": role, "model": config.model, "missing": missing})
    for item in out:
        logger.warning(
            "%s model %s: %s is not set, so its calls will fail (502) until it is",
            item["role"],
            item["model"],
            item["missing"],
        )
    return out
