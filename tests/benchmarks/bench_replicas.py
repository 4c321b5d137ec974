"""Replicas: throughput of one vs two gateway processes, on a SQLite ledger vs a shared PostgreSQL; pass-through
and routed.

    .venv/bin/python tests/benchmarks/bench_replicas.py [--requests 3000] [--concurrency 32] \
        [--routed-requests 400] [--routed-concurrency 8] [--stores local s3] [--skip passthrough|routed]

An instant upstream (bench_proxy's raw ASGI app, own process); 1 or 2 gateway processes (one uvicorn worker each)
on one ledger: the data directory's SQLite file (two processes share it through WAL) or a throwaway PostgreSQL
(tests/support/engines.py). The load goes round-robin over the replicas from one asyncio client. After each run the
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

from bench_proxy import cpu_seconds, free_port, percentile, run_gateway, run_upstream, wait_ready  # noqa: E402

from tests.support.policies import bench_policy, rule  # noqa: E402
from tests.support.servers import ServeProcess  # noqa: E402

SHARED_DOCS = ROOT.parent / "shared" / "data" / "corpus_structured_docs"
DEFAULT_DOCS = [SHARED_DOCS / "gnu-standards" / "standards.txt", SHARED_DOCS / "gnu-standards" / "maintain.txt"]
COLLECTION = "bench"
TOPICS = [
    "command-line options",
    "the --help option",
    "the --version option",
    "error messages",
    "makefile targets",
    "installation directories",
    "DESTDIR",
    "change logs",
    "the NEWS file",
    "portability between Unix systems",
    "memory allocation",
    "signal handling",
    "formatting C source code",
    "comments in code",
    "file names",
    "internationalization",
    "documentation in Texinfo",
    "man pages",
    "releases and tarballs",
    "copyright notices",
    "legal papers from contributors",
    "recording contributors",
    "mailing lists",
    "reporting bugs",
    "web pages of a package",
    "ftp uploads",
    "non-free software references",
    "standard targets for users",
    "configuration with configure",
    "library behaviour",
]


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
    procs = [
        ctx.Process(target=run_gateway, args=(port, upstream_port, data_dir, ledger_url), daemon=True) for port in ports
    ]
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
    return {
        "engine": engine,
        "replicas": replicas,
        "req_per_s": args.requests / elapsed,
        "p50_ms": statistics.median(latencies),
        "p99_ms": percentile(latencies, 99),
        "ledger_rows": rows,
        "expected_rows": expected,
    }


# ------------------------------------------------------------------------------------------------ routed


def routed_bodies(n: int, tag: str) -> list[bytes]:
    """n different questions about the collection; every fourth asks for a summary (long by the policy's rule)."""
    bodies = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        question = (
            f"Summarize what the standards say about {topic} ({tag} {i})."
            if i % 4 == 3
            else f"What do the standards require about {topic}? ({tag} {i})"
        )
        bodies.append(
            json.dumps(
                {
                    "model": "selfroute",
                    "messages": [{"role": "user", "content": question}],
                    "selfroute": {"collection": COLLECTION},
                }
            ).encode()
        )
    return bodies


async def load_bodies(urls: list[str], bodies: list[bytes], concurrency: int) -> tuple[list[float], float]:
    import aiohttp

    latencies: list[float] = []
    pending = iter(bodies)
    targets = cycle(urls)

    async def worker(session):
        for data in pending:
            started = time.perf_counter()
            async with session.post(next(targets), data=data, headers={"content-type": "application/json"}) as r:
                text = await r.text()
                if r.status != 200:
                    raise RuntimeError(f"status {r.status}: {text[:300]}")
            latencies.append((time.perf_counter() - started) * 1000)

    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        started = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        return latencies, time.perf_counter() - started


def cli_env(extra: dict[str, str]) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "HF_HUB_OFFLINE": "1",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "OPENAI_API_KEY": "bench",
        **extra,
    }


