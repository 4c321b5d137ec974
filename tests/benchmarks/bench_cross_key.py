"""Small requests beside routed requests that carry a long attached document (probe10's head-of-line finding).

    .venv/bin/python tests/benchmarks/bench_cross_key.py \\
        --doc ../shared/data/corpus_structured_docs/debian-policy/policy.txt [--heavy 60] [--concurrency 30]

A real `selfroute serve` subprocess and an instant upstream (bench_routed's). The document is attached and
embedded first (until answered from its full index). Then it prints the p50/p99 of small requests (a routed
question with no document, forced to the long route: a small body) sent one after another, alone and while
--concurrency clients send --heavy rag requests that attach the document (every reservation of those counts its
tokens), and the heavy requests' own p50/p99. Before 6b3d402 those counts ran on the ledger's writer thread, which
every request's reservation waits on.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench_routed import (  # noqa: E402
    body,
    post,
    questions,
    rag_setup,
    start_gateway,
    summary,
    timed_posts,
    until_full,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--doc", required=True, type=Path)
    parser.add_argument("--heavy", type=int, default=60, help="rag requests that attach the document")
    parser.add_argument("--concurrency", type=int, default=30)
    parser.add_argument("--light", type=int, default=20, help="small requests, one after another")
    args = parser.parse_args()
    text = args.doc.read_text()
    work = Path(tempfile.mkdtemp(prefix="selfroute-bench-cross-key-"))
    upstream, policy = rag_setup(work, 128_000, "bench-cross-key")
    print(
        f"document: {args.doc} ({len(text.encode()):,} bytes); upstream instant on loopback; load {os.getloadavg()[0]:.1f}"
    )
    gateway = start_gateway(policy, work / "data")
    chat = f"{gateway.url}/v1/chat/completions"
    try:
        until_full(chat, text, time.perf_counter(), pause_s=1.0)
        light = [body(q, None, "long") for q in questions(args.light, "light")]
        alone, _ = post(chat, light)
        print(f"small requests alone:                 {summary(alone)}")
        heavy = [body(q, text, "rag") for q in questions(args.heavy, "heavy")]
        result: dict = {}

        def load() -> None:
            result["heavy"] = asyncio.run(timed_posts([chat], heavy, args.concurrency))

        thread = threading.Thread(target=load, daemon=True)
        thread.start()
        time.sleep(1.0)  # the heavy requests are being admitted
        beside, _ = post(chat, [body(q, None, "long") for q in questions(args.light, "beside")])
        thread.join()
        latencies, elapsed = result["heavy"]
        print(f"small requests beside the heavy ones: {summary(beside)}")
        print(
            f"heavy requests ({args.heavy} at concurrency {args.concurrency}): {summary(latencies)}   "
            f"{len(latencies) / elapsed:.1f} req/s   load {os.getloadavg()[0]:.1f}"
        )
    finally:
        gateway.stop(timeout=60)
        upstream.terminate()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
