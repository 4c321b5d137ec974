"""The lean plain-http client (gateway/upstreams/http1.py) against hostile loopback upstreams (round eight, review8).

    PYTHONPATH=TREE .venv/bin/python tests/benchmarks/bench_http1_hostile.py

Prints, for this tree:
- one streamed line of 8 and 32 MB without a newline, read by `Response.lines()` with the 4 MiB line cap lifted:
  process CPU and the event loop's worst stall (a ticker every 10 ms); before c0e40f4 the line was copied on every
  read (32 MB: 7.6 s CPU, 5.5 s stall at load 22);
- the same line with the cap in force (MalformedHTTP);
- a gzip stream of 1 MB inflating to 528 MB: refused at the first read inflating past MAX_INFLATE (64 MiB), and the
  process's peak RSS before and after (before 65a946c: 528 MB inflated, peak RSS 540 MB);
- 600 concurrent requests on a pool of 512 against an upstream answering in 0-50 ms, 100 of them cancelled
  20 ms in, three rounds: answered, cancelled, other, slots in use after.
"""

from __future__ import annotations

import asyncio
import random
import resource
import time
import zlib

import uvloop

from gateway.upstreams import http1

PAYLOAD = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


async def read_request(reader: asyncio.StreamReader) -> bool:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return False
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.startswith(b"content-length"))
    await reader.readexactly(length)
    return True


async def serving(serve) -> tuple[asyncio.Server, str]:
    async def accept(reader, writer):
        try:
            await serve(reader, writer)
        except ConnectionError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/chat/completions"


async def long_line(megabytes: int, capped: bool) -> str:
    piece = b"x" * 65536

    async def serve(reader, writer):
        await read_request(reader)
        writer.write(SSE_HEAD)
        for _ in range(megabytes * 16):
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
        writer.write(b"1\r\n\n\r\n0\r\n\r\n")
        await writer.drain()
        await read_request(reader)

    saved = http1.MAX_LINE
    if not capped:
        http1.MAX_LINE = 1 << 30
    server, url = await serving(serve)
    pool = http1.Pool()
    gaps: list[float] = []

    async def ticker():
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    try:
        response = await pool.post(http1.Head(url, {}), PAYLOAD, 30)
        tick = asyncio.ensure_future(ticker())
        started = time.process_time()
        try:
            longest = max([len(line) async for line in response.lines()])
            outcome = f"read whole, longest line {longest} bytes"
        except http1.MalformedHTTP as exc:
            outcome = f"MalformedHTTP ({exc})"
        cpu = time.process_time() - started
        tick.cancel()
        response.release()
        return f"{megabytes} MB line, cap {'on' if capped else 'lifted'}: {outcome}; CPU {cpu:.2f} s, worst loop stall {max(gaps, default=0) * 1000:.0f} ms"
    finally:
        http1.MAX_LINE = saved
        await pool.close()
        server.close()


async def bomb() -> str:
    # compressed a megabyte at a time, so that the peak RSS printed is the client's, not the bomb's making
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    event = (b"data: " + b"0" * 1000 + b"\n\n") * 1024
    body = b"".join(packer.compress(event) for _ in range(512)) + packer.flush()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024

    async def serve(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-encoding: gzip\r\n")
        writer.write(b"content-length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        await read_request(reader)

    server, url = await serving(serve)
    pool = http1.Pool()
    inflated = 0
    try:
        response = await pool.post(http1.Head(url, {}), PAYLOAD, 30)
        try:
            async for line in response.lines():
                inflated += len(line)
            outcome = "read whole"
        except http1.MalformedHTTP as exc:
            outcome = f"MalformedHTTP ({exc})"
        response.release()
    finally:
        await pool.close()
        server.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    return (
        f"gzip stream of {len(body)} bytes (528 MB inflated): {outcome}, {inflated} bytes relayed; "
        f"peak RSS {before} MB before it, {peak} MB after"
    )


async def crowd() -> list[str]:
    async def serve(reader, writer):
        while await read_request(reader):
            await asyncio.sleep(random.random() * 0.05)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
            await writer.drain()

    server, url = await serving(serve)
    pool = http1.Pool(limit=512)
    head = http1.Head(url, {})

    async def one():
        response = await pool.post(head, PAYLOAD, 10)
        try:
            return await response.read()
        finally:
            response.release()

    out = []
    try:
        for round_ in range(3):
            tasks = [asyncio.ensure_future(one()) for _ in range(600)]
            await asyncio.sleep(0.02)
            for task in random.sample(tasks, 100):
                task.cancel()
            started = time.perf_counter()
            results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
            answered = sum(isinstance(r, bytes) for r in results)
            cancelled = sum(isinstance(r, asyncio.CancelledError) for r in results)
            out.append(
                f"600 on a pool of 512, 100 cancelled, round {round_}: answered {answered}, cancelled {cancelled}, "
                f"other {600 - answered - cancelled}, in use after {pool._in_use}, {time.perf_counter() - started:.1f} s"
            )
    finally:
        await pool.close()
        server.close()
    return out


async def main() -> None:
    for megabytes in (8, 32):
        print(await long_line(megabytes, capped=False), flush=True)
    print(await long_line(32, capped=True), flush=True)
    print(await bomb(), flush=True)
    for line in await crowd():
        print(line, flush=True)


if __name__ == "__main__":
    uvloop.run(main())
