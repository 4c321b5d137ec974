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
SHUTDOWN = 503  # the gateway shut down past its grace period before the answer was done
SHUT_DOWN_TEXT = "the gateway shut down before the answer was ready"
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


class CancelledIfClientLeaves:
    """`with CancelledIfClientLeaves(scope, receive) as leaving:` cancels the task running the block when the client
    leaves before it ends (`on_leave()` first), and on the way out takes that one cancellation back (uncancel): the
    CancelledError it caused, or any exception of `absorbs` raised once the client had left, ends at the block, and
    `leaving.left` says why. A cancellation from elsewhere (a shutdown) goes on. The one piece of "client left ->
    cancel this task -> uncancel" both endings use: unless_disconnected raises ClientDisconnected after it, a stream
    (gateway.server.streaming) just stops.

    asyncio's own cancel/uncancel, not an anyio CancelScope, whose entry and exit (its backend and task look-ups) were
    about 3% of the event loop's time on a pass-through request (py-spy); a class, not a @contextmanager generator,
    as it is entered on every request."""

    __slots__ = ("left", "_scope", "_receive", "_on_leave", "_absorbs", "_task", "_stop")

    def __init__(
        self,
        scope: Scope,
        receive: Receive,
        on_leave: Callable[[], None] | None = None,
        absorbs: type[BaseException] | tuple[type[BaseException], ...] = asyncio.CancelledError,
    ):
        self.left = False
        self._scope, self._receive, self._on_leave, self._absorbs = scope, receive, on_leave, absorbs

    def __enter__(self) -> CancelledIfClientLeaves:
        self._task = asyncio.current_task()
        # not in a task (never so under an ASGI server): nothing to cancel
        self._stop = _no_watch if self._task is None else watch_disconnect(self._scope, self._receive, self._leave)
        return self

    def _leave(self) -> None:
        self.left = True
        if self._on_leave is not None:
            self._on_leave()
        assert self._task is not None  # watched only inside a task
        self._task.cancel()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: object) -> bool:
        self._stop()
        if not self.left:
            return False
        assert self._task is not None
        self._task.uncancel()  # the cancellation was ours: it ends here
        return kind is not None and issubclass(kind, self._absorbs)


async def unless_disconnected(request: Request, work: Callable[[], Awaitable[T]]) -> T:
    """The result of work(), or ClientDisconnected when the client leaves first (whatever work() was doing: its
    result or error is replaced). Worker threads started by work() see pipelines.cancellation.cancelled() turn true
    when the client leaves or when the request is cancelled (a shutdown past its grace period), and stop their long
    loops."""
    with cancel_scope() as stop:
        leaving = CancelledIfClientLeaves(request.scope, request.receive, stop.set, absorbs=BaseException)
        try:
            with leaving:
                result = await work()
        except BaseException:  # not the client leaving (absorbed above): the request itself is cancelled or failed
            stop.set()  # its threads must stop too
            raise
        if leaving.left:
            raise ClientDisconnected()
        return result