def replica(policy: Path, data_dir: Path, ledger_url: str | None, store_uri: str, env: dict[str, str]) -> ServeProcess:
    """`selfroute serve` in a subprocess (one worker), its ledger and store given by flags, its log beside its
    data directory (replicas may share one)."""
    port = free_port()
    flags = ["--policy", str(policy), "--data-dir", str(data_dir), "--store-uri", store_uri, "--log-level", "WARNING"]
    if ledger_url:
        flags += ["--ledger-url", ledger_url]
    return ServeProcess(*flags, env=dict(env), log=data_dir.parent / f"{data_dir.name}-{port}.log", port=port)


class MotoS3:
    """moto's S3-compatible server in its own process (so it does not share the client's interpreter)."""

    def __init__(self):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.env = {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }
        import boto3
        import botocore.exceptions

        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                client.create_bucket(Bucket="selfroute-bench")
                break
            except botocore.exceptions.EndpointConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        self.uri = "s3://selfroute-bench/collections"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)


def ingest(store_uri: str, docs: list[Path], env: dict[str, str], data_dir: Path) -> float:
    started = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "ingest",
            COLLECTION,
            *map(str, docs),
            "--store-uri",
            store_uri,
            "--data-dir",
            str(data_dir),
            "--no-progress",
            "--log-level",
            "WARNING",
        ],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - started


def ledger_routes(location) -> dict[str, int]:
    from gateway.ledger import reports

    conn = reports.connect_reader(location)
    try:
        return {route: n for route, n in conn.execute("SELECT route, count(*) FROM requests GROUP BY route").fetchall()}
    finally:
        conn.close()


def run_routed(
    store: str,
    store_uri: str,
    env: dict[str, str],
    engine: str,
    replicas: int,
    args,
    policy: Path,
    server,
    moto: MotoS3 | None,
) -> dict:
    root = Path(tempfile.mkdtemp(prefix="selfroute-replicas-routed-"))
    ledger_url = server.create_database() if engine == "postgresql" else None
    # SQLite: the replicas share the data directory's ledger file (WAL); PostgreSQL: each has its own directory
    dirs = [root / ("shared" if engine == "sqlite" else f"replica-{i}") for i in range(replicas)]
    procs = [replica(policy, d, ledger_url, store_uri, env) for d in dirs]
    urls = [f"{p.url}/v1/chat/completions" for p in procs]
    try:
        for proc in procs:
            proc.wait_ready(timeout=300)
        warm = 4 * args.routed_concurrency
        asyncio.run(
            load_bodies(urls, routed_bodies(warm, f"warm {store} {engine} {replicas}"), args.routed_concurrency)
        )
        load_before = os.getloadavg()[0]
        # CPU the replicas (and the S3 server) spend per request: where the time goes on a shared machine
        pids = [p.process.pid for p in procs] + ([moto.process.pid] if moto is not None else [])
        cpu_before = [cpu_seconds(pid) for pid in pids]
        latencies, elapsed = asyncio.run(
            load_bodies(
                urls, routed_bodies(args.routed_requests, f"run {store} {engine} {replicas}"), args.routed_concurrency
            )
        )
        load_after = os.getloadavg()[0]
        cpu = [(cpu_seconds(pid) - before) * 1000 / args.routed_requests for pid, before in zip(pids, cpu_before)]
        expected = warm + args.routed_requests
        location = ledger_url or dirs[0] / "ledger.sqlite3"
        deadline = time.monotonic() + 60
        while (rows := ledger_rows(location)) < expected and time.monotonic() < deadline:
            time.sleep(0.2)
        routes = ledger_routes(location)
    finally:
        for proc in procs:
            proc.stop(timeout=60)
        shutil.rmtree(root, ignore_errors=True)
    return {
        "store": store,
        "engine": engine,
        "replicas": replicas,
        "req_per_s": args.routed_requests / elapsed,
        "p50_ms": statistics.median(latencies),
        "p99_ms": percentile(latencies, 99),
        "ledger_rows": rows,
        "expected_rows": expected,
        "routes": routes,
        "load": (load_before, load_after),
        "gateway_cpu_ms": sum(cpu[:replicas]),
        "s3_cpu_ms": cpu[replicas] if moto is not None else None,
    }


