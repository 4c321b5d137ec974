"""Per-key locks for the store's writes within one process."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from pipelines.cancellation import Cancelled, StopFlag

# a holder that may give up (a request whose client may leave) looks at its flag this often while it waits
WAIT_POLL_S = 0.1


class Held:
    """What `KeyedLocks.hold` gives its holder: who else holds or waits for the same key."""

    __slots__ = ("_locks", "_entry")

    def __init__(self, locks: KeyedLocks, entry: list):
        self._locks, self._entry = locks, entry

    def abandoned(self) -> bool:
        """Whether every request holding or waiting for this key has gone (its flag set); never for one without a
        flag (the CLI, a background ingestion): the work done under the lock is then wanted by nobody."""
        with self._locks._guard:
            return all(flag is not None and flag.is_set() for flag in self._entry[1])


class KeyedLocks:
    """One lock per key, created on first use and dropped when nobody holds or waits for it."""

    def __init__(self):
        self._guard = threading.Lock()
        self._locks: dict[str, list] = {}  # key -> [lock, the StopFlag (or None) of each holder and waiter]

    @contextmanager
    def hold(self, key: str, stop: StopFlag | None = None) -> Iterator[Held]:
        """Hold the key's lock. With `stop` (a request's flag), waiting ends in Cancelled once it is set: a request
        whose client left does not queue behind work done for others."""
        with self._guard:
            entry = self._locks.setdefault(key, [threading.Lock(), []])
            entry[1].append(stop)
        try:
            if stop is None:
                entry[0].acquire()
            else:
                while not entry[0].acquire(timeout=WAIT_POLL_S):
                    if stop.is_set():
                        raise Cancelled("left while waiting for work another request is doing")
            try:
                yield Held(self, entry)
            finally:
                entry[0].release()
        finally:
            with self._guard:
                entry[1].remove(stop)
                if not entry[1]:
                    del self._locks[key]
