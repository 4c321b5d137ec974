"""Embedding backends (rag.embedding_backend) compared: chunks/s and the cheap route's retrieval recall@k.

    .venv/bin/python tests/benchmarks/bench_embedding_backends.py \\
        --squad ../shared/data/squad2_dev_subset/dev-v2.0.first2articles.json [--k 1 3 8] [--questions 300] \\
        [--backends onnx torch onnx-int8 openvino] [--rounds 2] \\
        [--hotpot ../shared/data/hotpotqa_dev_sample100/camera_ready_nd8_dev_sample100.json]

Each backend ingests the same documents (SQuAD 2.0 paragraphs, one document each) into its own LanceDB
collection with DocumentStore.ingest (chunking, embedding, writes, index), the bare embedder.embed of the
same chunk texts is timed beside it (its vectors compared with the first backend's: the smallest cosine), then
every answerable question is searched (store.search: hybrid vector + full text, the cheap route's retrieval) and recall@k counts the questions whose top k chunks hold
one of the gold answers (case-insensitive substring). Also: query embedding p50 (one question, one thread).
With --hotpot, every paragraph of the HotpotQA questions (two gold and eight distractors each, one document per
titled paragraph) goes into one more collection (not timed) and hotpot@k is the share of the questions' gold
paragraphs among their top k chunks (multi-hop: both are needed).
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


def load_hotpot(path: str) -> tuple[list[Document], list[tuple[str, set[str]]]]:
    docs: dict[str, Document] = {}
    questions = []
    for n, item in enumerate(json.loads(Path(path).read_text())):
        pairs = [(item["title_a"], item["para_a"]), (item["title_b"], item["para_b"])]
        for title, sentences in pairs + [(d[0], d[1]) for d in item["distractors"]]:
            docs.setdefault(title, Document(id=f"p{len(docs)}", text="".join(sentences).strip(), title=title))
        questions.append((item["question"], {docs[item["title_a"]].id, docs[item["title_b"]].id}))
    return list(docs.values()), questions


def recall(store, questions, hotpot_questions, ks, embedder, hotpot_docs=()) -> tuple[dict, dict]:
    """SQuAD hits@k (a gold answer in the top k chunks) and HotpotQA gold paragraphs found in the top k, the questions
    embedded by `embedder` (the store's own, or another backend's: a store in another space)."""
    hits = {k: 0 for k in ks}
    for question, answers in questions:
        vector = embedder.embed_query(question)
        found = [h.chunk.text.lower() for h in store.search("squad", question, k=max(ks), query_vector=vector)]
        for k in ks:
            hits[k] += any(a in text for text in found[:k] for a in answers)
    hotpot = {k: 0 for k in ks}
    if hotpot_docs:
        store.ingest("hotpot", hotpot_docs)
    for question, gold in hotpot_questions:
        vector = embedder.embed_query(question)
        found = [h.chunk.doc_id for h in store.search("hotpot", question, k=max(ks), query_vector=vector)]
        for k in ks:
            hotpot[k] += len(gold & set(found[:k]))
    return hits, hotpot


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--squad", required=True)
    parser.add_argument("--hotpot", help="HotpotQA questions with their gold and distractor paragraphs (JSON list)")
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
        + ("".join(f" {'hotpot@' + str(k):>9}" for k in args.k) if args.hotpot else "")
    )
    hotpot_docs, hotpot_questions = load_hotpot(args.hotpot) if args.hotpot else ([], [])
    reference: dict[str, object] = {}  # chunk text -> the first backend's vector
    stores: dict[str, DocumentStore] = {}
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
        hits, hotpot = recall(store, questions, hotpot_questions if hotpot_docs else [], args.k, embedder, hotpot_docs)
        stores[backend] = store
        n = report.chunks_written or len(texts)
        print(
            f"{backend:10} {n:6d} {len(texts) / encode_s:10.1f} {n / ingest_s:10.1f} {ingest_s / (encode_s * n / len(texts)):13.2f} "
            f"{statistics.median(latencies):12.1f} "
            + " ".join(f"{hits[k] / len(questions):9.3f}" for k in args.k)
            + f" {cosine:18.5f}"
            + "".join(f" {hotpot[k] / (2 * len(hotpot_questions)):9.3f}" for k in args.k if hotpot_docs)
            + f"  load {Path('/proc/loadavg').read_text().split()[0]}",
            flush=True,
        )
    if "onnx" in stores and "onnx-int8" in stores:
        # a named collection ingested with fp32 vectors, asked with int8 questions: what a store written before the
        # default became onnx-int8 answers until `selfroute ingest` embeds it again (attached documents re-embed)
        hits, hotpot = recall(
            stores["onnx"], questions, hotpot_questions if hotpot_docs else [], args.k, stores["onnx-int8"].embedder
        )
        print(
            f"{'onnx store, onnx-int8 questions':>53} {'':>12} "
            + " ".join(f"{hits[k] / len(questions):9.3f}" for k in args.k)
            + f" {'':18}"
            + "".join(f" {hotpot[k] / (2 * len(hotpot_questions)):9.3f}" for k in args.k if hotpot_docs)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