def bench_routed(args, server, upstream_port: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="selfroute-replicas-store-"))
    policy = bench_policy(
        work / "policy.yaml",
        upstream_port,
        args.long_window,
        name="bench-replicas-routed",
        routing={
            "rules": [rule("summaries", "cue_summary", ">=", 1, "long")],
            "classifier": {"model_path": "builtin:default", "threshold": 0.4428886833129369},
        },
    )
    from pipelines.tokens import count_tokens

    tokens = sum(count_tokens(p.read_text(errors="replace")) for p in args.docs)
    print(
        f"\nrouted: {args.routed_requests} requests at concurrency {args.routed_concurrency} about a collection of "
        f"{len(args.docs)} documents ({tokens:,} tokens); long window {args.long_window:,}"
    )
    print(
        f"{'store':6} {'ledger':10} {'replicas':>8} {'req/s':>7} {'p50 ms':>8} {'p99 ms':>8} {'ledger rows':>12}"
        f"  {'routes':24} {'CPU ms/req: gateways':>20} {'S3':>5}  load1 before/after"
    )
    moto = None
    try:
        for store in args.stores:
            if store == "s3":
                moto = MotoS3()
                store_uri, env = moto.uri, cli_env(moto.env)
            else:
                store_uri, env = str(work / "lancedb"), cli_env({})
            seconds = ingest(store_uri, args.docs, env, work / "ingest")
            print(f"({store}: collection ingested once in {seconds:.1f} s)", flush=True)
            for engine in ("sqlite", "postgresql"):
                for replicas in (1, 2):
                    r = run_routed(store, store_uri, env, engine, replicas, args, policy, server, moto)
                    s3_cpu = "-" if r["s3_cpu_ms"] is None else f"{r['s3_cpu_ms']:.1f}"
                    mix = " ".join(f"{k}={v}" for k, v in sorted(r["routes"].items(), key=lambda kv: str(kv[0])))
                    print(
                        f"{r['store']:6} {r['engine']:10} {r['replicas']:8d} {r['req_per_s']:7.1f} {r['p50_ms']:8.1f}"
                        f" {r['p99_ms']:8.1f} {r['ledger_rows']:>5}/{r['expected_rows']:<6}  {mix:24}"
                        f" {r['gateway_cpu_ms']:20.1f} {s3_cpu:>5}  {r['load'][0]:.1f}/{r['load'][1]:.1f}",
                        flush=True,
                    )
            if moto is not None:
                moto.stop()
                moto = None
    finally:
        if moto is not None:
            moto.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--routed-requests", type=int, default=400)
    parser.add_argument("--routed-concurrency", type=int, default=8)
    parser.add_argument(
        "--long-window",
        type=int,
        default=16_000,
        help="the long model's window: smaller than the collection, so the long route chooses units",
    )
    parser.add_argument("--docs", nargs="+", type=Path, default=DEFAULT_DOCS, help="the collection's documents")
    parser.add_argument("--stores", nargs="+", choices=["local", "s3"], default=["local", "s3"])
    parser.add_argument("--skip", choices=["passthrough", "routed"], default=None)
    args = parser.parse_args()
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from tests.support.engines import start_postgres

    server = start_postgres()
    ctx = multiprocessing.get_context("spawn")
    upstream_port = free_port()
    upstream = ctx.Process(target=run_upstream, args=(upstream_port,), daemon=True)
    upstream.start()
    print(f"{os.cpu_count()} CPUs; load average at start {os.getloadavg()[0]:.1f}")
    try:
        asyncio.run(wait_ready(f"http://127.0.0.1:{upstream_port}/v1/chat/completions"))
        if args.skip != "passthrough":
            print(f"{args.requests} pass-through requests at concurrency {args.concurrency}")
            print(f"{'ledger':10} {'replicas':>8} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'ledger rows':>14}")
            for engine in ("sqlite", "postgresql"):
                for replicas in (1, 2):
                    r = run(engine, replicas, args, ctx, upstream_port, server)
                    print(
                        f"{r['engine']:10} {r['replicas']:8d} {r['req_per_s']:8.0f} {r['p50_ms']:8.1f}"
                        f" {r['p99_ms']:8.1f} {r['ledger_rows']:>6}/{r['expected_rows']:<7}",
                        flush=True,
                    )
        if args.skip != "routed":
            bench_routed(args, server, upstream_port)
    finally:
        upstream.terminate()
        upstream.join(10)
        server.stop()
        shutil.rmtree(server.root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
