"""A lean HTTP/1.1 keep-alive client for plain-http upstreams (gateway.upstreams.direct's pass-through call).

aiohttp's POST and read were about a quarter of the event loop's time on a pass-through request (py-spy, round
seven): its request and response objects, header multidicts, payload writer, timers and stream reader. This does the
one exchange the direct upstream needs over asyncio protocols, with responses parsed by httptools (the maintained C
parser uvicorn already uses for the gateway's own requests): one write of a prebuilt head and the body, the status,
headers and body as the parser hands them over.

Plain http only: an https upstream (the hosted providers) stays on aiohttp, TLS and all. Nothing here follows
redirects, keeps cookies or reads proxy settings (aiohttp's session did none of the last two; a redirect of a POST
carrying the gateway's key is not followed either). Timeouts are aiohttp's `sock_connect` and `sock_read`: the
connection must be made within the timeout, and the upstream may go no longer than it between two reads.
"""

from __future__ import annotations

import asyncio
import zlib
from collections import deque
from collections.abc import AsyncIterator
from typing import cast
from urllib.parse import urlsplit

import httptools

KEEP_IDLE_S = 15.0  # aiohttp's keepalive_timeout: a connection idle longer is closed, not handed out again
HIGH_WATER = 1 << 20  # response bytes buffered and not yet read before the socket's reading pauses
# the status line and headers together, at most (llhttp sets no limit; aiohttp refuses a line over 8 KiB): an upstream
# sending headers without end is an error, not memory without bound
MAX_HEAD = 1 << 18
# what one read of a compressed body may inflate to (a read is at most 256 KiB: over 256 to 1, past any JSON or SSE);
# a decompression bomb is an error, not gigabytes inflated at once past the high-water mark
MAX_INFLATE = 1 << 26
# one line of a streamed answer, at most (aiohttp's stream reader refuses one over 512 KiB; an SSE event is a few KiB)
MAX_LINE = 1 << 22
USER_AGENT = b"selfroute"


class HTTPClientError(Exception):
    """An exchange with an upstream that failed without an HTTP answer to report."""


class ConnectFailed(HTTPClientError):
    """No connection could be made (refused, unreachable, the name did not resolve)."""


class ServerDisconnected(HTTPClientError):
    """The upstream closed the connection before its answer ended; `answered`: whether any of the answer came;
    `fresh`: whether the request went on a connection made for it (not a kept-alive one its idle timer may close);
    `waited`: seconds from the request's write to the close (0: closed before the request was written)."""

    def __init__(self, message: str, answered: bool, fresh: bool = False, waited: float = 0.0):
        super().__init__(message)
        self.answered = answered
        self.fresh = fresh
        self.waited = waited


class MalformedHTTP(HTTPClientError):
    """What the upstream sent is not HTTP/1.1 this client reads."""


