"""Cancelling request work that runs in worker threads.

A request's handler opens a `cancel_scope()`; code it calls, in its own task or in worker threads
(anyio copies the context into them), asks `cancelled()` between small steps of long work, such as
each model run while embedding a new document, and stops when the client has gone or the gateway is shutting down.
Work that another waiting request needs too (one ingestion of the same new documents) runs `detached()` from the
request that started it and stops only when every request waiting for it has gone (pipelines.store.locks)."""

from __future__ import annotations

from contextvars import Context, ContextVar, Token, copy_context


class StopFlag:
    """Set once, read from any thread. Nothing waits on it, so no threading.Event (a Condition and a lock built
    for every request)."""

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


_current: ContextVar[StopFlag | None] = ContextVar("selfroute_cancel", default=None)


class Cancelled(Exception):
    """Work given up at one of its checks: its request's client left, or the gateway is shutting down."""


class cancel_scope:  # noqa: N801 - used as a function: `with cancel_scope() as stop:`
    """A flag that, once set, tells the work started inside this block to stop. A class rather than a
    @contextmanager generator: it is entered on every request."""

    __slots__ = ("_flag", "_token")

    def __enter__(self) -> StopFlag:
        self._flag = StopFlag()
        self._token: Token[StopFlag | None] = _current.set(self._flag)
        return self._flag

    def __exit__(self, *exc: object) -> None:
        _current.reset(self._token)


def cancelled() -> bool:
    event = _current.get()
    return event is not None and event.is_set()


def current_flag() -> StopFlag | None:
    """The flag of the request this thread works for (None outside any request: the CLI, a background thread)."""
    return _current.get()


class detached:  # noqa: N801 - used as a function: `with detached():`
    """Inside the block, cancelled() no longer answers for the enclosing request: work shared with other requests
    stops by its own check instead."""

    __slots__ = ("_token",)

    def __enter__(self) -> None:
        self._token: Token[StopFlag | None] = _current.set(None)

    def __exit__(self, *exc: object) -> None:
        _current.reset(self._token)


def detached_context() -> Context:
    """A copy of this context outside any request's scope: for a task that outlives its request (the learning loop's
    shadow and judge work), which its client leaving must not stop."""
    context = copy_context()
    context.run(_current.set, None)
    return context
