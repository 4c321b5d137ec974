"""Routed-path speed on a long attached document, with an instant upstream on loopback.

    .venv/bin/python tests/benchmarks/bench_routed.py \\
        --doc ../shared/data/corpus_structured_docs/debian-policy/policy.txt [--requests 40] [--workers 2]

The upstream answers instantly (a raw ASGI app, own process); the gateway is a real `selfroute serve`
subprocess. With an instant upstream, a request's latency is the gateway's time. It prints:

- first request with the new document (answered from the first pass over its chunks: pipelines.store.pending),
  then questions one after another until the answers come from the full index (the background ingestion done:
  the provenance's retrieval_index is "full"), and bare `encode` of the same chunks in this process, one after the
  other (the ratio is what ingestion adds to the embedding itself);
- p50/p99 of routed requests on the now cached document, forced to `rag`, then to `long` (the long
  model's window is smaller than the document, so units are chosen by relevance), then `explain`;
  every request asks a different question (a repeated question's vector is remembered);
- rag p50/p99 while another client posts a ~1 MB document to a collection (ingest under way);
- routed throughput at concurrency 8 (rag route), with 1 worker and with --workers (SQLite ledger), and with one
  and two replicas on one PostgreSQL ledger (--throughput ... 1-replica-pg 2-replicas-pg).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench_proxy import free_port, run_upstream  # noqa: E402

from tests.support.policies import bench_policy  # noqa: E402
from tests.support.servers import ServeProcess  # noqa: E402

BENCH_ENV = {"HF_HUB_OFFLINE": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True", "OPENAI_API_KEY": "bench"}

TOPICS = [
    "maintainer scripts",
    "package priorities",
    "the menu system",
    "shared libraries",
    "configuration files",
    "virtual packages",
    "the changelog",
    "copyright files",
    "init scripts",
    "file permissions",
    "users and groups",
    "documentation",
    "manual pages",
    "the build process",
    "source packages",
    "binary packages",
    "dependencies",
    "conflicts",
    "essential packages",
    "the archive areas",
]


def questions(n: int, tag: str) -> list[str]:
    return [f"What does the policy say about {TOPICS[i % len(TOPICS)]} ({tag} {i})?" for i in range(n)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def summary(values: list[float]) -> str:
    return f"p50 {statistics.median(values):8.1f} ms   p99 {percentile(values, 99):8.1f} ms   (n={len(values)})"


def start_gateway(policy: Path, data_dir: Path, workers: int = 1) -> ServeProcess:
    """`selfroute serve` in a subprocess, once ready (each worker's readiness probe: many in a row); its output
    in data_dir's parent (serve-N.log)."""
    flags = ["--workers", str(workers)] if workers > 1 else []
    log = data_dir.parent / f"serve-{workers}.log"
    served = ServeProcess(
        "--policy", str(policy), "--data-dir", str(data_dir), "--log-level", "WARNING", *flags, env=BENCH_ENV, log=log
    )
    return served.wait_ready(timeout=300, in_a_row=20)


def body(question: str, doc_text: str | None, route: str | None, collection: str | None = None) -> bytes:
    options: dict = {}
    if doc_text is not None:
        options["documents"] = [{"id": "doc", "text": doc_text, "title": "document"}]
    if collection:
        options["collection"] = collection
    if route:
        options["route"] = route
    return json.dumps(
        {"model": "selfroute", "messages": [{"role": "user", "content": question}], "selfroute": options}
    ).encode()


async def timed_posts(urls: list[str], bodies: list[bytes], concurrency: int = 1) -> tuple[list[float], float]:
    """(latencies in ms, elapsed s) of POSTing `bodies` at `concurrency`; request i goes to urls[i % len(urls)]
    (several gateways: round-robin)."""
    import aiohttp

    latencies: list[float] = []
    pending = iter(enumerate(bodies))

    async def worker(session):
        for i, data in pending:
            started = time.perf_counter()
            async with session.post(urls[i % len(urls)], data=data, headers={"content-type": "application/json"}) as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(f"status {r.status}: {(await r.text())[:300]}")
            latencies.append((time.perf_counter() - started) * 1000)

    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        started = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        return latencies, time.perf_counter() - started


def routed(url: str, data: bytes) -> tuple[float, str | None]:
    """(latency ms, the retrieval_index its provenance records) of one routed request."""
    import httpx

    started = time.perf_counter()
    response = httpx.post(url, content=data, headers={"content-type": "application/json"}, timeout=3600)
    latency = (time.perf_counter() - started) * 1000
    if response.status_code != 200:
        raise RuntimeError(f"status {response.status_code}: {response.text[:300]}")
    return latency, response.json()["selfroute"]["provenance"].get("retrieval_index")


def until_full(
    url: str, doc_text: str, started: float, pause_s: float = 5.0, limit_s: float = 3600
) -> tuple[list[float], float]:
    """Questions one after another, `pause_s` apart (a user reading the answers), until one is answered from the
    full index: (the latencies of those answered from the first pass, seconds from `started` to the first full
    answer)."""
    partial: list[float] = []
    for i in range(100_000):
        latency, index = routed(url, body(f"{questions(i + 1, 'first pass')[-1]}", doc_text, "rag"))
        if index == "full":
            return partial, time.perf_counter() - started
        partial.append(latency)
        if time.perf_counter() - started > limit_s:
            break
        time.sleep(pause_s)
    raise RuntimeError("the document was never answered from its full index")


def post(url: str, bodies: list[bytes], concurrency: int = 1) -> tuple[list[float], float]:
    return asyncio.run(timed_posts([url], bodies, concurrency))


def bare_encode_seconds(text: str) -> tuple[float, int]:
    from pipelines.chunking import chunk_document
    from pipelines.documents import Document
    from pipelines.embedding import Embedder
    from pipelines.settings import RagSettings

    settings = RagSettings()
    chunks = chunk_document(Document("doc", text, title="document"), settings.chunking)
    embedder = Embedder()
    embedder.embed(["warm-up"])
    started = time.perf_counter()
    if embedder.backend != "torch":  # the onnxruntime session's own encode (pipelines.embedding._OnnxModel)
        embedder.model.encode([c.text for c in chunks], settings.embedding_batch_size)
        return time.perf_counter() - started, len(chunks)
    embedder.model.encode(
        [c.text for c in chunks],
        batch_size=settings.embedding_batch_size,
        normalize_embeddings=True,
        show_progress_bar=False,
    )
    return time.perf_counter() - started, len(chunks)


def megabyte_document(min_bytes: int = 1_000_000) -> str:
    folder = Path(__file__).resolve().parents[3] / "shared" / "data" / "corpus_structured_docs"
    texts = [p.read_text(errors="replace") for p in sorted(folder.rglob("*.txt")) if p.name != "policy.txt"]
    parts, size = [], 0
    while size < min_bytes:  # the corpus is smaller than 1 MB: its texts again, numbered, until it is not
        text = f"Part {len(parts) + 1}\n\n{texts[len(parts) % len(texts)]}"
        parts.append(text)
        size += len(text.encode())
    return "\n\n".join(parts)


def rag_setup(work: Path, long_window: int, name: str):
    """(the instant upstream's process, started; the policy file) for routed benchmarks: rag by default, no
    classifier, no fallback."""
    import multiprocessing

    port = free_port()
    upstream = multiprocessing.get_context("spawn").Process(target=run_upstream, args=(port,), daemon=True)
    upstream.start()
    routing = {"classifier": None, "default_route": "rag", "fallback": {"enabled": False}}
    return upstream, bench_policy(work / "policy.yaml", port, long_window, name=name, routing=routing)


THROUGHPUT_SETUPS = ("1-worker", "2-workers", "1-replica-pg", "2-replicas-pg")


def throughput(setup: str, policy: Path, work: Path, text: str, args) -> dict:
    """Routed throughput (rag route, the attached document cached) of one set-up: one `serve` process with 1 or
    --workers workers on the data directory's SQLite ledger, or 1 or 2 replicas (`serve` processes, one worker
    each, their own data directories) on one PostgreSQL ledger and one store (--store-uri), the load round-robin
    over them. Each set-up first caches the document (a request per worker or replica, then 8 per worker), then
    sends --throughput-requests requests at concurrency 8; the ledger must then hold one row per request."""
    import os

    from bench_proxy import cpu_seconds
    from bench_replicas import ledger_rows

    root = work / setup
    root.mkdir()
    if setup.endswith("-pg"):
        from tests.support.engines import start_postgres

        replicas = int(setup[0])
        server = start_postgres()
        ledger_url = server.create_database()
        store = work / "data" / "lancedb"  # the store the first part of the run ingested into
        procs = []
        for i in range(replicas):
            flags = ["--policy", str(policy), "--data-dir", str(root / f"replica-{i}"), "--log-level", "WARNING"]
            flags += ["--ledger-url", ledger_url, "--store-uri", str(store)]
            procs.append(ServeProcess(*flags, env=BENCH_ENV, log=root / f"replica-{i}.log"))
        for proc in procs:
            proc.wait_ready(timeout=300, in_a_row=5)
        location: object = ledger_url
        n_serving = replicas
    else:
        server = None
        workers = 1 if setup == "1-worker" else args.workers
        # the ingested document, a fresh ledger
        shutil.copytree(work / "data", root / "data", ignore=shutil.ignore_patterns("ledger.sqlite3*"))
        procs = [start_gateway(policy, root / "data", workers=workers)]
        location = root / "data" / "ledger.sqlite3"
        n_serving = workers
    urls = [f"{proc.url}/v1/chat/completions" for proc in procs]
    try:
        warm = [body(q, text, "rag") for q in questions(8 * n_serving, f"warm {setup}")]
        asyncio.run(timed_posts(urls, warm, 8))
        load_before = os.getloadavg()[0]
        cpu_before = [cpu_seconds(proc.process.pid) for proc in procs]
        bodies = [body(q, text, "rag") for q in questions(args.throughput_requests, f"tp {setup}")]
        latencies, elapsed = asyncio.run(timed_posts(urls, bodies, 8))
        cpu_ms = sum(cpu_seconds(p.process.pid) - b for p, b in zip(procs, cpu_before)) * 1000 / len(bodies)
        load_after = os.getloadavg()[0]
        expected = len(warm) + len(bodies)
        deadline = time.monotonic() + 60
        while (rows := ledger_rows(location)) < expected and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        for proc in procs:
            proc.stop(timeout=60)
        if server is not None:
            server.stop()
            shutil.rmtree(server.root, ignore_errors=True)
    return {
        "setup": f"{args.workers}-workers" if setup == "2-workers" else setup,
        "req_per_s": len(bodies) / elapsed,
        "latencies": latencies,
        "cpu_ms": cpu_ms,
        "ledger": f"{rows}/{expected}",
        "load": (load_before, load_after),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--doc", required=True, type=Path)
    parser.add_argument("--requests", type=int, default=40, help="requests per latency figure")
    parser.add_argument(
        "--long-window",
        type=int,
        default=32_000,
        help="the long model's window: smaller than the document, so the long route chooses units",
    )
    parser.add_argument("--workers", type=int, default=2, help="workers for the second throughput figure")
    parser.add_argument("--throughput-requests", type=int, default=200)
    parser.add_argument(
        "--throughput",
        nargs="+",
        default=["1-worker", "2-workers"],
        choices=THROUGHPUT_SETUPS,
        help="throughput set-ups: one `serve` with 1 or --workers workers (SQLite ledger), or 1 or 2 replicas on one "
        "PostgreSQL ledger and one store (tests/support/engines.py starts PostgreSQL)",
    )
    parser.add_argument("--skip", nargs="*", default=[], choices=["ingest-compare", "during-ingest", "throughput"])
    args = parser.parse_args()
    text = args.doc.read_text()
    work = Path(tempfile.mkdtemp(prefix="selfroute-bench-routed-"))
    upstream, policy = rag_setup(work, args.long_window, "bench-routed")
    from pipelines.tokens import count_tokens

    print(
        f"document: {args.doc} ({len(text):,} characters, {count_tokens(text):,} tokens); "
        f"long window {args.long_window:,}; upstream instant on loopback"
    )
    gateway = start_gateway(policy, work / "data")
    chat = f"{gateway.url}/v1/chat/completions"
    explain = f"{gateway.url}/v1/route/explain"
    try:
        started = time.perf_counter()
        first, index = routed(chat, body("What is this document about?", text, "rag"))
        print(f"first request with the new document: {first / 1000:.1f} s (retrieval_index {index})")
        partial, full_after = until_full(chat, text, started)
        print(
            f"answered from the full index {full_after:.1f} s after the first request began; "
            f"the {len(partial)} questions before it (first pass): {summary(partial) if partial else '-'}"
        )
        if "ingest-compare" not in args.skip:
            seconds, n_chunks = bare_encode_seconds(text)
            print(
                f"bare encode of its {n_chunks} chunks in this process: {seconds:.1f} s "
                f"(time to the full index / bare encode = {full_after / seconds:.2f}x)"
            )
        n = args.requests
        rag, _ = post(chat, [body(q, text, "rag") for q in questions(n, "rag")])
        print(f"rag route, cached document:     {summary(rag)}")
        long, _ = post(chat, [body(q, text, "long") for q in questions(n, "long")])
        print(f"long route, cached document:    {summary(long)}")
        explained, _ = post(explain, [body(q, text, None) for q in questions(n, "explain")])
        print(f"explain, cached document:       {summary(explained)}")

        if "during-ingest" not in args.skip:
            big = megabyte_document()
            baseline, _ = post(chat, [body(q, text, "rag") for q in questions(n, "base")])
            done = threading.Event()
            ingest_seconds: list[float] = []

            def ingest() -> None:
                started = time.perf_counter()
                data = json.dumps({"documents": [{"id": "big", "text": big}]}).encode()
                import httpx

                response = httpx.post(
                    f"{gateway.url}/v1/collections/big/documents",
                    content=data,
                    headers={"content-type": "application/json"},
                    timeout=3600,
                )
                ingest_seconds.append(time.perf_counter() - started)
                if response.status_code != 200:
                    print("ingest failed:", response.status_code, response.text[:300])
                done.set()

            thread = threading.Thread(target=ingest, daemon=True)
            thread.start()
            time.sleep(2.0)  # the post is read and its embedding under way
            during: list[float] = []
            tag = 0
            while not done.is_set() and len(during) < 3 * n:
                batch, _ = post(chat, [body(q, text, "rag") for q in questions(5, f"during {tag}")])
                during += batch
                tag += 1
            if done.is_set():
                state = f"ingested over HTTP in {ingest_seconds[0]:.1f} s"
            else:  # enough requests measured; the gateway's shutdown cancels the rest of the ingestion
                state = "still being ingested when the measurement ended"
            print(f"1 MB document ({len(big.encode()):,} bytes) {state}; meanwhile:")
            print(f"  rag before the ingest:        {summary(baseline)}")
            print(
                f"  rag during the ingest:        {summary(during)}   "
                f"added p99 {percentile(during, 99) - percentile(baseline, 99):+.1f} ms"
            )
    finally:
        gateway.stop(timeout=60)

    if "throughput" not in args.skip:
        for setup in args.throughput:
            row = throughput(setup, policy, work, text, args)
            print(
                f"throughput, rag route, concurrency 8, {row['setup']:<24s} {row['req_per_s']:6.1f} req/s   "
                f"{summary(row['latencies'])}   gateway CPU {row['cpu_ms']:5.1f} ms/req   "
                f"ledger rows {row['ledger']}   load {row['load'][0]:.1f} -> {row['load'][1]:.1f}",
                flush=True,
            )
    upstream.terminate()
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
