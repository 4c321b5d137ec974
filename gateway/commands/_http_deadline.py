"""uvicorn's httptools protocol with a deadline on the request head and one socket write per response, for
`selfroute serve`.

uvicorn times out only idle kept-alive connections (after a response): a client that opens connections and sends
nothing, or sends its headers a byte at a time, holds each for ever. Here the request line and headers must all
arrive within HEADER_TIMEOUT_S of the connection opening, or of the previous response on a kept-alive connection;
else the connection is closed. Module-level (not built per call) so worker processes can unpickle uvicorn's config.

uvicorn writes a response's status line and headers, then its body, in two transport writes: two send() calls and
two TCP segments for every answer (on loopback the kernel's receive work for both is charged to the sender too). The
connection's transport here holds what one event-loop iteration writes and sends it in one write at the iteration's
end (`HeldWrites`): a whole answer leaves in one segment, a stream's events of one iteration together.

Each request's scope carries a `DisconnectHook` (gateway.server.disconnect) that `connection_lost` calls for every
request of the connection whose response is not complete: the app hears of a client leaving without a task per
request waiting on receive(). The hook also says when the request's body has all arrived (gateway.server.bodies
then reads it without its timer).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.server.disconnect import DISCONNECT_HOOK, DisconnectHook

HEADER_TIMEOUT_S = 10.0  # set by `selfroute serve --header-timeout` in each process


class HeldWrites:
    """A connection's transport that sends what is written during one loop iteration in one write when it ends (or
    when the connection is closed: nothing written is dropped before close)."""

    __slots__ = ("_transport", "_loop", "_held")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop):
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] | None = None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is None:
            self._held = [data]
            self._loop.call_soon(self._send)
        else:
            held.append(data)

    def writelines(self, chunks: Any) -> None:
        for chunk in chunks:
            self.write(chunk)

    def _send(self) -> None:
        held, self._held = self._held, None
        if held and not self._transport.is_closing():  # a client that left gets nothing (uvicorn's writes check too)
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self._send()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(len(chunk) for chunk in self._held or ())

    def __getattr__(self, name: str) -> Any:  # the rest (pause_reading, get_extra_info, set_protocol, ...) as is
        return getattr(self._transport, name)


class HeaderDeadlineProtocol(HttpToolsProtocol):
    _head_deadline = None
    _hooks: deque[DisconnectHook] | None = None  # the connection's requests whose responses are not complete, in order

    def _arm(self) -> None:
        self._disarm()
        self._head_deadline = self.loop.call_later(HEADER_TIMEOUT_S, self._head_too_slow)

    def _disarm(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_too_slow(self) -> None:
        self._head_deadline = None
        if not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(HeldWrites(transport, self.loop))  # type: ignore[arg-type]
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        hook = DisconnectHook()
        self.scope["extensions"] = {DISCONNECT_HOOK: hook}  # type: ignore[dict-item]
        if self._hooks is None:
            self._hooks = deque()
        self._hooks.append(hook)

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        if self._hooks:  # the request being parsed is the connection's last
            self._hooks[-1].body_received = True
        super().on_message_complete()
        # uvicorn stops reading while over 64 kB of body wait unread and reads again only when the app asks for more:
        # a body whose last part was large left the socket unread until the response ended, so a client leaving was
        # never heard (no connection_lost). The body is whole now; read on (a queued pipelined request stays paused)
        if not self.pipeline:
            self.flow.resume_reading()

    def on_response_complete(self) -> None:
        if self._hooks:  # HTTP/1.1 answers a connection's requests in order
            self._hooks.popleft()
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
        while self._hooks:
            self._hooks.popleft().lost()
