"""The onnx-family backends' document embedding with and without the word-piece budget per run (RUN_TOKENS), in one
process, alternated: "before" pads a whole batch of 64 chunks to its longest (the round-five behaviour), "after" is the
shipped budget. torch is measured beside them as the reference.

    HF_HUB_OFFLINE=1 PYTHONPATH=$PWD nice -n 10 .venv/bin/python tests/benchmarks/bench_onnx_runs.py \\
        --squad ../shared/data/squad2_dev_subset/dev-v2.0.first2articles.json [--backends torch onnx onnx-int8 openvino]

Texts: the SQuAD file's paragraphs (83 for the first two articles, ~150 word pieces on average). Each cell prints
chunks per second of wall time and per second of this process's CPU time (user + system, all its threads): on a
loaded machine the CPU figure is the steadier one (wall time counts the other processes' turns).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pipelines.embedding as embedding
from pipelines.embedding import Embedder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--squad", required=True)
    parser.add_argument("--backends", nargs="+", default=["torch", "onnx", "onnx-int8", "openvino"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="threads per backend (default: every core)")
    parser.add_argument("--cache-dir", help="where ONNX exports are kept (default: the shared model cache)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    data = json.loads(Path(args.squad).read_text())["data"]
    texts = [p["context"] for a in data for p in a["paragraphs"]]
    shipped = embedding.RUN_TOKENS
    embedders = {b: Embedder(backend=b, cache_dir=args.cache_dir, threads=args.threads) for b in args.backends}
    for e in embedders.values():
        e.load()
        e.embed(texts[:64])  # warm: a session's first runs of new sizes are slower
    print(f"load average {Path('/proc/loadavg').read_text().split()[:3]}, {len(texts)} texts")
    print(f"{'backend':10} {'runs':>18} {'wall c/s':>9} {'CPU c/s':>8}  load")
    for _ in range(args.rounds):
        for backend, e in embedders.items():
            cells = (
                [("-", shipped)] if backend == "torch" else [("before: 64 padded", 10**9), ("after: budget", shipped)]
            )
            for name, budget in cells:
                if backend != "torch":
                    e._documents.run_tokens = budget  # type: ignore[union-attr]
                cpu, wall = time.process_time(), time.perf_counter()
                e.embed(texts)
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                print(
                    f"{backend:10} {name:>18} {len(texts) / wall:9.1f} {len(texts) / cpu:8.1f}  "
                    f"{Path('/proc/loadavg').read_text().split()[0]}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
