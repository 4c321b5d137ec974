"""Upstream calls through litellm, for providers that need protocol translation (anthropic, gemini, ollama, ...)."""
from __future__ import annotations

import json
import logging
import os
from typing import Any, AsyncIterator

from gateway.errors import GatewayError
from gateway.upstreams.base import upstream_error
from policies.schema import ModelConfig

logger = logging.getLogger(__name__)


def _litellm():
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # else importing litellm fetches the cost map
    import litellm

    litellm.telemetry = False
    return litellm


def _map_exception(exc: Exception, model: str) -> GatewayError:
    litellm = _litellm()
    if isinstance(exc, litellm.Timeout):
        return GatewayError(504, f"upstream model {model!r} timed out", code="upstream_timeout")
    status = getattr(exc, "status_code", None)
    message = getattr(exc, "message", None) or str(exc)
    return upstream_error(status if isinstance(status, int) else None, message, model)


class LiteLLMUpstream:
    def _kwargs(self, config: ModelConfig, body: dict[str, Any]) -> dict[str, Any]:
        kwargs = {k: v for k, v in body.items() if k != "model"}
        kwargs.update(model=config.model, timeout=config.timeout, num_retries=config.max_retries)
        if config.api_base:
            kwargs["api_base"] = config.api_base
        if config.api_key_env:
            kwargs["api_key"] = os.environ.get(config.api_key_env)
        return kwargs

    async def complete(self, config: ModelConfig, body: dict[str, Any]) -> dict[str, Any]:
        litellm = _litellm()
        try:
            response = await litellm.acompletion(**self._kwargs(config, {**body, "stream": False}))
        except GatewayError:
            raise
        except Exception as exc:  # litellm raises its own exception family per provider
            raise _map_exception(exc, config.model) from None
        return response.model_dump(exclude_none=True)

    async def stream(self, config: ModelConfig, body: dict[str, Any]) -> AsyncIterator[bytes]:
        litellm = _litellm()
        try:
            response = await litellm.acompletion(**self._kwargs(config, {**body, "stream": True}))
            async for chunk in response:
                yield json.dumps(chunk.model_dump(exclude_none=True)).encode()
        except GatewayError:
            raise
        except Exception as exc:
            raise _map_exception(exc, config.model) from None

    async def aclose(self) -> None:
        return None
