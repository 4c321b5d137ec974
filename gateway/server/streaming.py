"""Relaying an upstream stream to the client as server-sent events."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from starlette.responses import StreamingResponse

from gateway.errors import GatewayError
from gateway.protocol import chunk_has_choices, chunk_usage, truncated_chunks
from gateway.routing.calls import Streamed, StreamFinish, close_stream
from gateway.routing.streaming import chunk_text
from gateway.server.disconnect import CLIENT_CLOSED, SHUT_DOWN_TEXT, SHUTDOWN, CancelledIfClientLeaves
from gateway.server.errors import failure
from gateway.server.sse import DONE, sse_event, sse_json
from gateway.upstreams.base import client_safe, malformed_chunk
from gateway.upstreams.errors import UpstreamError

logger = logging.getLogger(__name__)


class EventStreamResponse(StreamingResponse):
    """SSE that always watches for the client leaving (Starlette only does so for older ASGI servers), so
    an abandoned stream stops pulling, and paying for, upstream tokens at once instead of at its end."""

    media_type = "text/event-stream"

    def __init__(
        self, content: AsyncIterator[bytes], headers: dict[str, str] | None = None, watch: Leaving | None = None
    ):
        super().__init__(content, headers={"cache-control": "no-cache", **(headers or {})})
        self.watch = watch

    async def __call__(self, scope, receive, send) -> None:
        # the stream runs in this task; the client leaving cancels it (gateway.server.disconnect: serve's hook, or a
        # plain task waiting on receive()) and the relay records it (499). An anyio task group (a task for the
        # stream, a cancel scope, its cancel formatting the task's repr) was a tenth of the event loop's time on a
        # pass-through stream (py-spy).
        with CancelledIfClientLeaves(scope, receive) as leaving:
            if self.watch is not None:
                self.watch.leaving = leaving
            try:
                await self.stream_response(send)
            except OSError:  # the socket went away mid-write
                pass


class Leaving:
    """Tells the relay whether a cancellation was the client leaving (499) or a shutdown past its grace (503)."""

    __slots__ = ("leaving",)

    def __init__(self) -> None:
        self.leaving: CancelledIfClientLeaves | None = None

    @property
    def client_left(self) -> bool:
        return self.leaving is None or self.leaving.left


# (the stream's first chunk, its whole text) -> a trailing chunk to send before the usage chunk and [DONE], or None
AfterText = Callable[[bytes, str], Awaitable[bytes | None]]


async def _after(after_text: AfterText, first: bytes, text: str) -> bytes | None:
    """A failed check must not fail an answer the client already has: logged, and the stream ends as it would."""
    try:
        return await after_text(first, text)
    except Exception:
        logger.exception("the check after the stream failed")
        return None


def stream_response(
    streamed: Streamed,
    headers: dict[str, str] | None = None,
    final: Callable[[bytes], bytes] | None = None,
    after_text: AfterText | None = None,
) -> EventStreamResponse:
    chunks = streamed.chunks
    if streamed.cut_short is not None and streamed.first is not None:
        chunks = then_truncated(chunks, streamed.first, streamed.cut_short)
    watch = Leaving()
    return EventStreamResponse(
        relay_stream(streamed.first, chunks, streamed.client_wants_usage, streamed.finish, final, after_text, watch),
        headers=headers,
        watch=watch,
    )


async def then_truncated(chunks: AsyncIterator[bytes], first: bytes, usage: dict[str, Any]) -> AsyncIterator[bytes]:
    """A held answer cut after its opening, closed as truncated: its chunks, then finish_reason "length" and the
    usage counted so far (relayed like the upstream's own: the usage chunk only when the client asked for it)."""
    try:
        async for item in chunks:
            yield item
        for item in truncated_chunks(first, usage):
            yield item
    finally:
        await close_stream(chunks)


async def relay_stream(
    first: bytes | None,
    chunks: AsyncIterator[bytes],
    client_wants_usage: bool,
    finish: StreamFinish,
    final: Callable[[bytes], bytes] | None = None,
    after_text: AfterText | None = None,
    watch: Leaving | None = None,
) -> AsyncIterator[bytes]:
    """Forward upstream chunks; note usage for the ledger; drop the usage chunk the client did not ask for.

    `finish(usage, error, status, relayed)` runs exactly once, however the stream ends (`relayed`: the chunks with
    choices sent). The HTTP status was 200
    when the headers went out; the ledger records how the request really ended (an error's status, or
    499 when the client left), so failed streams show up as failures in the reports.
    With `final`, the usage chunk the client asked for is held until the stream has ended and its leg is in the
    ledger entry, then sent as `final` rewrites it (every leg's usage and the cost: gateway.server.usage).
    With `after_text`, the stream's text is collected as it is relayed and, once the upstream stream has ended whole,
    handed to it (the grounding check: gateway.server.grounding); the chunk it returns goes out before the usage
    chunk and [DONE], and before the ledger entry is settled (so the entry can record what it found).
    """
    usage = None
    relayed = 0  # chunks with choices sent: about one token each, what an answer ending without usage is charged
    finished = False
    held: bytes | None = None  # the usage chunk, while `final` waits for the stream's end
    parts: list[str] | None = [] if after_text is not None else None  # the text, only when something reads it

    async def end(error: str | None, status: int) -> None:
        # settle the ledger before the last event goes out: a client that has read [DONE] finds its row
        nonlocal finished
        finished = True
        with anyio.CancelScope(shield=True):  # close the upstream even while being cancelled
            closer = getattr(chunks, "aclose", None)
            if closer is not None:
                await closer()
        finish(usage, error, status, relayed)

    try:
        data = first
        while data is not None:
            try:
                found = chunk_usage(data)
                forward = found is None or client_wants_usage or chunk_has_choices(data)
            except (ValueError, AttributeError) as exc:
                raise malformed_chunk(exc) from None
            if found is not None:
                usage = found
                if forward and final is not None:
                    held, forward = data, False
            else:
                relayed += 1
            if forward:
                yield sse_event(data)
            if parts is not None:
                parts.append(chunk_text(data))
            try:
                data = await chunks.__anext__()
            except StopAsyncIteration:
                data = None
        if after_text is not None and first is not None and parts is not None:
            trailing = await _after(after_text, first, "".join(parts))
            if trailing is not None:
                yield sse_event(trailing)
        await end(None, 200)
        if held is not None and final is not None:  # held only with `final`
            yield sse_event(final(held))
        yield DONE
    except asyncio.CancelledError:
        if watch is None or watch.client_left:  # the client left: the finally records it (499)
            raise
        # a shutdown past its grace period: recorded and told as one (a non-stream request gets the same 503), not
        # as the client leaving, and the stream ends with an error event and [DONE] instead of a cut (probe11)
        await end(SHUT_DOWN_TEXT, SHUTDOWN)
        yield sse_json(GatewayError(SHUTDOWN, SHUT_DOWN_TEXT, code="shutting_down").body())
        yield DONE
    except (GatewayError, UpstreamError) as exc:  # an upstream's failure mid-stream, as the error table says
        error = failure(exc).error
        await end(error.message, error.status)
        if held is not None and final is not None:  # held only with `final`
            yield sse_event(final(held))
        yield sse_json(error.body())
        yield DONE
    except Exception as exc:  # a broken upstream must still end the stream with an error event, not a cut
        logger.exception("stream relay failed")
        broken = GatewayError(
            502, f"upstream stream failed: {type(exc).__name__}: {client_safe(str(exc))}", code="upstream_error"
        )
        await end(broken.message, broken.status)
        yield sse_json(broken.body())
        yield DONE
    finally:
        if not finished:
            await end("client disconnected before the stream ended", CLIENT_CLOSED)
