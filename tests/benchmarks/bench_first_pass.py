"""Retrieval quality of the first pass over new attached documents (pipelines.store.pending) against the full hybrid
retrieval over the same documents once embedded.

    HF_HUB_OFFLINE=1 PYTHONPATH=$PWD .venv/bin/python tests/benchmarks/bench_first_pass.py \\
        --squad ../shared/data/squad2_dev_subset/dev-v2.0.first2articles.json \\
        [--distractor ../shared/data/corpus_structured_docs/debian-policy/policy.txt] [--candidates 0 24 48 96]

The attached documents are SQuAD 2.0's paragraphs (one document each), with --distractor a long document besides
them (Debian Policy: ~800 more chunks, so the set is a ~130k-token attachment); the questions are the first
--questions answerable ones. recall@k: one of the question's top k hits (RagPipeline's hits, the cheap route's
ranking) holds one of its gold answers (case-insensitive substring), as in bench_embedding_backends.py.

"full" is RagPipeline.retrieve over the ingested inline collection (LanceDB vector + full-text search, RRF); each
"first pass, N candidates" row answers every question as a first question: nothing embedded but that question's
own best N by BM25 (and the hits found by text alone, at most top_k more), as the first request on new documents
gets it.
The candidates' vectors are taken from the ingested collection (the same model's vectors), so the figure is about
ranking, not speed; the seconds a first pass takes are bench_routed.py's.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench_embedding_backends import load_squad  # noqa: E402

from pipelines.documents import Document  # noqa: E402
from pipelines.embedding import Embedder  # noqa: E402
from pipelines.rag import RagPipeline  # noqa: E402
from pipelines.scope import SHARED  # noqa: E402
from pipelines.settings import RagSettings  # noqa: E402
from pipelines.store import DocumentStore  # noqa: E402
from pipelines.store.pending import PendingInline  # noqa: E402


class Precomputed(PendingInline):
    """A first pass whose candidates' vectors come from the ingested collection instead of the model, and which
    starts no background ingestion: each question sees only its own candidates embedded."""

    def __init__(self, *args, vectors: dict[tuple[str, int], np.ndarray], **kwargs):
        super().__init__(*args, **kwargs)
        self.table = [vectors[(c.doc_id, c.position)] for c in self.chunks]
        self.embedded_for_last: set[int] = set()  # what the question being answered had embedded

    def _embedded(self, candidates: list[int]) -> dict[int, np.ndarray]:
        self.embedded_for_last.update(candidates)
        return {i: self.table[i] for i in self.embedded_for_last}

    def start(self) -> None:
        pass


def recall(hits_per_question: list[list[str]], questions, ks) -> list[float]:
    return [
        sum(
            any(a in text for text in hits[:k] for a in answers)
            for hits, (_, answers) in zip(hits_per_question, questions)
        )
        / len(questions)
        for k in ks
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--squad", required=True)
    parser.add_argument("--distractor", type=Path)
    parser.add_argument("--questions", type=int, default=300)
    parser.add_argument("--candidates", type=int, nargs="+", default=[8, 16, 24, 48])
    parser.add_argument("--k", type=int, nargs="+", default=[1, 3, 8])
    parser.add_argument("--work", type=Path, help="where the LanceDB store goes (default: a temporary directory)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    docs, questions = load_squad(args.squad)
    questions = questions[: args.questions]
    if args.distractor:
        docs.append(Document("distractor", args.distractor.read_text(), title=args.distractor.stem))
    work = args.work or Path(tempfile.mkdtemp(prefix="selfroute-first-pass-"))
    settings = RagSettings()
    embedder = Embedder()
    store = DocumentStore(str(work / "lancedb"), embedder, settings)
    print(f"load average before: {Path('/proc/loadavg').read_text().split()[:3]}", flush=True)
    started = time.perf_counter()
    name = store.inline_collection(docs)  # the full index, embedded before answering
    stored = store.chunks(name)
    print(
        f"{len(docs)} documents, {len(stored)} chunks (embedded in {time.perf_counter() - started:.0f} s), "
        f"{len(questions)} answerable questions",
        flush=True,
    )
    vectors = {(c.doc_id, c.position): v for c, v in stored}
    rag = RagPipeline(store)
    print(f"{'retrieval':32} " + " ".join(f"{'recall@' + str(k):>9}" for k in args.k) + f" {'chunks embedded':>16}")
    full = [[h.chunk.text.lower() for h in rag.retrieve(name, q).hits] for q, _ in questions]
    figures = " ".join(f"{r:9.3f}" for r in recall(full, questions, args.k))
    print(f"{'full (hybrid, all chunks)':32} {figures} {len(stored):16d}", flush=True)
    for n in args.candidates:
        first_settings = settings.model_copy(update={"first_pass_candidates": n})
        first_store = DocumentStore(str(work / "lancedb"), embedder, first_settings)
        pending = Precomputed(first_store.inline, name, docs, SHARED, vectors=vectors)
        per_question = []
        embedded = []
        for q, _ in questions:
            pending.embedded_for_last = set()
            hits = RagPipeline(first_store).retrieve(name, q, pending=pending).hits
            per_question.append([h.chunk.text.lower() for h in hits])
            embedded.append(len(pending.embedded_for_last))
        figures = " ".join(f"{r:9.3f}" for r in recall(per_question, questions, args.k))
        label = f"first pass, {n} candidates"
        print(f"{label:32} {figures} {np.mean(embedded):16.1f}", flush=True)
    print(f"load average after: {Path('/proc/loadavg').read_text().split()[:3]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
