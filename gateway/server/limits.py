"""What a key may do before its request is routed: the policy's pass-through allow-list, and a named key's
model allow-list, budget and rate limits.

Limits live in the ledger database, so every worker of one host that shares it enforces the same ones:
requests per minute are counted in rate_windows at admission (an atomic upsert), tokens per minute and
spend are read from what the ledger recorded. Replicas with their own databases each enforce the limits
on their own share of the traffic.
"""
from __future__ import annotations

import math
import time
from fnmatch import fnmatchcase

import anyio

from gateway.errors import GatewayError
from gateway.ledger.keys import KeyStore, NamedKey
from gateway.server.auth import Caller
from policies.passthrough import passthrough_allowed
from policies.schema import Policy

TPM_WINDOW_S = 60.0


def model_allowed(patterns: tuple[str, ...] | list[str] | None, model: str) -> bool:
    return patterns is None or any(fnmatchcase(model, pattern) for pattern in patterns)


def _not_allowed(model: str) -> GatewayError:
    return GatewayError(403, f"this key may not use the model {model[:256]!r}", param="model",
                        code="model_not_allowed")


def model_usable(policy: Policy, caller: Caller, model: str) -> bool:
    """A routed alias, or a pass-through model the policy allows (policies.passthrough); and one the caller's key
    may use."""
    from gateway.server.embeddings import local_embedding_model  # it admits through this module

    if not passthrough_allowed(policy, model, (local_embedding_model(policy),)):
        return False
    return caller.key is None or model_allowed(caller.key.models, model)


def check_model(policy: Policy, caller: Caller, model: str) -> None:
    """403 model_not_allowed for a pass-through model the policy does not allow, or a model the key may not use."""
    if not model_usable(policy, caller, model):
        raise _not_allowed(model)


def _retry_after(seconds: float) -> dict[str, str]:
    return {"retry-after": str(max(1, math.ceil(seconds)))}


def _check_usage(keys: KeyStore, key: NamedKey, now: float) -> None:
    """Budget and rate limits, read from and counted in the ledger database (runs in a worker thread)."""
    if key.budget_usd is not None:
        spent = keys.budget_spent(key, now)  # in the current period when the budget has one
        if spent >= key.budget_usd:
            period = "" if key.budget_period_s is None else " for this period"
            raise GatewayError(429, f"this key's budget of ${key.budget_usd:g}{period} is spent (${spent:.4f} "
                               "recorded)", code="budget_exceeded")
    if key.tpm is not None:
        used, oldest = keys.tokens_since(key.name, now - TPM_WINDOW_S)
        if used >= key.tpm:
            raise GatewayError(429, f"this key's limit of {key.tpm} tokens per minute is reached",
                               code="rate_limit_exceeded", headers=_retry_after(oldest + TPM_WINDOW_S - now))
    if key.rpm is not None:
        count, until_next = keys.count_request(key.name, now)
        if count > key.rpm:
            keys.uncount_request(key.name, now)
            raise GatewayError(429, f"this key's limit of {key.rpm} requests per minute is reached",
                               code="rate_limit_exceeded", headers=_retry_after(until_next))


async def admit(policy: Policy, keys: KeyStore, caller: Caller, model: str | None) -> None:
    """Raise the 403 or 429 this request deserves, or return to let it through. `model` None: work on the
    gateway's own embedding model (adding documents), limited by the key's budget and rates only."""
    if model is not None:
        check_model(policy, caller, model)
    key = caller.key
    if key is not None and (key.budget_usd is not None or key.rpm is not None or key.tpm is not None):
        await anyio.to_thread.run_sync(_check_usage, keys, key, time.time())
