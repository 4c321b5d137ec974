"""Work for a request that stops when its client leaves: the HTTP server reports the disconnect on the
request's receive channel once the body has been read, and the work is cancelled at once (upstream
calls in flight included) instead of running, and being paid for, to its end."""
from __future__ import annotations

from typing import Awaitable, Callable, TypeVar

import anyio
from starlette.requests import Request

from pipelines.cancellation import cancel_scope

T = TypeVar("T")

CLIENT_CLOSED = 499  # nginx's "client closed request": the client left before its answer was ready


class ClientDisconnected(Exception):
    """The client went away before its answer was ready."""


async def unless_disconnected(request: Request, work: Callable[[], Awaitable[T]]) -> T:
    """The result of work(), or ClientDisconnected when the client leaves first. Worker threads started
    by work() see pipelines.cancellation.cancelled() turn true when the client leaves or when the
    request is cancelled (a shutdown past its grace period), and stop their long loops."""
    left = finished = False
    error: Exception | None = None
    value: T | None = None
    work_scope = anyio.CancelScope()
    with cancel_scope() as stop:

        async def watch() -> None:
            nonlocal left
            try:
                while (await request.receive())["type"] != "http.disconnect":
                    pass
            except anyio.get_cancelled_exc_class():
                if not finished:  # the request itself is being cancelled: its threads must stop too
                    stop.set()
                raise
            left = True
            stop.set()
            work_scope.cancel()

        async with anyio.create_task_group() as watcher:
            watcher.start_soon(watch)
            with work_scope:
                try:
                    value = await work()
                except Exception as exc:  # raised below, outside the task group (which would wrap it)
                    error = exc
            finished = True
            watcher.cancel_scope.cancel()
    if left:
        raise ClientDisconnected()
    if error is not None:
        raise error
    return value  # type: ignore[return-value]
