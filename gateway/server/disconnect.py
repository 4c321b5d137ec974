"""Work for a request that stops when its client leaves: the work is cancelled at once (upstream calls in flight
included) instead of running, and being paid for, to its end.

How the gateway hears of it: `selfroute serve`'s HTTP protocol (gateway.commands._http_deadline) puts a
`DisconnectHook` in each request's scope (`scope["extensions"][DISCONNECT_HOOK]`) and calls it from the connection's
`connection_lost`. Under any other ASGI server a task waits on the request's receive channel, which reports
http.disconnect once the body has been read. The hook costs nothing per request; the task was about 6% of the event
loop's time on a pass-through request (py-spy): a task, its wake-ups and its done callback, twice for a stream."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from starlette.requests import Request
from starlette.types import Receive, Scope

from pipelines.cancellation import cancel_scope

T = TypeVar("T")

CLIENT_CLOSED = 499  # nginx's "client closed request": the client left before its answer was ready
DISCONNECT_HOOK = "selfroute.disconnect"  # the scope["extensions"] key of a server's DisconnectHook


class ClientDisconnected(Exception):
    """The client went away before its answer was ready."""


class DisconnectHook:
    """One request's line from the server: the server calls `lost()` when the connection goes before the response
    is complete; `callback`, set while the app wants to hear of it, then runs once (in the event loop's thread).
    The server also sets `body_received` once the request's whole body has arrived (gateway.server.bodies then
    reads it without arming a timer)."""

    __slots__ = ("callback", "body_received", "gone")

    def __init__(self) -> None:
        self.callback: Callable[[], None] | None = None
        self.body_received = False
        self.gone = False  # lost before anyone watched: the watcher that comes later hears of it at once

    def lost(self) -> None:
        self.gone = True
        callback, self.callback = self.callback, None
        if callback is not None:
            callback()


def _no_watch() -> None:
    pass


_watchers: set[asyncio.Task] = set()  # strong references: the loop keeps only weak ones to its tasks


def disconnect_hook(scope: Scope) -> DisconnectHook | None:
    """The request's hook when its server gives one (serve's protocol), else None."""
    extensions = scope.get("extensions")
    return extensions.get(DISCONNECT_HOOK) if extensions else None


def watch_disconnect(scope: Scope, receive: Receive, callback: Callable[[], None]) -> Callable[[], None]:
    """Call `callback()` once if the client leaves before the response is complete; the function returned stops
    watching (after it, a disconnect is not reported).

    Without the server's hook, the watcher is a plain task that is never cancelled: once the answer has been sent,
    the ASGI server answers its pending receive() with http.disconnect and it ends by itself. Cancelling it left a
    CancelledError, its traceback and frames in reference cycles on every request, and collecting those stalled the
    event loop for hundreds of milliseconds under load."""
    hook = disconnect_hook(scope)
    if hook is not None:
        if hook.gone:  # the client left before the request was watched (a busy loop): it ran on, answered to no one
            callback()
            return _no_watch
        hook.callback = callback

        def stop_hook() -> None:
            hook.callback = None

        return stop_hook
    watching = True

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        if watching:
            callback()

    watcher = asyncio.get_running_loop().create_task(watch())
    _watchers.add(watcher)
    watcher.add_done_callback(_watchers.discard)

    def stop_task() -> None:
        nonlocal watching
        watching = False

    return stop_task


async def unless_disconnected(request: Request, work: Callable[[], Awaitable[T]]) -> T:
    """The result of work(), or ClientDisconnected when the client leaves first. Worker threads started
    by work() see pipelines.cancellation.cancelled() turn true when the client leaves or when the
    request is cancelled (a shutdown past its grace period), and stop their long loops.

    The client leaving cancels this task, and its one cancellation is taken back (uncancel) as the
    ClientDisconnected it becomes: asyncio's own, not an anyio CancelScope, whose entry and exit (its backend and
    task look-ups) were about 3% of the event loop's time on a pass-through request (py-spy)."""
    task = asyncio.current_task()
    if task is None:  # not in a task (never so under an ASGI server): nothing to cancel
        return await work()
    left = False
    with cancel_scope() as stop:

        def client_left() -> None:
            nonlocal left
            left = True
            stop.set()
            task.cancel()

        stop_watching = watch_disconnect(request.scope, request.receive, client_left)
        try:
            return await work()
        except BaseException:
            if not left:  # the request itself is being cancelled (or failed): its threads must stop too
                stop.set()
            raise
        finally:
            stop_watching()
            if left:
                task.uncancel()  # the cancellation was ours: it ends here, as ClientDisconnected
                raise ClientDisconnected()  # noqa: B012 - the work's own cancellation is replaced by this
