"""uvicorn's httptools protocol with a deadline on the request head, for `selfroute serve`.

uvicorn times out only idle kept-alive connections (after a response): a client that opens connections and sends
nothing, or sends its headers a byte at a time, holds each for ever. Here the request line and headers must all
arrive within HEADER_TIMEOUT_S of the connection opening, or of the previous response on a kept-alive connection;
else the connection is closed. Module-level (not built per call) so worker processes can unpickle uvicorn's config.
"""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

HEADER_TIMEOUT_S = 10.0  # set by `selfroute serve --header-timeout` in each process


class HeaderDeadlineProtocol(HttpToolsProtocol):
    _head_deadline = None

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
        super().connection_made(transport)
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
