"""Per-key locks for the store's writes within one process."""

from __future__ import annotations

import threading
from contextlib import contextmanager


class KeyedLocks:
    """One lock per key, created on first use and dropped when nobody holds or waits for it."""

    def __init__(self):
        self._guard = threading.Lock()
        self._locks: dict[str, list] = {}  # key -> [lock, holders and waiters]

    @contextmanager
    def hold(self, key: str):
        with self._guard:
            entry = self._locks.setdefault(key, [threading.Lock(), 0])
            entry[1] += 1
        try:
            with entry[0]:
                yield
        finally:
            with self._guard:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._locks[key]
