"""OpenAI-compatible HTTP upstreams (openai/, hosted_vllm/, bare model names) over a pooled aiohttp session.

litellm costs milliseconds of CPU per call, more than this proxy's whole budget, so these skip it:
no translation, bytes in, bytes out.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import Any, AsyncIterator

import aiohttp

from gateway.errors import GatewayError
from gateway.upstreams.base import split_provider, upstream_error
from policies.schema import ModelConfig

logger = logging.getLogger(__name__)

DIRECT_PROVIDERS = ("openai", "hosted_vllm")
RETRY_STATUSES = (429, 500, 502, 503, 504)


def _error_message(payload: bytes) -> str:
    try:
        data = json.loads(payload)
        error = data.get("error", data)
        if isinstance(error, dict):
            return str(error.get("message") or error)
        return str(error)
    except ValueError:
        return payload.decode("utf-8", "replace")[:500] or "no message"


class DirectOpenAIUpstream:
    """OpenAI-compatible HTTP upstreams over a pooled aiohttp session: no translation, bytes in, bytes out.

    aiohttp rather than httpx: on this path httpx cost about 2 ms of CPU per request, over the proxy's budget.
    """

    def __init__(self, session: aiohttp.ClientSession | None = None):
        self._session = session

    def _client(self) -> aiohttp.ClientSession:
        # created lazily: a session belongs to the event loop it was made in
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=512, ttl_dns_cache=300), auto_decompress=True,
            )
        return self._session

    @staticmethod
    def _endpoint(config: ModelConfig) -> tuple[str, dict[str, str], str]:
        provider, name = split_provider(config.model)
        base = (
            config.api_base
            or (os.environ.get("HOSTED_VLLM_API_BASE") if provider == "hosted_vllm" else None)
            or os.environ.get("OPENAI_API_BASE")
            or os.environ.get("OPENAI_BASE_URL")
            or "https://api.openai.com/v1"
        )
        key_env = config.api_key_env or ("HOSTED_VLLM_API_KEY" if provider == "hosted_vllm" else "OPENAI_API_KEY")
        key = os.environ.get(key_env)
        headers = {"content-type": "application/json"}
        if key:
            headers["authorization"] = f"Bearer {key}"
        return base.rstrip("/") + "/chat/completions", headers, name

    async def _send(self, config: ModelConfig, body: dict[str, Any]) -> aiohttp.ClientResponse:
        url, headers, name = self._endpoint(config)
        payload = json.dumps({**body, "model": name}).encode()
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=config.timeout, sock_read=config.timeout)
        failure: GatewayError | None = None
        delay = 0.0
        for attempt in range(config.max_retries + 1):
            if attempt and delay:
                await asyncio.sleep(delay)
            try:
                response = await self._client().post(url, data=payload, headers=headers, timeout=timeout)
            except asyncio.TimeoutError:
                failure, delay = GatewayError(
                    504, f"upstream model {config.model!r} timed out after {config.timeout:g}s", code="upstream_timeout"
                ), 0.0  # a timeout has already waited: retry at once
                continue
            except aiohttp.ClientError as exc:
                failure = upstream_error(None, f"{type(exc).__name__}: {exc}", config.model)
                delay = 0.2 * (attempt + 1)
                continue
            if response.status < 400:
                return response
            content = await response.read()
            response.release()
            failure = upstream_error(response.status, _error_message(content), config.model)
            if response.status not in RETRY_STATUSES:
                break
            delay = 0.2 * (attempt + 1)
        raise failure

    async def complete(self, config: ModelConfig, body: dict[str, Any]) -> dict[str, Any]:
        response = await self._send(config, {**body, "stream": False})
        try:
            content = await response.read()
        except asyncio.TimeoutError:
            raise GatewayError(504, f"upstream model {config.model!r} timed out", code="upstream_timeout") from None
        except aiohttp.ClientError as exc:
            raise upstream_error(None, f"reading the answer failed: {exc}", config.model) from None
        finally:
            response.release()
        try:
            return json.loads(content)
        except ValueError:
            raise upstream_error(None, "upstream answered with invalid JSON", config.model) from None

    async def stream(self, config: ModelConfig, body: dict[str, Any]) -> AsyncIterator[bytes]:
        response = await self._send(config, {**body, "stream": True})
        try:
            async for line in response.content:
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                if data:
                    yield data
        except asyncio.TimeoutError:
            raise GatewayError(504, f"upstream model {config.model!r} timed out mid-stream", code="upstream_timeout") from None
        except aiohttp.ClientError as exc:
            raise upstream_error(None, f"stream broke: {exc}", config.model) from None
        finally:
            response.release()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
