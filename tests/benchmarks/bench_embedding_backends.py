"""Embedding backends (rag.embedding_backend) compared: chunks/s and the cheap route's retrieval recall@k.

    .venv/bin/python tests/benchmarks/bench_embedding_backends.py \\
        --squad ../shared/data/squad2_dev_subset/dev-v2.0.first2articles.json [--k 1 3 8] [--questions 300] \\
        [--backends onnx torch onnx-int8 openvino] [--rounds 2]

Each backend ingests the same documents (SQuAD 2.0 paragraphs, one document each) into its own LanceDB
collection with DocumentStore.ingest (chunking, embedding, writes, index), the bare embedder.embed of the
same chunk texts is timed beside it (its vectors compared with the first backend's: the smallest cosine), then
every answerable question is searched (store.search: hybrid vector + full text, the cheap route's retrieval) and recall@k counts the questions whose top k chunks hold
one of the gold answers (case-insensitive substring). Also: query embedding p50 (one question, one thread).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pipelines.documents import Document
from pipelines.embedding import BACKENDS, Embedder
from pipelines.settings import RagSettings
from pipelines.store import DocumentStore


def load_squad(path: str) -> tuple[list[Document], list[tuple[str, list[str]]]]:
    data = json.loads(Path(path).read_text())["data"]
    docs, questions = [], []
    for a, article in enumerate(data):
        for p, paragraph in enumerate(article["paragraphs"]):
            docs.append(Document(id=f"a{a}p{p}", text=paragraph["context"], title=article["title"]))
            for qa in paragraph["qas"]:
                answers = [x["text"].lower() for x in qa.get("answers", [])]
                if answers and not qa.get("is_impossible"):
                    questions.append((qa["question"], answers))
    return docs, questions


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--squad", required=True)
    parser.add_argument("--k", type=int, nargs="+", default=[1, 3, 8])
    parser.add_argument("--questions", type=int, default=300)
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS))
    parser.add_argument("--cache-dir", help="where ONNX exports are kept (default: the shared model cache)")
    parser.add_argument(
        "--rounds", type=int, default=1, help="measure every backend this many times, alternating (a loaded machine)"
    )
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    docs, questions = load_squad(args.squad)
    questions = questions[: args.questions]
    work = Path(tempfile.mkdtemp(prefix="selfroute-embed-bench-"))
    print(
        f"load average {Path('/proc/loadavg').read_text().split()[:3]}, {len(docs)} documents, "
        f"{len(questions)} answerable questions, cores {len(os.sched_getaffinity(0))}"
    )
    print(
        f"{'backend':10} {'chunks':>6} {'encode c/s':>10} {'ingest c/s':>10} {'ingest/encode':>13} {'query p50 ms':>12} "
        + " ".join(f"{'recall@' + str(k):>9}" for k in args.k)
        + f" {'min cos to ' + args.backends[0]:>18}"
    )
    reference: dict[str, object] = {}  # chunk text -> the first backend's vector
    for round_, backend in enumerate(args.backends * args.rounds):
        embedder = Embedder(backend=backend, cache_dir=args.cache_dir)
        store = DocumentStore(str(work / f"lancedb-{backend}-{round_}"), embedder, RagSettings())
        # loads (and for onnx, exports once) outside the timings, and runs one full batch of real chunk-sized texts:
        # a session's first batches of a new size are slower (23 s, 19 s, 17 s for the same 101 chunks at load 9-12),
        # which charged ingestion, timed first, for the warm-up
        embedder.embed([d.text for d in docs[:64]])
        started = time.perf_counter()
        report = store.ingest("squad", docs)
        ingest_s = time.perf_counter() - started
        texts = [chunk.text for chunk, _ in store.chunks("squad")]
        started = time.perf_counter()
        vectors = embedder.embed(texts)
        encode_s = time.perf_counter() - started
        if not reference:
            reference = dict(zip(texts, vectors, strict=True))
        cosine = min(float(v @ reference[t]) for t, v in zip(texts, vectors, strict=True) if t in reference)
        latencies = []
        for i in range(40):
            started = time.perf_counter()
            embedder.embed_queries([f"{questions[i % len(questions)][0]} {i}"])
            latencies.append((time.perf_counter() - started) * 1000)
        hits = {k: 0 for k in args.k}
        for question, answers in questions:
            found = [h.chunk.text.lower() for h in store.search("squad", question, k=max(args.k))]
            for k in args.k:
                hits[k] += any(a in text for text in found[:k] for a in answers)
        n = report.chunks_written or len(texts)
        print(
            f"{backend:10} {n:6d} {len(texts) / encode_s:10.1f} {n / ingest_s:10.1f} {ingest_s / (encode_s * n / len(texts)):13.2f} "
            f"{statistics.median(latencies):12.1f} "
            + " ".join(f"{hits[k] / len(questions):9.3f}" for k in args.k)
            + f" {cosine:18.5f}  load {Path('/proc/loadavg').read_text().split()[0]}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
