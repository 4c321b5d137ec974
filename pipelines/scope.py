"""Whose work a cache entry is: one value, passed down explicitly from the request to every cache and store that
must keep API keys apart (remembered question vectors, attached documents' inline collections, their units and
statistics, injection scans, the warm-prefix record).

A remembered result answers faster than a new one, so one key's timing must never tell it what another key sent
or asked; and one key's attached documents must never be read for another. `SHARED` is the scope of work no key
asked for (the CLI, the offline replay): one shared entry.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KeyScope:
    key_id: str | None = None  # the caller's key id (gateway.server.auth.Caller.key_id); None: shared

    @property
    def tag(self) -> str:
        """A stable text for cache keys and names derived from them ("" when shared)."""
        return "" if self.key_id is None else f"key:{self.key_id}"


SHARED = KeyScope()