class Response:
    """One answer as it arrives: `status` and `headers` (lower-cased names) once `Pool.post` returns, then the body
    by `read()` (all of it) or `lines()` (as it comes). `release()` hands the connection back when the answer was
    read to its end, and closes it otherwise (the upstream then stops its work)."""

    __slots__ = (
        "status",
        "headers",
        "_raw_headers",
        "_connection",
        "_chunks",
        "_buffered",
        "_waiter",
        "_error",
        "_complete",
        "_decoder",
        "_timeout",
        "_timer",
        "_last_read",
        "_answered",
        "_released",
        "_head_bytes",
        "_gzip",
    )

    def __init__(self, connection: _Connection, timeout: float):
        self.status = 0
        self.headers: dict[str, str] = {}
        self._raw_headers: list[tuple[bytes, bytes]] = []
        self._connection = connection
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self._complete = False
        self._decoder: zlib._Decompress | None = None
        self._timeout = timeout
        loop = connection.loop
        self._last_read = loop.time()
        # one timer per answer, re-armed only when it fires early (a timer per read would cost one per chunk)
        self._timer: asyncio.TimerHandle | None = loop.call_at(self._last_read + timeout, self._check_read)
        self._answered = False
        self._released = False
        self._head_bytes = 0
        self._gzip = False

    # -- fed by the connection -------------------------------------------------------------------------------------
    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _fail(self, error: BaseException) -> None:
        if self._error is None and not self._complete:
            self._error = error
            self._stop_timer()
            self._wake()

    def _headers_done(self, status: int) -> None:
        self.status = status
        headers = self.headers
        for name, value in self._raw_headers:
            key = name.decode("latin-1").lower()
            text = value.decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        self._raw_headers = []
        encoding = headers.get("content-encoding", "").strip().lower()
        if encoding in ("gzip", "x-gzip"):  # decoded as aiohttp's auto_decompress did
            self._decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
            self._gzip = True
        elif encoding == "deflate":
            self._decoder = zlib.decompressobj()
        elif encoding not in ("", "identity"):
            self._fail(MalformedHTTP(f"unsupported content-encoding {encoding!r}"))
            self._connection.close()
        self._wake()

    def _body(self, data: bytes) -> None:
        if self._error is not None:
            return
        if self._decoder is not None:
            try:
                data = self._decoder.decompress(data, MAX_INFLATE)
                while self._decoder.eof and self._decoder.unused_data and self._gzip:
                    # a gzip body may be several members, one after another (RFC 1952): each is decoded, as
                    # aiohttp does, or all but the first would be dropped without a word
                    rest = self._decoder.unused_data
                    self._decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
                    data += self._decoder.decompress(rest, MAX_INFLATE)
                if self._decoder.unconsumed_tail:
                    raise zlib.error(f"one read inflates to over {MAX_INFLATE} bytes")
            except zlib.error as exc:
                self._fail(MalformedHTTP(f"the body does not decompress: {exc}"))
                self._connection.close()
                return
        if data:
            self._chunks.append(data)
            self._buffered += len(data)
            if self._buffered > HIGH_WATER:
                self._connection.pause_reading()
            self._wake()

    def _done(self) -> None:
        if self._error is not None:
            return
        if self._decoder is not None:
            rest = self._decoder.flush()
            if rest:
                self._chunks.append(rest)
        self._complete = True
        self._stop_timer()
        self._wake()

    def _read_now(self, now: float) -> None:
        self._answered = True
        self._last_read = now

    def _check_read(self) -> None:
        self._timer = None
        if self._complete or self._error is not None:
            return
        loop = self._connection.loop
        now = loop.time()
        if self._chunks and self._waiter is None:  # the reader is behind, not the upstream: not a timeout
            self._last_read = now
        deadline = self._last_read + self._timeout
        if now < deadline:
            self._timer = loop.call_at(deadline, self._check_read)
            return
        self._fail(TimeoutError(f"no data from the upstream for {self._timeout:g}s"))
        self._connection.close()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- read by the caller ----------------------------------------------------------------------------------------
    async def _more(self) -> None:
        if self._error is not None:
            raise self._error
        self._connection.resume_reading()  # whoever waits for more wants it, whatever is buffered (read())
        waiter = self._waiter = self._connection.loop.create_future()
        await waiter
        if self._error is not None:
            raise self._error

    async def _headers(self) -> None:
        while not self.status:
            await self._more()
        if self._error is not None:
            raise self._error

    def _take(self) -> bytes | None:
        """The next buffered body bytes, or None when none are buffered."""
        if not self._chunks:
            return None
        data = self._chunks.popleft()
        self._buffered -= len(data)
        if self._buffered <= HIGH_WATER // 2:
            self._connection.resume_reading()
        return data

    async def read(self) -> bytes:
        """The whole body."""
        while not self._complete:
            await self._more()
        chunks, self._chunks, self._buffered = self._chunks, deque(), 0
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def lines(self) -> AsyncIterator[bytes]:
        """The body line by line (b"\\n" ends a line and is kept; the last line may lack it), as aiohttp's
        `response.content` iterates."""
        # a line's pieces are kept apart until its end comes: adding each read to the ones before copied the line
        # once per read (a 32 MB line without a newline: 7.6 s of CPU, the event loop stalled 5.5 s)
        pending: list[bytes] = []
        pending_size = 0
        while True:
            data = self._take()
            if data is None:
                if self._complete:
                    break
                await self._more()
                continue
            start = 0
            if pending and (end := data.find(b"\n")) >= 0:
                pending.append(data[: end + 1])
                yield b"".join(pending)
                pending, pending_size, start = [], 0, end + 1
            while (end := data.find(b"\n", start)) >= 0:
                yield data[start : end + 1]
                start = end + 1
            if start < len(data):
                pending.append(data[start:] if start else data)
                pending_size += len(data) - start
                if pending_size > MAX_LINE:
                    raise MalformedHTTP(f"a line of the upstream's stream runs over {MAX_LINE} bytes")
        if pending:
            yield b"".join(pending)

    def release(self) -> None:
        """The connection back to the pool when the answer was read to its end and may be kept, else closed."""
        if self._released:
            return
        self._released = True
        self._stop_timer()
        self._connection.finished(self._complete and self._error is None and not self._chunks)


