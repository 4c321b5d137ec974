"""Which long-route document blocks are warm in the provider's prompt cache, as far as this process has seen.

The long route sends documents first and the question last (gateway.routing.prompt_cache), so a question on
documents whose block was sent a moment ago reads that block from the provider's cache at a fraction of the
input price. This record lets the routing estimates (explain, the ledger's always-long counterfactual) price that.

What counts:
- a block is keyed by (model, RoutePlan.block_key): the documents' ids and content hashes in reading order and
  the conversation before the question (which precedes the block in the prompt). Attached documents carry their
  API key in their metadata, so one key's warm block never tells another key that those documents were sent;
- only a stable block (every unit, reading order) is cacheable, and only from the model's
  `prompt_cache_min_tokens` up (providers cache nothing shorter);
- a block is warm for `prompt_cache_ttl_s` after it was last sent; a cold one on a model that needs cache_control
  (Anthropic) is written to the cache at the write price;
- but only once the model's upstream has reported a cache read or write in this process: an upstream that never
  reports caching is never assumed to cache, neither reads nor writes (Anthropic reports the first call's write;
  OpenAI reports nothing on the first, writing call, so its second call on any block is the proof);
- the record is per process (one replica): a replica that has not sent a block estimates it cold although
  the provider, shared by every replica, may hold it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gateway.ledger.records import UpstreamCall
from gateway.routing.prompt_cache import needs_cache_control
from pipelines.cache import LockedLRU
from policies.routes import LONG
from policies.schema import ModelConfig

WARM, COLD, NOT_CACHEABLE = "warm", "cold", "not_cacheable"
DEFAULT_SIZE = 4096  # blocks remembered (least recently used forgotten first): a few hundred bytes each


@dataclass(frozen=True)
class CacheEstimate:
    """How the provider's prompt cache would treat the long prompt's document block."""

    state: str  # WARM, COLD or NOT_CACHEABLE
    reason: str
    cached_tokens: int = 0  # prompt tokens read from the cache (warm)
    write_tokens: int = 0  # prompt tokens written to it (cold, on a model that needs cache_control: Anthropic)


@dataclass
class _Block:
    sent_at: float | None = None  # a long leg last sent this block: the provider holds it until sent_at + ttl
    seen_at: float | None = None  # a routed request on these documents last ended: always-long would have sent it
    reported_tokens: int = 0  # what the upstream last reported read from or written to its cache for the block


class WarmPrefixes:
    """Per-process record of the long prompt prefixes sent recently, bounded (LRU), with an injectable clock."""

    def __init__(self, size: int = DEFAULT_SIZE, clock: Callable[[], float] = time.monotonic):
        self.size = size
        self.clock = clock
        # the blocks' fields and the caching models change under self._lock; the record's own lock keeps its order
        self._blocks: LockedLRU[tuple[str, str], _Block] = LockedLRU(size)
        self._caching_models: set[str] = set()  # upstreams that reported a cache read or write
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._blocks)

    def estimate(
        self, config: ModelConfig, key: str | None, prefix_tokens: int | None, *, always_long: bool = False
    ) -> CacheEstimate:
        """The cache's effect on a long prompt whose stable block (everything before the question) is `prefix_tokens`
        long, None when the block is chosen or ordered per question. Warm when the block was sent within the model's
        TTL (`always_long`: when any routed request on these documents ended within it, since always-long sends every
        one). A cold block on a model that needs cache_control is written to the cache. Before the model's upstream
        reported any caching, neither reads nor writes are assumed. Never changes the record."""
        if key is None or prefix_tokens is None:
            return CacheEstimate(NOT_CACHEABLE, "the document block is chosen or ordered per question")
        if prefix_tokens < config.prompt_cache_min_tokens:
            return CacheEstimate(
                NOT_CACHEABLE,
                f"the document block ({prefix_tokens:,} tokens) is shorter than "
                f"prompt_cache_min_tokens ({config.prompt_cache_min_tokens:,})",
            )
        now = self.clock()
        with self._lock:
            if config.model not in self._caching_models:  # neither reads nor writes assumed: the plain input price
                return CacheEstimate(
                    COLD, f"{config.model}'s upstream has not reported a prompt-cache read or write in this process"
                )
            block = self._blocks.peek((config.model, key))
            at = None if block is None else (block.seen_at if always_long else block.sent_at)
            reported = 0 if block is None else block.reported_tokens
        written = prefix_tokens if needs_cache_control(config) else 0
        ttl = config.prompt_cache_ttl_s
        if ttl <= 0:
            return CacheEstimate(COLD, "prompt_cache_ttl_s is 0: a warm cache is never assumed", 0, written)
        if at is None or now - at > ttl:
            what = "no request on these documents" if always_long else "the block was not sent"
            return CacheEstimate(COLD, f"{what} in the last {ttl:g} s (prompt_cache_ttl_s)", 0, written)
        # the upstream's own count for this block is what it reads next time; the estimate when it reported none
        cached = prefix_tokens if always_long or not reported else reported
        return CacheEstimate(WARM, f"sent {now - at:.0f} s ago, within prompt_cache_ttl_s ({ttl:g} s)", cached, 0)

    def record(
        self, long_config: ModelConfig, key: str | None, calls: Iterable[UpstreamCall], sent_stable: bool
    ) -> None:
        """A routed request on the documents identified by `key` ended: note it (for the always-long estimate), the
        stable blocks its successful long legs sent (`sent_stable`: the long prompt held every unit in reading
        order), and which upstreams reported caching. `key` None: the documents are not cacheable."""
        now = self.clock()
        with self._lock:
            for call in calls:
                if not call.error and (call.cached_tokens or call.cache_write_tokens):
                    self._caching_models.add(call.model)
            if key is None:
                return
            self._touch(long_config.model, key).seen_at = now
            if not sent_stable:
                return
            for call in calls:
                if call.route == LONG and not call.error:
                    block = self._touch(call.model, key)
                    block.sent_at = now
                    block.reported_tokens = max(call.cached_tokens, call.cache_write_tokens) or block.reported_tokens

    def _touch(self, model: str, key: str) -> _Block:
        return self._blocks.get_or_make((model, key), _Block)
