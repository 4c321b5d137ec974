"""Cancelling request work that runs in worker threads.

A request's handler opens a `cancel_scope()`; code it calls, in its own task or in worker threads
(anyio copies the context into them), asks `cancelled()` between slices of long work, such as
embedding a new document, and stops when the client has gone or the gateway is shutting down."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_current: ContextVar[threading.Event | None] = ContextVar("selfroute_cancel", default=None)


@contextmanager
def cancel_scope() -> Iterator[threading.Event]:
    """An event that, once set, tells the work started inside this block to stop."""
    event = threading.Event()
    token = _current.set(event)
    try:
        yield event
    finally:
        _current.reset(token)


def cancelled() -> bool:
    event = _current.get()
    return event is not None and event.is_set()
