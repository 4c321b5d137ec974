"""The onnx-family backends' document embedding with and without the word-piece budget per run (RUN_TOKENS), in one
process, alternated: "before" pads a whole batch of 64 chunks to its longest (the round-five behaviour), "after" is the
shipped budget. torch is measured beside them as the reference. For onnx-int8 a third cell: the budget's runs batched
as for fp32 (its shipped form before round eight) against one text per run (shipped since), with the smallest cosine
between the two cells' vectors of the same texts (dynamic int8 quantises each run with one scale: batched, a text's
vector depends on the texts beside it).

    HF_HUB_OFFLINE=1 PYTHONPATH=$PWD nice -n 10 .venv/bin/python tests/benchmarks/bench_onnx_runs.py \\
        --squad ../shared/data/squad2_dev_subset/dev-v2.0.first2articles.json [--backends torch onnx onnx-int8 openvino] \\
        [--doc ../shared/data/lara128k/docs/128k_book_the_blue_castle.txt --chunks 160]

Texts: the SQuAD file's paragraphs (83 for the first two articles, ~150 word pieces on average), or with --doc the
first --chunks chunks of a document at the default chunking (200 tokens: 160-200 word pieces, lengths alike). Each cell prints
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
    parser.add_argument("--doc", help="embed this document's chunks instead of the SQuAD paragraphs")
    parser.add_argument("--chunks", type=int, default=160)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="threads per backend (default: every core)")
    parser.add_argument("--cache-dir", help="where ONNX exports are kept (default: the shared model cache)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    data = json.loads(Path(args.squad).read_text())["data"]
    texts = [p["context"] for a in data for p in a["paragraphs"]]
    if args.doc:
        from pipelines.chunking import chunk_document
        from pipelines.documents import Document
        from pipelines.settings import ChunkingSettings

        document = Document(id="doc", text=Path(args.doc).read_text(encoding="utf-8"))
        texts = [c.text for c in chunk_document(document, ChunkingSettings())][: args.chunks]
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
                [("-", shipped, False)]
                if backend == "torch"
                else [("before: 64 padded", 10**9, False), ("after: budget", shipped, False)]
                + ([("one text per run", shipped, True)] if backend == "onnx-int8" else [])
            )
            vectors = {}
            for name, budget, one_text in cells:
                if backend != "torch":
                    e._documents.run_tokens = budget  # type: ignore[union-attr]
                    e._documents.one_text_runs = one_text  # type: ignore[union-attr]
                cpu, wall = time.process_time(), time.perf_counter()
                vectors[name] = e.embed(texts)
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                apart = (
                    f"  min cosine to the batched budget's {(vectors[name] * vectors['after: budget']).sum(1).min():.5f}"
                    if one_text
                    else ""
                )
                print(
                    f"{backend:10} {name:>18} {len(texts) / wall:9.1f} {len(texts) / cpu:8.1f}  "
                    f"{Path('/proc/loadavg').read_text().split()[0]}{apart}",
                    flush=True,
                )
            if backend != "torch":
                e._documents.one_text_runs = backend == "onnx-int8"  # type: ignore[union-attr]
    return 0


if __name__ == "__main__":
    sys.exit(main())
