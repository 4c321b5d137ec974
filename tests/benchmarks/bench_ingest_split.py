"""Where DocumentStore.ingest's time goes beside the bare embedder.embed of the same chunks, alternated in one process
(ingest then encode, encode then ingest), wall and CPU seconds (this process, all threads) per step.

    HF_HUB_OFFLINE=1 PYTHONPATH=$PWD nice -n 10 .venv/bin/python tests/benchmarks/bench_ingest_split.py \\
        --squad ../shared/data/squad2_dev_subset/dev-v2.0.first2articles.json [--backend onnx] [--rounds 4]
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_embedding_backends import load_squad

import pipelines.store.document_store as ds
from pipelines.embedding import Embedder
from pipelines.settings import RagSettings
from pipelines.store import DocumentStore

STEPS: dict[str, list[float]] = {}


def timed(owner, name: str) -> None:
    method = getattr(owner, name)

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return method(*args, **kwargs)
        finally:
            spent = STEPS.setdefault(name, [0.0, 0.0])
            spent[0] += time.perf_counter() - wall
            spent[1] += time.process_time() - cpu

    setattr(owner, name, wrapper)


def clock(run) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--squad", required=True)
    parser.add_argument("--backend", default="onnx")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--cache-dir", help="where ONNX exports are kept (default: the shared model cache)")
    args = parser.parse_args()
    docs, _ = load_squad(args.squad)
    embedder = Embedder(backend=args.backend, cache_dir=args.cache_dir)
    embedder.embed([d.text for d in docs[:64]])  # load and warm
    for name in ("_embed_chunks", "_write", "_refresh_indexes"):
        timed(ds.DocumentStore, name)
    timed(ds, "prepare_document")
    texts = [d.text for d in docs]
    print(f"{args.backend}: {len(docs)} documents; wall / CPU seconds")
    for round_ in range(args.rounds):
        STEPS.clear()
        store = DocumentStore(tempfile.mkdtemp(prefix="selfroute-split-"), embedder, RagSettings())
        encode_first = round_ % 2 == 1
        if encode_first:
            encode = clock(lambda: embedder.embed(texts))
        ingest = clock(lambda: store.ingest("squad", docs))
        texts = [chunk.text for chunk, _ in store.chunks("squad")]
        if not encode_first:
            encode = clock(lambda: embedder.embed(texts))
        steps = " ".join(f"{n.strip('_')} {w:.2f}/{c:.2f}" for n, (w, c) in STEPS.items())
        print(
            f"{'encode, ingest' if encode_first else 'ingest, encode'}: ingest {ingest[0]:.2f}/{ingest[1]:.2f} "
            f"encode {encode[0]:.2f}/{encode[1]:.2f} ratio {ingest[0] / encode[0]:.2f}/{ingest[1] / encode[1]:.2f} "
            f"({steps}) load {Path('/proc/loadavg').read_text().split()[0]}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
