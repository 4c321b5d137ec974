"""Ingestion throughput and retrieval latency of pipelines.store (not collected by pytest).

1. Throughput: the same chunks are embedded twice, once by a bare SentenceTransformer.encode (the floor)
   and once by DocumentStore.ingest (chunking, embedding, LanceDB writes, index refresh); the ratio is
   the pipeline's overhead.
2. Latency: a collection of at least --docs documents is ingested, then hybrid search (store.search)
   and full RAG retrieval (search + neighbour expansion + budgeted selection) are timed per query.

Documents: CUAD contracts (--cuad folder of .txt) cut into parts of about --part-tokens tokens at
sentence boundaries (the first --parts-per-contract parts of each), plus whole files from --extra
folders (e.g. Debian policy and licence texts), until --docs documents.

    .venv/bin/python tests/benchmarks/bench_ingest.py --cuad ../shared/data/cuad/CUAD_v1/full_contract_txt \\
        --extra ../shared/data/corpus_structured_docs --docs 1000
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pipelines.chunking import chunk_document, pack_spans  # noqa: E402
from pipelines.documents import Document  # noqa: E402
from pipelines.embedding import Embedder  # noqa: E402
from pipelines.ingest import load_documents  # noqa: E402
from pipelines.rag import RagPipeline  # noqa: E402
from pipelines.settings import RagSettings  # noqa: E402
from pipelines.store import DocumentStore  # noqa: E402

QUERIES = [
    "What law governs this agreement?",
    "How many days notice is required to terminate the agreement?",
    "Can the agreement be assigned without consent?",
    "Is there a non-compete clause and how long does it last?",
    "What are the payment terms and when are invoices due?",
    "Who owns the intellectual property created under the agreement?",
    "What is the limitation of liability cap?",
    "Does the licensee receive an exclusive license?",
    "What are the confidentiality obligations after termination?",
    "Which party pays for insurance and what coverage is required?",
    "When does the initial term expire and does it renew automatically?",
    "What happens if either party becomes insolvent?",
    "Are there minimum purchase commitments?",
    "How are disputes resolved, by arbitration or in court?",
    "What warranties does the supplier give?",
    "May the licensee sublicense the software?",
    "What audit rights does the company have?",
    "Is there a most favored nation clause?",
    "What does the GPL say about distributing modified versions?",
    "What are the requirements for a package maintainer script?",
]


def contract_parts(folder: Path, part_tokens: int, parts_per_contract: int) -> list[Document]:
    docs = []
    for path in sorted(folder.glob("*.txt")):
        text = path.read_text(encoding="utf-8", errors="replace")
        for i, (a, b) in enumerate(pack_spans(text, 0, len(text), part_tokens)[:parts_per_contract]):
            docs.append(Document(f"{path.stem}#part{i + 1}", text[a:b], title=path.stem, source=str(path)))
    return docs


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cuad", type=Path, required=True, help="folder of CUAD contract .txt files")
    parser.add_argument("--extra", type=Path, nargs="*", default=[], help="more folders/files, ingested whole")
    parser.add_argument("--docs", type=int, default=1000, help="documents in the latency collection")
    parser.add_argument("--part-tokens", type=int, default=300)
    parser.add_argument("--parts-per-contract", type=int, default=2)
    parser.add_argument("--throughput-docs", type=int, default=60, help="documents in the throughput comparison")
    parser.add_argument("--queries", type=int, default=100, help="timed queries (the query list is cycled)")
    parser.add_argument("--db", type=Path, default=None, help="LanceDB directory (default: a temporary one)")
    args = parser.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"

    settings = RagSettings()
    extra = list(load_documents(args.extra)) if args.extra else []
    docs = (extra + contract_parts(args.cuad, args.part_tokens, args.parts_per_contract))[: args.docs]
    if len(docs) < args.docs:
        sys.exit(f"only {len(docs)} documents available; raise --parts-per-contract")
    print(f"corpus: {len(docs)} documents ({len(extra)} whole files from --extra, the rest CUAD contract parts)")

    embedder = Embedder(batch_size=settings.embedding_batch_size)
    embedder.embed(["warm up"])
    db_dir = args.db or Path(tempfile.mkdtemp(prefix="bench_ingest_"))
    store = DocumentStore(str(db_dir), embedder, settings)

    # -- 1. throughput: bare encode vs the ingestion pipeline, on the same chunks ------------------
    sample = docs[len(extra) : len(extra) + args.throughput_docs]
    t0 = time.perf_counter()
    chunks = [c for d in sample for c in chunk_document(d, settings.chunking)]
    chunking_s = time.perf_counter() - t0
    texts = [c.text for c in chunks]
    t0 = time.perf_counter()
    if embedder.backend == "torch":
        embedder.model.encode(texts, batch_size=settings.embedding_batch_size, normalize_embeddings=True)
    else:  # the onnxruntime session's own encode (pipelines.embedding._OnnxModel)
        embedder.model.encode(texts, settings.embedding_batch_size)
    encode_s = time.perf_counter() - t0
    report = store.ingest("throughput", sample)
    assert report.chunks_written == len(chunks)
    raw_rate, pipe_rate = len(chunks) / encode_s, len(chunks) / report.seconds
    print(f"throughput sample: {len(sample)} documents, {len(chunks)} chunks (chunking alone {chunking_s:.2f}s)")
    print(f"  bare encode ({embedder.backend}):  {encode_s:.1f}s = {raw_rate:.1f} chunks/s")
    print(f"  DocumentStore.ingest:       {report.seconds:.1f}s = {pipe_rate:.1f} chunks/s")
    print(f"  pipeline overhead: ingest takes {report.seconds / encode_s:.2f}x the bare encode time")
    t0 = time.perf_counter()
    again = store.ingest("throughput", sample)
    print(
        f"  re-ingest unchanged: {time.perf_counter() - t0:.2f}s, {len(again.unchanged)} unchanged, "
        f"{again.chunks_written} chunks written"
    )

    # -- 2. latency on the large collection --------------------------------------------------------
    t0 = time.perf_counter()
    big = store.ingest("bench", docs)
    print(
        f"latency collection: {len(docs)} documents, {big.chunks_written} chunks, ingested in "
        f"{time.perf_counter() - t0:.1f}s ({big.chunks_written / big.seconds:.1f} chunks/s)"
    )
    rag = RagPipeline(store, settings)
    for q in QUERIES[:3]:  # warm caches and indexes
        rag.retrieve("bench", q)
    queries = [QUERIES[i % len(QUERIES)] for i in range(args.queries)]
    search_ms, retrieve_ms, embed_ms = [], [], []
    for q in queries:
        t0 = time.perf_counter()
        embedder.embed([q])
        embed_ms.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        store.search("bench", q, settings.top_k)
        search_ms.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        rag.retrieve("bench", q)
        retrieve_ms.append((time.perf_counter() - t0) * 1000)
    for name, values in [
        ("query embedding", embed_ms),
        ("store.search (hybrid, top_k=8)", search_ms),
        ("RagPipeline.retrieve (search+expand+select)", retrieve_ms),
    ]:
        print(
            f"  {name}: p50 {percentile(values, 50):.1f} ms, p99 {percentile(values, 99):.1f} ms, "
            f"mean {statistics.mean(values):.1f} ms over {len(values)} queries"
        )
    sample_hit = store.search("bench", QUERIES[0], 3)
    for h in sample_hit:
        print(
            f"  sample hit for {QUERIES[0]!r}: {h.chunk.doc_id} [{h.chunk.section}] cos={h.vector_score:.3f} "
            f"{h.chunk.text[:100]!r}"
        )
    print(f"db: {db_dir}")


if __name__ == "__main__":
    main()