class _Connection(asyncio.Protocol):
    """One kept-alive connection to an upstream; answers one request at a time."""

    def __init__(self, pool: Pool, key: tuple[str, int]):
        self.pool = pool
        self.key = key
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: Response | None = None
        self.usable = True  # False once closed, by either side
        self.holding = False  # holds one of the pool's slots: from its request until released or lost
        self.idle_since = 0.0
        self._keep_alive = False
        self._paused = False
        self._informational = False  # parsing a 1xx answer, which the real one follows
        self.exchanges = 0  # requests sent on it: past the first, each reused a kept-alive connection

    # -- asyncio.Protocol ------------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's TCPTransport is not asyncio's class

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None or response._complete:  # nothing was asked: a connection that talks anyway is dropped
            self.close()
            return
        response._read_now(self.loop.time())
        try:
            self.parser.feed_data(data)
            if not response.status:
                response._head_bytes += len(data)
                if response._head_bytes > MAX_HEAD:
                    response._fail(MalformedHTTP(f"the upstream's headers run over {MAX_HEAD} bytes"))
                    self.close()
        except httptools.HttpParserUpgrade:
            response._fail(MalformedHTTP("the upstream switched protocols"))
            self.close()
        except httptools.HttpParserError as exc:
            response._fail(MalformedHTTP(f"malformed HTTP from the upstream: {exc}"))
            self.close()

    def eof_received(self) -> bool:
        return False  # close the transport: HTTP/1.1 has no half-closed connections to keep

    def connection_lost(self, exc: Exception | None) -> None:
        self.usable = False
        self._paused = False  # nothing to resume on a closed transport
        self.pool._forget(self)
        if self.holding:  # a slot is never held by a connection that is gone, released or not
            self.holding = False
            self.pool._release_slot()
        response = self.response
        if response is None or response._complete:
            return
        if response.status and "content-length" not in response.headers and not self._chunked(response):
            response._done()  # a body without a length ends when the connection does
            return
        answered = response._answered
        why = "the upstream closed the connection " + ("mid-answer" if answered else "before answering")
        # nothing read: _last_read is still when the request was written
        waited = self.loop.time() - response._last_read
        response._fail(
            ServerDisconnected(f"Server disconnected: {why}", answered, fresh=self.exchanges == 1, waited=waited)
        )

    def pause_reading(self) -> None:
        if not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()

    @staticmethod
    def _chunked(response: Response) -> bool:
        return "chunked" in response.headers.get("transfer-encoding", "").lower()

    # -- httptools' callbacks --------------------------------------------------------------------------------------
    # Only the answer to the request sent is read: bytes after its end (a second answer, a body longer than its
    # Content-Length) would otherwise be parsed into it, and leave the parser mid-message for the next request on
    # this connection, whosever it is. Such a connection is closed, never handed out again.
    def _reading(self) -> Response | None:
        response = self.response
        return None if response is None or response._complete else response

    def on_message_begin(self) -> None:
        if self.response is not None and self.response._complete:
            self._keep_alive = False
            self.close()

    def on_header(self, name: bytes, value: bytes) -> None:
        if (response := self._reading()) is not None:
            response._raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        if (response := self._reading()) is not None:
            status = self.parser.get_status_code()
            if 100 <= status < 200:  # 100 Continue and the like: the answer follows (101 is an upgrade, refused)
                self._informational = True
                response._raw_headers = []
                return
            self._keep_alive = self.parser.should_keep_alive()
            response._headers_done(status)

    def on_body(self, body: bytes) -> None:
        if (response := self._reading()) is not None:
            response._body(body)

    def on_message_complete(self) -> None:
        if self._informational:
            self._informational = False
            return
        if (response := self._reading()) is not None:
            self._keep_alive = self._keep_alive and self.parser.should_keep_alive()
            response._done()

    # -- the pool's side -------------------------------------------------------------------------------------------
    def send(self, data: bytes, timeout: float) -> Response:
        if not self.usable or self.transport is None:  # closed by the upstream as it was made
            raise ServerDisconnected("Server disconnected: the connection closed before the request", False)
        self.response = response = Response(self, timeout)
        self.exchanges += 1
        self._keep_alive = False
        self._informational = False
        self.transport.write(data)
        return response

    def finished(self, whole: bool) -> None:
        """The response was released: read to its end (`whole`) or abandoned (the connection then closes)."""
        self.response = None
        self.resume_reading()
        self.pool._hand_back(self, whole and self._keep_alive and self.usable)

    def close(self) -> None:
        if self.usable and self.transport is not None:
            self.usable = False
            self.transport.close()


