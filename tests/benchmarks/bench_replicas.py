"""Replicas: throughput of one vs two gateway processes, on a SQLite ledger vs a shared PostgreSQL; pass-through
and routed.

    .venv/bin/python tests/benchmarks/bench_replicas.py [--requests 3000] [--concurrency 32] \
        [--routed-requests 400] [--routed-concurrency 8] [--stores local s3] [--skip passthrough|routed]

An instant upstream (bench_proxy's raw ASGI app, own process); 1 or 2 gateway processes (one uvicorn worker each)
on one ledger: the data directory's SQLite file (two processes share it through WAL) or a throwaway PostgreSQL
(tests/engines.py). The load goes round-robin over the replicas from one asyncio client. After each run the
ledger must hold exactly one row per request. Prints requests/s and latency; on a machine with few cores the
client, upstream and replicas compete for them, so a second replica adds throughput only as far as cores allow.

Pass-through: a bare model name, straight to the upstream (in-process apps under uvicorn).

Routed: real `selfroute serve` processes answering the routed alias about a collection (--docs, default the GNU
coding and maintainer standards from ../shared/data, ~95k tokens) ingested once with `selfroute ingest` into a store
every replica opens: a local LanceDB directory, or a bucket on moto's S3 server (own process, plain HTTP, the AWS_*
variables). The policy routes summary questions to the long route (window --long-window, smaller than the
collection: units are chosen by relevance) and the others by the shipped classifier after a retrieval pass; every
question is different, so each one is embedded (on the replica's CPU). The route mix is read from the ledger.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from itertools import cycle
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from bench_proxy import free_port, percentile, run_upstream, wait_ready  # noqa: E402

SHARED_DOCS = ROOT.parent / "shared" / "data" / "corpus_structured_docs"
DEFAULT_DOCS = [SHARED_DOCS / "gnu-standards" / "standards.txt", SHARED_DOCS / "gnu-standards" / "maintain.txt"]
COLLECTION = "bench"
ROUTED_POLICY = """
name: bench-replicas-routed
aliases: [selfroute]
cheap: {{model: openai/bench-cheap, api_base: "http://127.0.0.1:{port}/v1", context_window: 8192,
         input_cost_per_mtok: 0.15, output_cost_per_mtok: 0.6}}
long: {{model: openai/bench-long, api_base: "http://127.0.0.1:{port}/v1", context_window: {window},
        input_cost_per_mtok: 2.0, output_cost_per_mtok: 8.0}}
routing:
  rules: [{{name: summaries, feature: cue_summary, op: ">=", value: 1, route: long}}]
  classifier: {{model_path: "builtin:default", threshold: 0.4428886833129369}}
  default_route: long
"""
TOPICS = ["command-line options", "the --help option", "the --version option", "error messages", "makefile targets",
          "installation directories", "DESTDIR", "change logs", "the NEWS file", "portability between Unix systems",
          "memory allocation", "signal handling", "formatting C source code", "comments in code", "file names",
          "internationalization", "documentation in Texinfo", "man pages", "releases and tarballs",
          "copyright notices", "legal papers from contributors", "recording contributors", "mailing lists",
          "reporting bugs", "web pages of a package", "ftp uploads", "non-free software references",
          "standard targets for users", "configuration with configure", "library behaviour"]


def run_gateway(port: int, upstream_port: int, data_dir: str, ledger_url: str | None) -> None:
    import uvicorn

    os.environ["OPENAI_API_BASE"] = f"http://127.0.0.1:{upstream_port}/v1"  # pass-through models
    os.environ["OPENAI_API_KEY"] = "bench"
    from gateway.server.app import create_app
    from gateway.settings import Settings
    from policies.loader import parse_policy

    policy = parse_policy(f"""
name: bench
cheap: {{model: openai/bench-cheap, api_base: "http://127.0.0.1:{upstream_port}/v1"}}
long: {{model: openai/bench-long, api_base: "http://127.0.0.1:{upstream_port}/v1"}}
routing: {{classifier: null}}
""")
    app = create_app(Settings(data_dir=Path(data_dir), ledger_url=ledger_url), policy=policy)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


async def load(urls: list[str], requests: int, concurrency: int) -> tuple[list[float], float]:
    import aiohttp

    body = json.dumps({"model": "gpt-bench", "messages": [{"role": "user", "content": "Say ok."}]}).encode()
    latencies: list[float] = []
    counter = iter(range(requests))
    targets = cycle(urls)

    async def worker(session):
        for _ in counter:
            started = time.perf_counter()
            async with session.post(next(targets), data=body, headers={"content-type": "application/json"}) as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(f"status {r.status}")
            latencies.append((time.perf_counter() - started) * 1000)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        started = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        return latencies, time.perf_counter() - started


def ledger_rows(location) -> int:
    from gateway.ledger import reports

    conn = reports.connect_reader(location)
    try:
        return conn.execute("SELECT count(*) FROM requests").fetchone()[0]
    finally:
        conn.close()


def run(engine: str, replicas: int, args, ctx, upstream_port: int, server) -> dict:
    data_dir = tempfile.mkdtemp(prefix="selfroute-replicas-")
    ledger_url = server.create_database() if engine == "postgresql" else None
    ports = [free_port() for _ in range(replicas)]
    procs = [ctx.Process(target=run_gateway, args=(port, upstream_port, data_dir, ledger_url), daemon=True)
             for port in ports]
    for proc in procs:
        proc.start()
    urls = [f"http://127.0.0.1:{port}/v1/chat/completions" for port in ports]
    try:
        for url in urls:
            asyncio.run(wait_ready(url))
        asyncio.run(load(urls, 200, args.concurrency))  # warm-up
        latencies, elapsed = asyncio.run(load(urls, args.requests, args.concurrency))
        expected = len(urls) + 200 + args.requests  # wait_ready's request, the warm-up, the run
        location = ledger_url or Path(data_dir) / "ledger.sqlite3"
        deadline = time.monotonic() + 60
        while (rows := ledger_rows(location)) < expected and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.join(10)
        shutil.rmtree(data_dir, ignore_errors=True)
    return {"engine": engine, "replicas": replicas, "req_per_s": args.requests / elapsed,
            "p50_ms": statistics.median(latencies), "p99_ms": percentile(latencies, 99),
            "ledger_rows": rows, "expected_rows": expected}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from tests.engines import start_postgres

    server = start_postgres()
    ctx = multiprocessing.get_context("spawn")
    upstream_port = free_port()
    upstream = ctx.Process(target=run_upstream, args=(upstream_port,), daemon=True)
    upstream.start()
    print(f"{os.cpu_count()} CPUs; {args.requests} pass-through requests at concurrency {args.concurrency}")
    print(f"{'ledger':10} {'replicas':>8} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'ledger rows':>14}")
    try:
        asyncio.run(wait_ready(f"http://127.0.0.1:{upstream_port}/v1/chat/completions"))
        for engine in ("sqlite", "postgresql"):
            for replicas in (1, 2):
                r = run(engine, replicas, args, ctx, upstream_port, server)
                print(f"{r['engine']:10} {r['replicas']:8d} {r['req_per_s']:8.0f} {r['p50_ms']:8.1f} {r['p99_ms']:8.1f}"
                      f" {r['ledger_rows']:>6}/{r['expected_rows']:<7}", flush=True)
    finally:
        upstream.terminate()
        upstream.join(10)
        server.stop()
        shutil.rmtree(server.root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
