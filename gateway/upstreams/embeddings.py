"""Embeddings from an OpenAI-compatible upstream (POST {api_base}/embeddings), for the gateway's pass-through of
embedding models it does not hold itself. Same base URL and key resolution as chat (gateway.upstreams.direct)."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from gateway.upstreams.base import split_provider, upstream_error
from gateway.upstreams.direct import DIRECT_PROVIDERS, DirectOpenAIUpstream, error_message
from gateway.upstreams.errors import UpstreamTimeout
from policies.schema import ModelConfig

_CHAT_PATH = "/chat/completions"


def passes_through(model: str) -> bool:
    """Bare names and the OpenAI-compatible providers; other providers' embeddings are not offered."""
    provider, _ = split_provider(model)
    return provider is None or provider in DIRECT_PROVIDERS


async def upstream_embeddings(config: ModelConfig, body: dict[str, Any]) -> dict[str, Any]:
    chat_url, headers, name = DirectOpenAIUpstream._endpoint(config)
    url = chat_url[: -len(_CHAT_PATH)] + "/embeddings"
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=config.timeout, sock_read=config.timeout)
    try:
        # a session per call: embedding pass-through is rare next to chat, and this keeps nothing open between calls
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                url, data=json.dumps({**body, "model": name}).encode(), headers=headers, timeout=timeout
            ) as response,
        ):
            content = await response.read()
            status = response.status
    except TimeoutError:
        raise UpstreamTimeout(
            f"upstream model {config.model!r} timed out after {config.timeout:g}s", model=config.model
        ) from None
    except aiohttp.ClientError as exc:
        raise upstream_error(None, f"{type(exc).__name__}: {exc}", config.model) from None
    if status >= 400:
        raise upstream_error(
            status, error_message(content), config.model, (config.api_key_env,) if config.api_key_env else ()
        )
    try:
        answer = json.loads(content)
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or not isinstance(answer.get("data"), list):
        raise upstream_error(None, "upstream answered with something that is not an embeddings list", config.model)
    return answer