class Pool:
    """Kept-alive connections per (host, port), at most `limit` in use at once (aiohttp's connector limit): a
    request over it waits for one to be handed back."""

    def __init__(self, limit: int = 512):
        self.loop = asyncio.get_running_loop()
        self.limit = limit
        self._free: dict[tuple[str, int], list[_Connection]] = {}
        self._in_use = 0
        self._waiting: deque[asyncio.Future[None]] = deque()
        self.closed = False

    async def post(self, head: Head, payload: bytes, timeout: float) -> Response:
        """The upstream's answer to a POST of `payload` (headers read; the body is the response's to read)."""
        if self.closed:
            raise HTTPClientError("the client is closed")
        while self._in_use >= self.limit:
            waiter = self.loop.create_future()
            self._waiting.append(waiter)
            try:
                async with asyncio.timeout(timeout):  # the wait for a slot counts too, as a connect would
                    await waiter
            except BaseException as exc:
                if waiter.done() and not waiter.cancelled():  # woken, then cancelled: the turn goes on
                    self._wake_next()
                elif waiter in self._waiting:  # a cancelled waiter may already be dropped by _wake_next
                    self._waiting.remove(waiter)
                if isinstance(exc, TimeoutError):
                    raise TimeoutError(f"no connection to the upstream free within {timeout:g}s") from None
                raise
        self._in_use += 1
        connection: _Connection | None = None
        response: Response | None = None
        try:
            connection = self._reuse(head.key) or await self._connect(head.key, timeout)
            connection.holding = True
            response = connection.send(head.request(payload), timeout)
            await response._headers()
            return response
        except BaseException:
            # failed or cancelled (the client left): the connection goes, so the upstream stops too
            if response is not None:
                response.release()
            elif connection is not None:
                connection.finished(False)
            else:
                self._release_slot()
            raise

    def _reuse(self, key: tuple[str, int]) -> _Connection | None:
        free = self._free.get(key)
        now = self.loop.time()
        while free:
            connection = free.pop()  # the most recently used: least likely to have met the upstream's idle timer
            if connection.usable and now - connection.idle_since < KEEP_IDLE_S:
                return connection
            connection.close()
        return None

    async def _connect(self, key: tuple[str, int], timeout: float) -> _Connection:
        host, port = key
        try:
            async with asyncio.timeout(timeout):
                _, protocol = await self.loop.create_connection(lambda: _Connection(self, key), host, port)
        except TimeoutError:
            raise TimeoutError(f"connecting to the upstream took over {timeout:g}s") from None
        except OSError as exc:
            raise ConnectFailed(f"Cannot connect to the upstream: {exc.strerror or exc}") from None
        return protocol

    def _hand_back(self, connection: _Connection, keep: bool) -> None:
        if connection.holding:
            connection.holding = False
            self._release_slot()
        free = self._free.setdefault(connection.key, [])
        if keep and not self.closed and len(free) < self.limit:
            connection.idle_since = self.loop.time()
            free.append(connection)
        else:
            connection.close()

    def _forget(self, connection: _Connection) -> None:
        """A connection the upstream (or this client) closed: out of the free list (one in use is handed back when
        its response is released)."""
        free = self._free.get(connection.key)
        if free and connection in free:
            free.remove(connection)

    def _release_slot(self) -> None:
        self._in_use -= 1
        self._wake_next()

    def _wake_next(self) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break

    async def close(self) -> None:
        self.closed = True
        for free in self._free.values():
            for connection in free:
                connection.close()
        self._free.clear()


class Head:
    """A POST's request line and fixed headers for one URL and credential, built once; `request(payload)` adds the
    length and the body."""

    __slots__ = ("key", "_start")

    def __init__(self, url: str, headers: dict[str, str]):
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"not a plain-http URL: {url!r}")
        self.key = (parts.hostname, parts.port or 80)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        lines = [f"POST {target} HTTP/1.1", f"host: {parts.netloc.rpartition('@')[2]}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        if any("\r" in line or "\n" in line for line in lines):
            raise ValueError("a header holds a line break")  # a configured key must never add headers of its own
        self._start = (
            "\r\n".join(lines).encode("latin-1")
            + b"\r\nuser-agent: "
            + USER_AGENT
            + b"\r\naccept: */*\r\naccept-encoding: gzip, deflate\r\ncontent-length: "
        )

    def request(self, payload: bytes) -> bytes:
        return b"%s%d\r\n\r\n%s" % (self._start, len(payload), payload)
