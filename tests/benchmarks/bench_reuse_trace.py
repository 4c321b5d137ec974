"""CPU that telling a pooled aiohttp connection from a new one adds per call (fix9): aiohttp POST + read over its
own TCPConnector, over the direct upstream's _ReuseTellingConnector (what the https path uses), and with aiohttp's
TraceConfig signal on_connection_reuseconn (the documented way, not taken).

    PYTHONPATH=TREE .venv/bin/python tests/benchmarks/bench_reuse_trace.py [--requests 6000] [--rounds 3]

The upstream is a raw asyncio server in a child process answering a fixed chat completion over plain http (telling
a reused connection does not depend on TLS, and TLS would add its own CPU to every arm). One keep-alive connection
per arm, sequential calls; the client process's CPU (time.process_time) per call, the arms rotated in blocks within
one process, a few rounds. Prints `uptime` too: figures under load are only comparable within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import subprocess
import time
import types

import aiohttp

from gateway.upstreams.direct import _ReuseTellingConnector
from tests.support.keepalive import COMPLETION

ANSWER = (
    f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(COMPLETION)}\r\n\r\n".encode()
    + COMPLETION
)
BODY = b'{"model": "m", "messages": [{"role": "user", "content": "x"}]}'
ARMS = ("aiohttp", "told", "traced")


def upstream(port_out) -> None:
    async def serve(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-l"))
                await reader.readexactly(length)
                writer.write(ANSWER)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def listen():
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port_out.send(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    asyncio.run(listen())


async def _on_reuse(session, context, params) -> None:
    context.trace_request_ctx.reused = True


def _session(arm: str) -> aiohttp.ClientSession:
    if arm == "told":
        return aiohttp.ClientSession(connector=_ReuseTellingConnector(limit=512))
    if arm == "traced":
        trace = aiohttp.TraceConfig()
        trace.on_connection_reuseconn.append(_on_reuse)
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=512), trace_configs=[trace])
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=512))


async def rotated(url: str, requests: int, block: int) -> dict[str, float]:
    """CPU microseconds per POST + read for each arm: one session each in one process, blocks of `block` calls
    in rotating order, so the machine's load drifts alike over all."""
    headers = {"content-type": "application/json"}
    sessions = {arm: _session(arm) for arm in ARMS}

    async def run(arm: str, n: int) -> float:
        session = sessions[arm]
        started = time.process_time()
        for _ in range(n):
            extra = {"trace_request_ctx": types.SimpleNamespace(reused=False)} if arm == "traced" else {}
            async with session.post(url, data=BODY, headers=headers, **extra) as response:
                await response.read()
        return time.process_time() - started

    for arm in ARMS:  # warm: the connection, the caches
        await run(arm, 200)
    spent = dict.fromkeys(ARMS, 0.0)
    for index in range(requests // block):
        for arm in ARMS[index % 3 :] + ARMS[: index % 3]:
            spent[arm] += await run(arm, block)
    for session in sessions.values():
        await session.close()
    done = (requests // block) * block
    return {arm: spent[arm] / done * 1e6 for arm in ARMS}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=6000, help="per arm and round")
    parser.add_argument("--block", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    receive, send = multiprocessing.Pipe(duplex=False)
    child = multiprocessing.Process(target=upstream, args=(send,), daemon=True)
    child.start()
    url = f"http://127.0.0.1:{receive.recv()}/v1/chat/completions"
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    added: dict[str, list[float]] = {"told": [], "traced": []}
    for number in range(args.rounds):
        figures = asyncio.run(rotated(url, args.requests, args.block))
        for arm in added:
            added[arm].append(figures[arm] - figures["aiohttp"])
        print(f"round {number}: " + ", ".join(f"{arm} {figures[arm]:.1f}" for arm in ARMS) + " us CPU per call")
    for arm, differences in added.items():
        listed = ", ".join(f"{d:+.1f}" for d in differences)
        print(f"{arm} - aiohttp: {listed} us; median {statistics.median(differences):+.1f} us per call")
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    child.terminate()


if __name__ == "__main__":
    main()
