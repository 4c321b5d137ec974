"""Prices per model: the policy's own, else litellm's bundled cost map. Priced from reported usage.

litellm's `completion_cost` re-tokenises the prompt (over a millisecond of CPU); the upstream already
reports token counts, so cost is plain arithmetic on a price looked up once per model.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from policies.limits import cost_map
from policies.schema import ModelConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Price:
    input_per_token: float
    output_per_token: float
    source: str  # "policy", "litellm", or "unknown"
    # provider prompt caching: reads are cheaper than input, Anthropic's writes dearer; None: the input price
    cache_read_per_token: float | None = None
    cache_write_per_token: float | None = None

    @property
    def known(self) -> bool:
        return self.source != "unknown"

    def cost(
        self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0, cache_write_tokens: int = 0
    ) -> float:
        """`prompt_tokens` counts every prompt token, the cached and cache-written ones included (as OpenAI and
        litellm report them); those are priced at the cache rates."""
        cached = min(cached_tokens, prompt_tokens)
        written = min(cache_write_tokens, prompt_tokens - cached)
        read_price = self.input_per_token if self.cache_read_per_token is None else self.cache_read_per_token
        write_price = self.input_per_token if self.cache_write_per_token is None else self.cache_write_per_token
        return (
            (prompt_tokens - cached - written) * self.input_per_token
            + cached * read_price
            + written * write_price
            + completion_tokens * self.output_per_token
        )


FREE = Price(0.0, 0.0, "unknown")


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _per_token(per_mtok: float | None) -> float | None:
    return None if per_mtok is None else per_mtok / 1e6


def _cost_map() -> dict:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    if os.environ["LITELLM_LOCAL_MODEL_COST_MAP"].lower() == "true":
        # the map litellm itself would load, read as a file: importing litellm costs ~160 MB and seconds, and a
        # gateway whose models all take the direct path has no other use for it
        return cost_map()
    import litellm  # LITELLM_LOCAL_MODEL_COST_MAP=False: litellm's remote map

    return litellm.model_cost


class PriceBook:
    """Resolves and caches a Price per model config."""

    def __init__(self, cost_map: dict | None = None):
        self._cost_map = cost_map
        self._cache: dict[tuple, Price] = {}

    def warm(self, configs: list[ModelConfig] | None = None) -> None:
        """Read litellm's cost map now (its bundled file: a second of CPU; litellm itself is imported only where
        LITELLM_LOCAL_MODEL_COST_MAP=False asks for its remote map), off the event loop, so that the first request for
        a model without policy prices does not stall every other request; warn about each of
        `configs` (the policy's models) that has no price, since its calls will be recorded at $0."""
        self._lookup_map("")
        for config in configs or []:
            if not self.price(config).known:
                logger.warning(
                    "no price for model %r (not in litellm's cost map, none in the policy): its calls are "
                    "recorded at $0 and marked unpriced; set input_cost_per_mtok and output_cost_per_mtok",
                    config.model,
                )

    def _lookup_map(self, model: str) -> Price | None:
        if self._cost_map is None:
            try:
                self._cost_map = _cost_map()
            except Exception:  # litellm missing or broken: price at zero, say so once
                logger.warning("litellm cost map unavailable; models without policy prices cost 0")
                self._cost_map = {}
        provider, _, name = model.partition("/")
        for candidate in (model, name, f"{provider}/{name}"):
            entry = self._cost_map.get(candidate) if candidate else None
            if entry and "input_cost_per_token" in entry:
                return Price(
                    float(entry.get("input_cost_per_token") or 0.0),
                    float(entry.get("output_cost_per_token") or 0.0),
                    "litellm",
                    _optional_float(entry.get("cache_read_input_token_cost")),
                    _optional_float(entry.get("cache_creation_input_token_cost")),
                )
        return None

    def token_limits(self, config: ModelConfig) -> tuple[int | None, int | None]:
        """(prompt window, most completion tokens per call) of a model: the policy's context_window, else
        litellm's cost map (max_input_tokens, max_output_tokens); None where neither says."""
        self._lookup_map("")  # loads the map once
        cost_map = self._cost_map
        assert cost_map is not None  # _lookup_map set it
        provider, _, name = config.model.partition("/")
        entry = (
            next((cost_map.get(c) for c in (config.model, name, f"{provider}/{name}") if c and cost_map.get(c)), None)
            or {}
        )

        def whole(value: Any) -> int | None:
            return int(value) if isinstance(value, (int, float)) and value > 0 else None

        window = config.context_window or whole(entry.get("max_input_tokens"))
        return window, whole(entry.get("max_output_tokens")) or whole(entry.get("max_tokens"))

    def price(self, config: ModelConfig) -> Price:
        key = (
            config.model,
            config.input_cost_per_mtok,
            config.output_cost_per_mtok,
            config.cached_input_cost_per_mtok,
            config.cache_write_cost_per_mtok,
        )
        found = self._cache.get(key)
        if found is None:
            if config.input_cost_per_mtok is not None or config.output_cost_per_mtok is not None:
                found = Price(
                    (config.input_cost_per_mtok or 0.0) / 1e6,
                    (config.output_cost_per_mtok or 0.0) / 1e6,
                    "policy",
                    _per_token(config.cached_input_cost_per_mtok),
                    _per_token(config.cache_write_cost_per_mtok),
                )
            else:
                found = self._lookup_map(config.model) or FREE
            self._cache[key] = found
        return found
