"""Upstream calls through litellm, for providers that need protocol translation (anthropic, gemini, ollama, ...).

litellm takes every keyword as a call option, connection settings included (`api_base`, `api_key`,
`mock_response`, ...), so a request body is never spread into it: only the documented OpenAI parameters
(gateway.protocol.OPENAI_PARAMS) go, and the connection comes from the policy's ModelConfig alone.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import AsyncIterator
from typing import Any

import anyio

from gateway.protocol import OPENAI_PARAMS
from gateway.upstreams.base import malformed_answer, upstream_error
from gateway.upstreams.errors import UnsupportedRequest, UpstreamError, UpstreamTimeout
from policies.schema import ModelConfig

logger = logging.getLogger(__name__)


def _litellm():
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # else importing litellm fetches the cost map
    import litellm

    litellm.telemetry = False
    litellm.suppress_debug_info = True  # else it prints help banners (and the failing call) to stdout
    return litellm


async def _imported():
    """litellm, imported off the event loop the first time (a pass-through model the policy does not name: the
    gateway imports litellm only once something needs it, and that import takes seconds)."""
    if "litellm" not in sys.modules:
        await anyio.to_thread.run_sync(_litellm)
    return _litellm()


def _map_exception(exc: Exception, model: str, secret_env: tuple[str, ...] = ()) -> UpstreamError:
    litellm = _litellm()
    if isinstance(exc, litellm.Timeout):
        return UpstreamTimeout(f"upstream model {model!r} timed out", model=model)
    status = getattr(exc, "status_code", None)
    message = getattr(exc, "message", None) or str(exc)
    return upstream_error(status if isinstance(status, int) else None, message, model, secret_env)


# litellm reads `metadata` as its own logging options; the model comes from the config
FORWARDED_PARAMS = tuple(name for name in OPENAI_PARAMS if name not in ("model", "metadata"))
# litellm downloads remote images and files itself for providers that want them inline: the gateway would
# fetch any URL a client names. Inline data: URLs are fine.
_REMOTE_URL = re.compile(r"^\s*[A-Za-z][A-Za-z0-9+.\-]*://")


def _check_no_remote_urls(messages: Any) -> None:
    for m, message in enumerate(messages if isinstance(messages, list) else []):
        content = message.get("content") if isinstance(message, dict) else None
        for p, part in enumerate(content if isinstance(content, list) else []):
            if isinstance(part, dict) and part.get("type") != "text":
                for value in _string_values(part):
                    if _REMOTE_URL.match(value):
                        raise UnsupportedRequest(
                            "this provider is reached through the gateway, which does not fetch URLs for it: "
                            "send the content inline as a data: URL",
                            param=f"messages[{m}].content[{p}]",
                            code="remote_url_not_supported",
                        )


def _string_values(value: Any):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _string_values(item)
    elif isinstance(value, list):
        for item in value:
            yield from _string_values(item)


def _says_something(chunk: dict[str, Any]) -> bool:
    if chunk.get("usage"):
        return True
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("tool_calls") or delta.get("function_call"):
            return True
    return False


class LiteLLMUpstream:
    def _kwargs(self, config: ModelConfig, body: dict[str, Any]) -> dict[str, Any]:
        _check_no_remote_urls(body.get("messages"))
        kwargs = {k: body[k] for k in FORWARDED_PARAMS if k in body}
        kwargs.update(model=config.model, timeout=config.timeout, num_retries=config.max_retries)
        if config.api_base:
            kwargs["api_base"] = config.api_base
        if config.api_key_env:
            kwargs["api_key"] = os.environ.get(config.api_key_env)
        return kwargs

    def load(self, config: ModelConfig | None = None) -> None:
        """Import litellm now (start-up, for a policy model it serves), not in the first request."""
        _litellm()

    async def complete(self, config: ModelConfig, body: dict[str, Any]) -> dict[str, Any]:
        litellm = await _imported()
        try:
            response = await litellm.acompletion(**self._kwargs(config, {**body, "stream": False}))
        except UpstreamError:
            raise
        except Exception as exc:  # litellm raises its own exception family per provider
            raise _map_exception(exc, config.model, (config.api_key_env,) if config.api_key_env else ()) from None
        return response.model_dump(exclude_none=True)

    async def stream(self, config: ModelConfig, body: dict[str, Any]) -> AsyncIterator[bytes]:
        litellm = await _imported()
        try:
            response = await litellm.acompletion(**self._kwargs(config, {**body, "stream": True}))
            said = False  # a chunk with text, a tool call or usage came
            async for chunk in response:
                data = chunk.model_dump(exclude_none=True)
                said = said or _says_something(data)
                yield json.dumps(data).encode()
            if not said:
                # litellm turns a reply that is no event stream (a JSON error page, plain text) into an empty stream
                # that ends with finish_reason "stop": an empty 200 at $0 (probe11), where the direct path says 502
                raise malformed_answer(config.model, "the stream carried no text, no tool call and no usage")
        except UpstreamError:
            raise
        except Exception as exc:
            raise _map_exception(exc, config.model, (config.api_key_env,) if config.api_key_env else ()) from None

    async def aclose(self) -> None:
        return None
