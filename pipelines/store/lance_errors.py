"""LanceDB's failures as the store's own errors (pipelines.errors): storage down -> StoreUnavailable, a table
dropped under a reader -> CollectionNotFound.

By type where LanceDB gives one: an OSError is an IO failure, and opening a missing table raises
FileNotFoundError or ValueError. Errors from Lance's Rust core all arrive as a bare RuntimeError (lancedb 0.40 has
no classes for them), so those two kinds are told apart by Lance's error-kind tag in the text, here and nowhere
else."""

from __future__ import annotations

import functools
import logging

from pipelines.errors import CollectionNotFound, StoreUnavailable

log = logging.getLogger(__name__)

# what opening a table that is not there raises
MISSING_TABLE = (FileNotFoundError, ValueError)
_IO_KIND = "LanceError(IO)"
_NOT_FOUND_KIND = "lance error: Not found"


def storage_failed(exc: BaseException) -> bool:
    """LanceDB's IO errors: an unreachable bucket, a refused disk."""
    return isinstance(exc, OSError) or (isinstance(exc, RuntimeError) and _IO_KIND in str(exc))


def dropped(exc: BaseException) -> bool:
    """LanceDB's error for a table whose files went while it was open: another process dropped it."""
    return isinstance(exc, RuntimeError) and _NOT_FOUND_KIND in str(exc)


def io_as_unavailable(method):
    """A store method whose storage failed raises StoreUnavailable; the cause goes to the log. One whose
    collection was dropped while it read it (its first argument names the collection) raises CollectionNotFound."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except (OSError, RuntimeError) as exc:
            if dropped(exc):
                collection = args[1] if len(args) > 1 and isinstance(args[1], str) else ""
                raise CollectionNotFound(collection) from None
            if not storage_failed(exc):
                raise
            log.warning("document store unavailable: %s", exc)
            raise StoreUnavailable(StoreUnavailable.message) from None

    return wrapper
