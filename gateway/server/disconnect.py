"""Work for a request that stops when its client leaves: the HTTP server reports the disconnect on the
request's receive channel once the body has been read, and the work is cancelled at once (upstream
calls in flight included) instead of running, and being paid for, to its end."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
from starlette.requests import Request

from pipelines.cancellation import cancel_scope

T = TypeVar("T")

CLIENT_CLOSED = 499  # nginx's "client closed request": the client left before its answer was ready


class ClientDisconnected(Exception):
    """The client went away before its answer was ready."""


_watchers: set[asyncio.Task] = set()  # strong references: the loop keeps only weak ones to its tasks


async def unless_disconnected(request: Request, work: Callable[[], Awaitable[T]]) -> T:
    """The result of work(), or ClientDisconnected when the client leaves first. Worker threads started
    by work() see pipelines.cancellation.cancelled() turn true when the client leaves or when the
    request is cancelled (a shutdown past its grace period), and stop their long loops.

    The watcher is a plain task that is never cancelled: once the answer has been sent, the ASGI server
    answers its pending receive() with http.disconnect and it ends by itself. Cancelling it (a task group
    around the work) left a CancelledError, its traceback and frames in reference cycles on every request,
    and collecting those stalled the event loop for hundreds of milliseconds under load."""
    left = finished = False
    work_scope = anyio.CancelScope()
    with cancel_scope() as stop:

        async def watch() -> None:
            nonlocal left
            while (await request.receive())["type"] != "http.disconnect":
                pass
            if not finished:
                left = True
                stop.set()
                work_scope.cancel()

        watcher = asyncio.get_running_loop().create_task(watch())
        _watchers.add(watcher)
        watcher.add_done_callback(_watchers.discard)
        try:
            with work_scope:
                return await work()
        except BaseException:
            if not left:  # the request itself is being cancelled (or failed): its threads must stop too
                stop.set()
            raise
        finally:
            finished = True
            if left:
                raise ClientDisconnected()  # noqa: B012 - the work's own cancellation is replaced by this
        # work_scope swallows only the watcher's cancellation (so `left` is set and `finally` raised): not reached
        raise ClientDisconnected()
