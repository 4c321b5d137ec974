"""Pass-through 502s from kept-alive upstream connections the upstream closed (round seven; fixed in 67589aa).

    PYTHONPATH=TREE .venv/bin/python tests/benchmarks/bench_stale_connection.py [--cycles 10] [--stream]

bench_proxy's set-up (its instant uvicorn upstream, keep-alive timeout 5 s; its gateway with serve's protocol):
bursts of 32 concurrent requests; a few ms into each, the gateway's process is stopped for 5.5 s (as a machine at
load 28 starved it for 4.8 s in rollup7's run), so the upstream's keep-alive timer closes the pooled connections
that requests in flight have just taken. Prints the non-200 answers and the ledger's status and error for them.
The load generator opens a connection per request, so only the gateway's pool meets a closed connection.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import signal
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import bench_proxy  # noqa: E402 - the same upstream and gateway as the pass-through benchmark


async def burst(session, url: str, body: bytes, n: int = 32) -> list[int]:
    async def one() -> int:
        async with session.post(url, data=body, headers={"content-type": "application/json"}) as response:
            await response.read()
            return response.status

    return await asyncio.gather(*(one() for _ in range(n)))


async def stall(pid: int, after: float) -> None:
    await asyncio.sleep(after)
    os.kill(pid, signal.SIGSTOP)
    await asyncio.sleep(5.5)  # past the upstream's 5 s keep-alive timeout
    os.kill(pid, signal.SIGCONT)


async def run(url: str, cycles: int, stream: bool, pid: int) -> int:
    import aiohttp

    payload = {"model": "gpt-bench", "messages": [{"role": "user", "content": "Say ok."}], "stream": stream}
    body = json.dumps(payload).encode()
    bad = 0
    rng = random.Random(7)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=32, force_close=True)) as session:
        await burst(session, url, body)
        for cycle in range(cycles):
            await asyncio.sleep(0.5)
            statuses, _ = await asyncio.gather(burst(session, url, body), stall(pid, rng.uniform(0.002, 0.06)))
            failed = sum(status != 200 for status in statuses)
            bad += failed
            if failed:
                print(f"cycle {cycle}: {failed} of {len(statuses)} not 200: {sorted(set(statuses))}", flush=True)
    return bad


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument("--stream", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    ctx = multiprocessing.get_context("spawn")
    upstream_port, gateway_port = bench_proxy.free_port(), bench_proxy.free_port()
    data_dir = tempfile.mkdtemp(prefix="selfroute-stale-")
    upstream = ctx.Process(target=bench_proxy.run_upstream, args=(upstream_port,), daemon=True)
    gateway = ctx.Process(target=bench_proxy.run_gateway, args=(gateway_port, upstream_port, data_dir), daemon=True)
    upstream.start()
    gateway.start()
    url = f"http://127.0.0.1:{gateway_port}/v1/chat/completions"
    try:
        asyncio.run(bench_proxy.wait_ready(url))
        bench_proxy.wait_readiness(f"http://127.0.0.1:{gateway_port}/health/readiness")
        print(f"uptime: {Path('/proc/loadavg').read_text().split()[:3]}", flush=True)
        bad = asyncio.run(run(url, args.cycles, args.stream, gateway.pid))
        time.sleep(1)
    finally:
        gateway.terminate()
        gateway.join(10)
        upstream.terminate()
        upstream.join(10)
    conn = sqlite3.connect(Path(data_dir) / "ledger.sqlite3")
    total = conn.execute("SELECT count(*) FROM requests").fetchone()[0]
    errors = conn.execute("SELECT status, error, count(*) FROM requests WHERE status != 200 GROUP BY 1, 2").fetchall()
    print(
        f"{'stream' if args.stream else 'plain'}, {args.cycles} cycles: {bad} of {total} requests not 200; "
        f"ledger: {errors or 'all 200'}; uptime: {Path('/proc/loadavg').read_text().split()[:3]}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
