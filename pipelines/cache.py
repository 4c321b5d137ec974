"""One in-memory cache for the whole gateway: a cachetools LRUCache guarded by a lock.

Every cache of derived work (question vectors, a document's units, statistics and term index, injection scans,
stored chunk vectors, the warm-prefix record, a reservation's document token counts) is one of these, so eviction and locking are written once. The
value is computed outside the lock: two threads missing the same key both compute it (the work is idempotent)
rather than one waiting on the other's slow work. Keys that must stay apart per API key carry the caller's
pipelines.scope.KeyScope.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

from cachetools import Cache, LRUCache

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LockedLRU(Generic[K, V]):
    """At most `maxsize` entries, or, with `getsizeof`, entries whose sizes sum to at most `maxsize`; the least
    recently used go first. A value larger than the whole cache is returned but not kept."""

    def __init__(self, maxsize: int, getsizeof: Callable[[V], float] | None = None):
        self._cache: LRUCache[K, V] = LRUCache(maxsize, getsizeof)
        self._lock = threading.Lock()

    @property
    def maxsize(self) -> float:
        return self._cache.maxsize

    def get(self, key: K) -> V | None:
        """The value (now the most recently used), or None."""
        with self._lock:
            return self._cache.get(key)

    def peek(self, key: K) -> V | None:
        """The value without counting it as a use (its place in the eviction order stays), or None."""
        with self._lock:
            # the base class reads without moving the key to the recent end, as LRUCache.__getitem__ does
            return Cache.__getitem__(self._cache, key) if key in self._cache else None

    def put(self, key: K, value: V) -> None:
        with self._lock:
            if self._cache.getsizeof(value) <= self._cache.maxsize:  # cachetools raises on a value too large
                self._cache[key] = value

    def get_or_make(self, key: K, make: Callable[[], V]) -> V:
        """The cached value, else make() (called without the lock held), kept."""
        found = self.get(key)
        if found is not None:
            return found
        value = make()
        self.put(key, value)
        return value

    def __getitem__(self, key: K) -> V:
        with self._lock:
            return self._cache[key]

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._cache

    def __len__(self) -> int:
        with self._lock:
            return len(self._cache)

    def __iter__(self) -> Iterator[K]:
        """The keys at this moment (a copy: the cache may change meanwhile), oldest insertion first."""
        with self._lock:
            return iter(list(self._cache))

    @property
    def currsize(self) -> float:
        with self._lock:
            return self._cache.currsize
