"""Proxy overhead: latency, throughput and CPU per request, direct to a loopback upstream vs through selfroute.

    .venv/bin/python tests/benchmarks/bench_proxy.py [--requests 3000] [--concurrency 32]

The upstream answers instantly (a raw ASGI app under uvicorn, own process). The gateway runs in its
own process with one worker, pass-through policy model pointing at the upstream. CPU per request is the
gateway process's user+system time over the run divided by the requests it served.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

COMPLETION = json.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": "bench",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10},
}).encode()
CHUNKS = [
    json.dumps({"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "bench",
                "choices": [{"index": 0, "delta": {"content": w}, "finish_reason": None}]}).encode()
    for w in ("The ", "answer ", "is ", "ok", ".")
] + [json.dumps({"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "bench", "choices": [],
                 "usage": {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14}}).encode()]


async def instant_upstream(scope, receive, send):
    """A minimal OpenAI-compatible upstream: no framework, so it costs the measurement little."""
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if b'"stream": true' in body or b'"stream":true' in body:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for chunk in CHUNKS:
            await send({"type": "http.response.body", "body": b"data: " + chunk + b"\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
    else:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": COMPLETION})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_upstream(port: int) -> None:
    import uvicorn

    uvicorn.run(instant_upstream, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def run_gateway(port: int, upstream_port: int, data_dir: str, ledger_url: str | None = None) -> None:
    """A gateway process whose pass-through models go to the upstream (bench_replicas: on a shared ledger_url)."""
    import uvicorn

    os.environ["OPENAI_API_BASE"] = f"http://127.0.0.1:{upstream_port}/v1"
    os.environ["OPENAI_API_KEY"] = "bench"
    from gateway.server.app import create_app
    from gateway.settings import Settings
    from policies.loader import parse_policy

    policy = parse_policy(f"""
name: bench
cheap: {{model: openai/bench-cheap, api_base: "http://127.0.0.1:{upstream_port}/v1"}}
long: {{model: openai/bench-long, api_base: "http://127.0.0.1:{upstream_port}/v1"}}
routing: {{classifier: null}}
passthrough: {{allow: ["*"]}}
""")
    app = create_app(Settings(data_dir=Path(data_dir), ledger_url=ledger_url), policy=policy)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def wait_ready(url: str) -> None:
    import aiohttp

    deadline = time.monotonic() + 60
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.post(url, data=b'{"model":"x","messages":[{"role":"user","content":"hi"}]}',
                                        headers={"content-type": "application/json"}) as r:
                    await r.read()
                    return
            except aiohttp.ClientError:
                await asyncio.sleep(0.05)
    raise TimeoutError(url)


async def load(url: str, requests: int, concurrency: int, stream: bool) -> tuple[list[float], float]:
    import aiohttp

    payload = {"model": "gpt-bench", "messages": [{"role": "user", "content": "Say ok."}]}
    if stream:
        payload["stream"] = True
    body = json.dumps(payload).encode()
    latencies: list[float] = []
    counter = iter(range(requests))

    async def worker(session):
        for _ in counter:
            started = time.perf_counter()
            async with session.post(url, data=body, headers={"content-type": "application/json"}) as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError(f"status {response.status}")
            latencies.append((time.perf_counter() - started) * 1000)

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return latencies, elapsed


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def measure(label: str, url: str, pid: int | None, requests: int, concurrency: int, stream: bool) -> dict:
    asyncio.run(load(url, min(200, requests), concurrency, stream))  # warm-up
    cpu_before = cpu_seconds(pid) if pid else 0.0
    latencies, elapsed = asyncio.run(load(url, requests, concurrency, stream))
    cpu = (cpu_seconds(pid) - cpu_before) if pid else None
    # latency at concurrency 1 shows the added time per request without queueing
    serial, _ = asyncio.run(load(url, min(500, requests), 1, stream))
    row = {
        "path": label, "stream": stream, "requests": requests, "concurrency": concurrency,
        "req_per_s": requests / elapsed,
        "serial_p50_ms": statistics.median(serial), "serial_p99_ms": percentile(serial, 99),
        "loaded_p50_ms": statistics.median(latencies), "loaded_p99_ms": percentile(latencies, 99),
        "gateway_cpu_ms_per_req": None if cpu is None else cpu / requests * 1000,
    }
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    ctx = multiprocessing.get_context("spawn")
    upstream_port, gateway_port = free_port(), free_port()
    data_dir = tempfile.mkdtemp(prefix="selfroute-bench-")
    upstream = ctx.Process(target=run_upstream, args=(upstream_port,), daemon=True)
    gateway = ctx.Process(target=run_gateway, args=(gateway_port, upstream_port, data_dir), daemon=True)
    upstream.start()
    gateway.start()
    try:
        direct_url = f"http://127.0.0.1:{upstream_port}/v1/chat/completions"
        gateway_url = f"http://127.0.0.1:{gateway_port}/v1/chat/completions"
        asyncio.run(wait_ready(direct_url))
        asyncio.run(wait_ready(gateway_url))
        rows = []
        for stream in (False, True):
            rows.append(measure("direct", direct_url, None, args.requests, args.concurrency, stream))
            rows.append(measure("gateway", gateway_url, gateway.pid, args.requests, args.concurrency, stream))
        for stream in (False, True):
            direct, through = [r for r in rows if r["stream"] == stream]
            through["added_serial_p50_ms"] = through["serial_p50_ms"] - direct["serial_p50_ms"]
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            header = f"{'path':8} {'stream':6} {'req/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'loaded p50':>10} {'loaded p99':>10} {'CPU ms/req':>10} {'added p50':>9}"
            print(header)
            for r in rows:
                cpu = f"{r['gateway_cpu_ms_per_req']:.2f}" if r["gateway_cpu_ms_per_req"] is not None else "-"
                added = f"{r['added_serial_p50_ms']:.2f}" if "added_serial_p50_ms" in r else "-"
                print(f"{r['path']:8} {str(r['stream']):6} {r['req_per_s']:8.0f} {r['serial_p50_ms']:7.2f} "
                      f"{r['serial_p99_ms']:7.2f} {r['loaded_p50_ms']:10.2f} {r['loaded_p99_ms']:10.2f} {cpu:>10} {added:>9}")
    finally:
        gateway.terminate()
        upstream.terminate()
        gateway.join(10)
        upstream.join(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
