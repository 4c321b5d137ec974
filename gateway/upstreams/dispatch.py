"""Dispatch on the model string's provider prefix: OpenAI-compatible HTTP upstreams take the direct aiohttp
path, `local/...` runs the in-process model, and every other provider prefix (anthropic/, gemini/, ollama/,
...) goes through litellm, which translates the protocol. A bare model name goes to the OpenAI-compatible
upstream, as it would from the openai client.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from gateway.upstreams.base import Upstream, split_provider
from gateway.upstreams.direct import DIRECT_PROVIDERS
from gateway.upstreams.errors import UpstreamUnavailable
from policies.schema import ModelConfig


class ProviderUpstream:
    """Dispatch on the provider prefix of the model string."""

    def __init__(self, direct: Upstream, litellm: Upstream | None = None, local: Upstream | None = None):
        self.direct = direct
        self.litellm = litellm
        self.local = local

    def _pick(self, config: ModelConfig) -> Upstream:
        provider, _ = split_provider(config.model)
        if provider == "local":
            if self.local is None:
                raise UpstreamUnavailable(
                    "the local model is not available in this gateway",
                    model=config.model,
                    code="local_model_unavailable",
                )
            return self.local
        if provider is None or provider in DIRECT_PROVIDERS:
            # a bare model name means the OpenAI-compatible upstream (OPENAI_API_BASE), as with the openai client
            return self.direct
        if self.litellm is None:
            raise UpstreamUnavailable(f"no upstream for provider {provider!r}", model=config.model)
        return self.litellm

    def load(self, config: ModelConfig) -> None:
        """Load what calls to this model need in-process (blocking: start-up's thread): the local model's weights, or
        litellm (~160 MB, seconds to import) for a provider it translates; nothing for the direct path."""
        part = self._pick(config)
        load = getattr(part, "load", None)
        if load is not None:
            load(config)

    def prepare(self, config: ModelConfig) -> None:
        """What start-up does for this model before readiness without loading it (blocking): the local model's file
        is checked, its weights load at the first request that uses them; litellm is imported as load does."""
        part = self._pick(config)
        prepare = getattr(part, "prepare", None) or getattr(part, "load", None)
        if prepare is not None:
            prepare(config)

    async def complete(self, config: ModelConfig, body: dict[str, Any]) -> dict[str, Any]:
        return await self._pick(config).complete(config, body)

    def stream(self, config: ModelConfig, body: dict[str, Any]) -> AsyncIterator[bytes]:
        return self._pick(config).stream(config, body)

    async def aclose(self) -> None:
        for part in (self.direct, self.litellm, self.local):
            if part is not None:
                await part.aclose()
