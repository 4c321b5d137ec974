"""The lean plain-http client (gateway.upstreams.http1) against real loopback servers that answer as scripted: the
framings it must read (length, chunked, gzip, until close), keep-alive reuse, timeouts, an upstream closing early,
malformed HTTP, cancellation closing the connection, the pool's limit."""

from __future__ import annotations

import asyncio
import gzip
import json

import pytest
import uvloop

from gateway.upstreams import http1

PAYLOAD = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


class Script:
    """A loopback server; each accepted connection runs `serve(reader, writer, server)`."""

    def __init__(self, serve):
        self.serve = serve
        self.connections = 0
        self.requests: list[bytes] = []
        self.closed_by_client = asyncio.Event()
        self.open_now = 0
        self.most_open = 0

    async def __aenter__(self) -> Script:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/v1/chat/completions"
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        try:
            await self.serve(reader, writer, self)
        finally:
            self.open_now -= 1
            writer.close()

    async def request(self, reader: asyncio.StreamReader) -> bytes | None:
        """One request's head and body, or None when the client closed the connection."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            self.closed_by_client.set()
            return None
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.startswith(b"content-length"))
        body = await reader.readexactly(length)
        self.requests.append(head + body)
        return body


def run(test):
    return uvloop.run(test())


def answer(body: bytes, *headers: str) -> bytes:
    lines = ["HTTP/1.1 200 OK", "content-type: application/json", *headers]
    if not any(h.startswith(("content-length", "transfer-encoding")) for h in headers):
        lines.append(f"content-length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


async def post(pool: http1.Pool, url: str, timeout: float = 5.0) -> bytes:
    response = await pool.post(http1.Head(url, {"content-type": "application/json"}), PAYLOAD, timeout)
    try:
        return await response.read()
    finally:
        response.release()


def test_length_chunked_and_gzip_answers_are_read_whole_on_one_kept_alive_connection():
    async def serve(reader, writer, server):
        answers = [
            answer(b'{"a": 1}'),
            answer(chunked(b'{"b":', b" 2}"), "transfer-encoding: chunked"),
            answer(gzip.compress(b'{"c": 3}'), "content-encoding: gzip"),
        ]
        for reply in answers:
            assert await server.request(reader) == PAYLOAD
            writer.write(reply)
            await writer.drain()
        await server.request(reader)

    async def test():
        async with Script(serve) as server:
            pool = http1.Pool()
            assert [await post(pool, server.url) for _ in range(3)] == [b'{"a": 1}', b'{"b": 2}', b'{"c": 3}']
            await pool.close()
            assert server.connections == 1
            head = server.requests[0].split(b"\r\n\r\n")[0].decode()
            assert head.startswith("POST /v1/chat/completions HTTP/1.1\r\n")
            assert f"content-length: {len(PAYLOAD)}" in head and "host: 127.0.0.1:" in head

    run(test)


def test_stream_lines_are_whole_however_the_reads_split_them():
    events = [b"data: " + json.dumps({"n": n, "pad": "x" * 50}).encode() + b"\n\n" for n in range(5)] + [
        b"data: [DONE]\n\n"
    ]
    wire = b"".join(events)

    async def serve(reader, writer, server):
        await server.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for start in range(0, len(wire), 37):  # cuts inside lines
            writer.write(chunked(wire[start : start + 37])[:-5])
            await writer.drain()
            await asyncio.sleep(0.001)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await server.request(reader)

    async def test():
        async with Script(serve) as server:
            pool = http1.Pool()
            response = await pool.post(http1.Head(server.url, {}), PAYLOAD, 5.0)
            assert response.status == 200 and response.headers["content-type"] == "text/event-stream"
            lines = [line async for line in response.lines()]
            response.release()
            assert b"".join(lines) == wire and all(line.endswith(b"\n") for line in lines)
            assert [line for line in lines if line.startswith(b"data:")] == [e[:-1] for e in events]
            await pool.close()

    run(test)


def test_a_body_without_a_length_ends_with_the_connection_which_is_not_reused():
    async def serve(reader, writer, server):
        await server.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n" + b'{"whole": true}')
        await writer.drain()

    async def test():
        async with Script(serve) as server:
            pool = http1.Pool()
            assert await post(pool, server.url) == b'{"whole": true}'
            assert await post(pool, server.url) == b'{"whole": true}'
            assert server.connections == 2
            await pool.close()

    run(test)


def test_an_upstream_that_goes_quiet_times_out_before_and_during_its_answer():
    async def silent(reader, writer, server):
        await server.request(reader)
        await server.request(reader)  # until the client gives up and closes

    async def stalls(reader, writer, server):
        await server.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{")
        await writer.drain()
        await asyncio.sleep(5)

    async def test():
        for serve in (silent, stalls):
            async with Script(serve) as server:
                pool = http1.Pool()
                started = asyncio.get_running_loop().time()
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(post(pool, server.url, timeout=0.3), 3)  # the bound: not a hang
                assert 0.25 < asyncio.get_running_loop().time() - started < 2
                await asyncio.wait_for(server.closed_by_client.wait(), 2) if serve is silent else None
                await pool.close()

    run(test)


def test_an_upstream_closing_before_or_during_its_answer_is_server_disconnected():
    async def before(reader, writer, server):
        await server.request(reader)

    async def during(reader, writer, server):
        await server.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{")
        await writer.drain()

    async def test():
        for serve, answered in ((before, False), (during, True)):
            async with Script(serve) as server:
                pool = http1.Pool()
                with pytest.raises(http1.ServerDisconnected) as caught:
                    await post(pool, server.url)
                assert caught.value.answered is answered
                await pool.close()

    run(test)


def test_malformed_http_and_a_refused_connection_are_client_errors():
    async def garbage(reader, writer, server):
        await server.request(reader)
        writer.write(b"SPDY/9 banana\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    async def brotli(reader, writer, server):
        await server.request(reader)
        writer.write(answer(b"\x00\x01", "content-encoding: br"))
        await writer.drain()
        await asyncio.sleep(1)

    async def test():
        for serve in (garbage, brotli):
            async with Script(serve) as server:
                pool = http1.Pool()
                with pytest.raises(http1.MalformedHTTP):
                    await post(pool, server.url)
                await pool.close()
        async with Script(garbage) as server:
            url = server.url
        with pytest.raises(http1.ConnectFailed):  # the server is gone: nothing listens on its port
            await post(http1.Pool(), url)

    run(test)


def test_a_cancelled_request_closes_its_connection_so_the_upstream_stops():
    async def slow(reader, writer, server):
        await server.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        writer.write(chunked(b"data: 1\n\n")[:-5])
        await writer.drain()
        await server.request(reader)  # returns None when the client closes

    async def test():
        for read_first in (False, True):
            async with Script(slow) as server:
                pool = http1.Pool()

                async def call():
                    response = await pool.post(http1.Head(server.url, {}), PAYLOAD, 5.0)
                    try:
                        async for _ in response.lines():
                            pass
                    finally:
                        response.release()

                task = asyncio.create_task(call())
                await asyncio.sleep(0.2 if read_first else 0)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                await asyncio.wait_for(server.closed_by_client.wait(), 2)
                assert pool._in_use == 0 and not any(pool._free.values())
                await pool.close()

    run(test)


def test_the_pool_holds_no_more_than_its_limit_of_connections_in_use():
    async def serve(reader, writer, server):
        while await server.request(reader) is not None:
            await asyncio.sleep(0.02)
            writer.write(answer(b"{}"))
            await writer.drain()

    async def test():
        async with Script(serve) as server:
            pool = http1.Pool(limit=2)
            assert await asyncio.gather(*(post(pool, server.url) for _ in range(8))) == [b"{}"] * 8
            assert server.most_open == 2 and server.connections == 2
            await pool.close()

    run(test)


def test_a_large_answer_read_slowly_arrives_whole():
    body = bytes(range(256)) * (3 * 4096 + 7)  # over the high-water mark: reading pauses and resumes

    async def serve(reader, writer, server):
        await server.request(reader)
        writer.write(answer(body))
        await writer.drain()
        await server.request(reader)

    async def test():
        async with Script(serve) as server:
            pool = http1.Pool()
            response = await pool.post(http1.Head(server.url, {}), PAYLOAD, 5.0)
            await asyncio.sleep(0.2)
            assert await response.read() == body
            response.release()
            await pool.close()

    run(test)


def test_a_header_with_a_line_break_is_refused_and_only_plain_http_is_taken():
    with pytest.raises(ValueError):
        http1.Head("http://127.0.0.1:9/v1", {"authorization": "Bearer k\r\nx-other: 1"})
    with pytest.raises(ValueError):
        http1.Head("https://api.openai.com/v1/chat/completions", {})


def test_a_response_never_released_frees_its_slot_when_its_connection_goes():
    async def serve(reader, writer, server):
        await server.request(reader)
        writer.write(answer(b"{}", "connection: close"))
        await writer.drain()

    async def test():
        async with Script(serve) as server:
            pool = http1.Pool(limit=1)
            dropped = await pool.post(http1.Head(server.url, {}), PAYLOAD, 5.0)  # read by nobody, never released
            assert dropped.status == 200
            assert await asyncio.wait_for(post(pool, server.url), 3) == b"{}"  # not stuck behind it


def test_bytes_after_an_answer_close_its_connection_and_never_reach_the_next_request():
    """An upstream whose answer runs past its end (a second answer's head, a body longer than its Content-Length)
    in the same write: the parser must not carry that into the next request on the connection, whosever it is (it
    took the next answer's bytes as the stray body and the request waited for a status forever)."""
    stray = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 13\r\n\r\n"

    async def serve(reader, writer, server):
        while await server.request(reader) is not None:
            first = len(server.requests) == 1
            writer.write(answer(b'{"n": %d}' % len(server.requests)) + (stray if first else b""))
            await writer.drain()

    async def test():
        async with Script(serve) as server:
            pool = http1.Pool()
            response = await pool.post(http1.Head(server.url, {}), PAYLOAD, 5.0)
            assert await response.read() == b'{"n": 1}' and response.headers["content-type"] == "application/json"
            response.release()
            assert await asyncio.wait_for(post(pool, server.url), 3) == b'{"n": 2}'
            assert server.connections == 2  # the first connection was dropped, not handed out again
            await pool.close()

    run(test)


def test_an_informational_answer_before_the_real_one_is_skipped():
    async def serve(reader, writer, server):
        while await server.request(reader) is not None:
            writer.write(b"HTTP/1.1 100 Continue\r\nx-step: one\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.05)  # a read of its own: the 1xx must not pass for the answer
            writer.write(answer(b'{"ok": 1}'))
            await writer.drain()

    async def test():
        async with Script(serve) as server:
            pool = http1.Pool()
            for _ in range(2):
                response = await pool.post(http1.Head(server.url, {}), PAYLOAD, 5.0)
                assert response.status == 200 and "x-step" not in response.headers
                assert await response.read() == b'{"ok": 1}'
                response.release()
            assert server.connections == 1
            await pool.close()

    run(test)


def test_headers_without_end_are_malformed_not_memory_without_bound():
    async def serve(reader, writer, server):
        await server.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n")
        try:
            for n in range(100_000):  # 100 MB of headers if nothing stops it
                writer.write(b"x-%d: %s\r\n" % (n, b"y" * 1000))
                await writer.drain()
        except ConnectionError:
            server.closed_by_client.set()

    async def test():
        async with Script(serve) as server:
            pool = http1.Pool()
            with pytest.raises(http1.MalformedHTTP, match="headers run over"):
                await asyncio.wait_for(post(pool, server.url), 10)
            await asyncio.wait_for(server.closed_by_client.wait(), 5)
            await pool.close()

    run(test)


def test_a_waiter_woken_then_cancelled_passes_its_slot_on():
    """With the pool full, a request woken for a freed slot but cancelled before it runs (its client left) must hand
    the slot to the next waiter, or that one waits forever with nothing in use."""

    async def test():
        release = asyncio.Event()

        async def serve(reader, writer, server):
            while await server.request(reader) is not None:
                await release.wait()
                writer.write(answer(b"{}"))
                await writer.drain()

        async with Script(serve) as server:
            pool = http1.Pool(limit=1)
            first = asyncio.create_task(post(pool, server.url))
            await asyncio.sleep(0.1)
            woken, last = asyncio.create_task(post(pool, server.url)), asyncio.create_task(post(pool, server.url))
            await asyncio.sleep(0.1)
            release.set()
            while not first.done():  # the first answer frees the slot and wakes `woken`, which has not run yet
                await asyncio.sleep(0)
            woken.cancel()
            assert await asyncio.wait_for(last, 3) == b"{}"
            await pool.close()

    run(test)


def test_a_gzip_body_of_several_members_is_decoded_whole():
    body = b'{"choices": [], "text": "' + b"x" * 5000 + b'"}'
    members = b"".join(gzip.compress(body[i : i + 1000]) for i in range(0, len(body), 1000))

    async def serve(reader, writer, server):
        await server.request(reader)
        writer.write(answer(members, "content-encoding: gzip"))
        await writer.drain()
        await server.request(reader)

    async def test():
        async with Script(serve) as server:
            pool = http1.Pool()
            assert await post(pool, server.url) == body  # was the first member only: a truncated 200
            await pool.close()

    run(test)


def test_a_stream_line_over_the_cap_is_malformed_and_lines_across_many_reads_arrive_whole():
    long_line = b"data: " + b"x" * 300_000 + b"\n"

    async def serve(reader, writer, server):
        await server.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        stream = b"data: 1\n\n" + long_line + b"\ndata: 2\n\n" + b"data: " + b"y" * (http1.MAX_LINE + 10)
        for at in range(0, len(stream), 4096):  # many reads per line
            piece = stream[at : at + 4096]
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
        await server.request(reader)

    async def test():
        async with Script(serve) as server:
            pool = http1.Pool()
            response = await pool.post(http1.Head(server.url, {}), PAYLOAD, 5.0)
            lines = []
            with pytest.raises(http1.MalformedHTTP, match="runs over"):
                async for line in response.lines():
                    lines.append(line)
            assert lines == [b"data: 1\n", b"\n", long_line, b"\n", b"data: 2\n", b"\n"]
            response.release()
            await pool.close()

    run(test)


def test_a_read_inflating_past_the_cap_is_malformed_not_memory_at_once(monkeypatch):
    monkeypatch.setattr(http1, "MAX_INFLATE", 1 << 20)
    bomb = gzip.compress(b"0" * (8 << 20), 9)  # 8 KiB that inflate to 8 MiB, in one read

    async def serve(reader, writer, server):
        await server.request(reader)
        writer.write(answer(bomb, "content-encoding: gzip"))
        await writer.drain()
        await server.request(reader)

    async def test():
        async with Script(serve) as server:
            pool = http1.Pool()
            with pytest.raises(http1.MalformedHTTP, match="inflates to over"):
                await post(pool, server.url)
            await pool.close()

    run(test)


def test_waiting_for_a_slot_times_out_and_a_cancelled_waiter_leaves_quietly():
    async def test():
        release = asyncio.Event()

        async def serve(reader, writer, server):
            while await server.request(reader) is not None:
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
                await writer.drain()
                await release.wait()
                writer.write(b"{}")
                await writer.drain()

        async with Script(serve) as server:
            pool = http1.Pool(limit=1)
            head = http1.Head(server.url, {})
            held = await pool.post(head, PAYLOAD, 5.0)  # the one slot, its body not yet come
            with pytest.raises(TimeoutError, match="no connection"):  # waited without end before
                await pool.post(head, PAYLOAD, 0.2)
            # cancelled, and its waiter dropped by a release before the task runs: CancelledError, not ValueError
            waiting = asyncio.create_task(pool.post(head, PAYLOAD, 5.0))
            await asyncio.sleep(0.05)
            waiting.cancel()
            held.release()  # frees the slot and pops the cancelled waiter in this same turn
            with pytest.raises(asyncio.CancelledError):
                await waiting
            release.set()
            assert pool._in_use == 0 and await asyncio.wait_for(post(pool, server.url), 3) == b"{}"
            await pool.close()

    run(test)
