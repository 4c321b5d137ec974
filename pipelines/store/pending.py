"""Attached documents whose inline collection is still being made: the first questions on them are answered from a
lexical first pass while the whole documents are embedded in the background.

Embedding a 100k-token document (~800 chunks) takes 30-60 s on two cores; a question needs a few of its chunks. So
the first request with new documents chunks them (about a second), ranks the chunks for its question by BM25
(pipelines.lexical), embeds only the best candidates and the question (on the question's model copy, which no
ingestion holds), and ranks those as the cheap route ranks hits (vector and text rankings fused by reciprocal rank:
pipelines.chunk_search.fuse_rankings). Its answer is marked pipelines.base.INDEX_PARTIAL. Then one background
ingestion per inline collection (per process) embeds everything into that same collection, same name, same key
scope, same idempotent upserts, reusing the vectors the questions already made; until it is done, later questions
take the same first pass over the candidates and every chunk embedded so far, after it the full hybrid search.

- The collection is complete only when InlineCollections.holds says so (every document row present with its hash,
  and a document's row is written after its chunks), so a cancelled or failed ingestion, which leaves at most some
  documents' chunks, is never taken for complete: the next request starts a new one (upserts: no duplicates).
- A failed ingestion is logged and forgotten; the request that needs the documents next starts it again.
- Shutdown (InlineCollections.close) stops them between embedding slices and waits for them.
- At most MAX_PENDING document sets are embedded in the background per process, and MAX_PENDING_PER_KEY of them
  for one key; past that, a request embeds its documents itself before answering, as before (back-pressure instead
  of an unbounded queue of documents, and one key's many new documents leave the first pass to other keys).
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from pipelines.cancellation import Cancelled
from pipelines.chunk_search import CHUNK_COLUMNS, fuse_rankings
from pipelines.chunking import Chunk, ScoredChunk, chunk_document
from pipelines.documents import Document
from pipelines.errors import StoreUnavailable
from pipelines.lexical import BM25Index
from pipelines.scope import KeyScope
from pipelines.store.names import content_hash
from pipelines.store.vectors import ChunkVectors

if TYPE_CHECKING:
    from pipelines.store.inline import InlineCollections

log = logging.getLogger(__name__)

MAX_PENDING = 16  # inline collections embedded in the background at once, per process
MAX_PENDING_PER_KEY = 4  # of which one key's (KeyScope): the others keep at least 12 slots
# the background ingestion embeds at most this many chunks between checks for shutdown: a stop is prompt even on
# loaded cores, and smaller batches cost MiniLM on a CPU little
_SLICE_CHUNKS = 16
# how long close() waits for each background ingestion to stop
CLOSE_TIMEOUT_S = 60.0
# a background ingestion waits at most this long, between two slices, for the first passes under way to finish
YIELD_S = 5.0

RUNNING, DONE, FAILED, CANCELLED = "running", "done", "failed", "cancelled"

# every background ingestion running in this process: stopped at exit (atexit runs before the interpreter stops
# its daemon threads, which, caught inside torch, would abort the process)
_running: set[PendingInline] = set()
_running_lock = threading.Lock()
_at_exit: list[bool] = []  # the exit hook, registered with the first ingestion


class _Questions:
    """First passes embedding their candidates in this process. Background ingestions wait for them between two
    slices (YIELD_S at most each time, so a stream of questions slows an ingestion, never stops it): on two
    cores a question's candidates embedded beside an ingestion took twice as long."""

    def __init__(self):
        self._lock = threading.Lock()
        self._count = 0
        self._idle = threading.Event()
        self._idle.set()

    @contextmanager
    def embedding(self) -> Iterator[None]:
        with self._lock:
            self._count += 1
            self._idle.clear()
        try:
            yield
        finally:
            with self._lock:
                self._count -= 1
                if self._count == 0:
                    self._idle.set()

    def wait(self, timeout: float) -> bool:
        """True when no first pass is embedding (now, or within `timeout`)."""
        return self._idle.wait(timeout)


QUESTIONS = _Questions()


def _stop_all() -> None:
    with _running_lock:
        running = list(_running)
    for pending in running:
        pending.stop()
    for pending in running:
        pending.join(CLOSE_TIMEOUT_S)


class PendingInline:
    """One inline collection being made: its documents' chunks, their BM25 index, the vectors made so far (by
    questions and by the background ingestion), and that ingestion."""

    def __init__(self, inline: InlineCollections, name: str, docs: list[Document], scope: KeyScope):
        self.inline, self.name, self.docs, self.scope = inline, name, list(docs), scope
        settings = inline.settings
        self.chunks: list[Chunk] = [c for d in self.docs for c in chunk_document(d, settings.chunking)]
        self._at = {(c.doc_id, c.position): i for i, c in enumerate(self.chunks)}
        self._index = BM25Index([c.text for c in self.chunks])
        self._vectors: dict[int, np.ndarray] = {}  # chunk index -> unit vector
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.state = RUNNING

    @property
    def embedder(self):
        return self.inline.store.embedder

    # -- the first pass ----------------------------------------------------------------------------
    def search(self, collection: str, query: str, k: int, query_vector: np.ndarray) -> list[ScoredChunk]:
        """DocumentStore.search's answer from the first pass: the k best chunks by reciprocal rank fusion of the
        BM25 ranking over every chunk and the vector ranking over the chunks embedded so far, the question's best
        rag.first_pass_candidates by BM25 among them (a hit found by text alone is embedded afterwards, for its
        cosine: at most k more)."""
        settings = self.inline.settings
        depth = max(3 * k, 20)  # chunk_search.hybrid_search's depth
        try:
            text_ranked = self._lexical(query, max(depth, settings.first_pass_candidates))
            known = self._embedded(text_ranked[: settings.first_pass_candidates])
        finally:
            self.start()
        indices = np.fromiter(known, dtype=np.int64, count=len(known))
        vector_ranked: list[int] = []
        if len(indices):
            sims = np.stack([known[int(i)] for i in indices]) @ query_vector
            vector_ranked = [int(indices[j]) for j in np.argsort(-sims, kind="stable")[:depth]]
        text_hits = [self._row(i, known.get(i)) for i in text_ranked[:depth]] if settings.hybrid else []
        vector_hits = [self._row(i, known[i]) for i in vector_ranked]
        hits = fuse_rankings(vector_hits, text_hits, query_vector, k, settings.rrf_k)
        at = [self._at[(h.chunk.doc_id, h.chunk.position)] for h in hits]
        unscored = [i for i in at if i not in known]
        if not unscored:
            return hits
        known = self._embedded(unscored)
        return [
            replace(h, vector_score=float(known[i] @ query_vector)) if i in unscored else h
            for h, i in zip(hits, at, strict=True)
        ]

    def chunk_vectors(self, question: str, doc_ids: Iterable[str]) -> dict[str, ChunkVectors]:
        """DocumentStore.chunk_vectors from the first pass, for the long route's unit scoring: the question's BM25
        candidates embedded, then every chunk embedded so far, per document."""
        try:
            known = self._embedded(self._lexical(question, self.inline.settings.first_pass_candidates))
        finally:
            self.start()
        found: dict[str, ChunkVectors] = {}
        for doc_id in set(doc_ids):
            mine = sorted(i for i in known if self.chunks[i].doc_id == doc_id)
            if mine:
                found[doc_id] = ChunkVectors(
                    np.asarray([self.chunks[i].start for i in mine]),
                    np.asarray([self.chunks[i].end for i in mine]),
                    np.stack([known[i] for i in mine]).astype(np.float32, copy=False),
                )
        return found

    def neighbours(
        self, collection: str, wanted: dict[str, Iterable[int]], query_vector: np.ndarray | None = None
    ) -> list[tuple[Chunk, float | None]]:
        """DocumentStore.neighbours from the chunks in memory (cosine only where a chunk is embedded already)."""
        with self._lock:
            known = dict(self._vectors)
        out: list[tuple[Chunk, float | None]] = []
        for doc_id, positions in wanted.items():
            for position in positions:
                i = self._at.get((doc_id, position))
                if i is None:
                    continue
                vector = known.get(i)
                score = None if vector is None or query_vector is None else float(vector @ query_vector)
                out.append((self.chunks[i], score))
        return out

    def titles(self, collection: str, ids: Iterable[str]) -> dict[str, tuple[str | None, str | None]]:
        wanted = set(ids)
        return {d.id: (d.title, d.source) for d in self.docs if d.id in wanted}

    def _lexical(self, query: str, n: int) -> list[int]:
        """The n best chunks for the query by BM25, best first; only chunks holding one of its terms."""
        scores = self._index.scores(query)
        order = np.argsort(-scores, kind="stable")[:n]
        return [int(i) for i in order if scores[i] > 0]

    def _embedded(self, candidates: list[int]) -> dict[int, np.ndarray]:
        """Embeds the candidates not embedded yet (on the question's model copy: a background ingestion holds the
        documents' copy), then returns every vector known."""
        with self._lock:
            missing = [i for i in candidates if i not in self._vectors]
        if missing:
            with QUESTIONS.embedding():
                vectors = self.embedder.embed_queries([self.chunks[i].text for i in missing])
            with self._lock:
                for i, vector in zip(missing, vectors, strict=True):
                    self._vectors.setdefault(i, vector)
        with self._lock:
            return dict(self._vectors)

    def _row(self, i: int, vector: np.ndarray | None) -> dict:
        """A chunk as a chunk-table row; a chunk not embedded yet gets a zero vector (its cosine is filled in
        afterwards, should it be a hit)."""
        chunk = self.chunks[i]
        row: dict = {name: getattr(chunk, name) for name in CHUNK_COLUMNS}
        row["vector"] = vector if vector is not None else np.zeros(self.embedder.dimension, np.float32)
        return row

    # -- the background ingestion ----------------------------------------------------------------
    def start(self) -> None:
        """Start the background ingestion, once (a question's first pass calls this after embedding its
        candidates, so the first question does not share the cores with it)."""
        with self._lock:
            if self._thread is not None or self._stop.is_set():
                return
            self._thread = threading.Thread(target=self._run, name=f"selfroute-inline-{self.name[-12:]}", daemon=True)
        with _running_lock:
            _running.add(self)
            if not _at_exit:
                atexit.register(_stop_all)
                _at_exit.append(True)
        self._thread.start()  # a new thread: no request's cancel scope reaches it, the client may leave

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    @property
    def started(self) -> bool:
        return self._thread is not None

    def _run(self) -> None:
        from pipelines.store.document_store import IngestCancelled

        try:
            self.inline.collection(self.docs, self._stop.is_set, self.scope, engine=_FirstPassEngine(self))
            self.state = DONE
        except IngestCancelled:
            self.state = CANCELLED
            log.info("stopped embedding inline collection %s in the background (shutting down)", self.name)
        except Exception as exc:
            self.state = FAILED
            if isinstance(exc, StoreUnavailable):
                log.warning("embedding inline collection %s in the background failed: %s", self.name, exc)
            else:
                log.exception("embedding inline collection %s in the background failed", self.name)
        finally:
            with _running_lock:
                _running.discard(self)
            self.inline.finished(self)

    def embed_document(self, doc: Document) -> tuple[list[Chunk], np.ndarray]:
        """A document's chunks and all their vectors, on the documents' model copy, reusing those made already;
        stops between model batches when asked to (IngestCancelled)."""
        from pipelines.store.document_store import IngestCancelled

        mine = [i for i, c in enumerate(self.chunks) if c.doc_id == doc.id]
        with self._lock:
            missing = [i for i in mine if i not in self._vectors]
        step = max(1, min(self.embedder.batch_size, _SLICE_CHUNKS))
        for start in range(0, len(missing), step):
            QUESTIONS.wait(YIELD_S)  # questions first
            if self._stop.is_set():
                raise IngestCancelled("ingestion cancelled")
            piece = missing[start : start + step]
            try:
                vectors = self.embedder.embed([self.chunks[i].text for i in piece], should_stop=self._stop.is_set)
            except Cancelled:
                raise IngestCancelled("ingestion cancelled") from None
            with self._lock:
                for i, vector in zip(piece, vectors, strict=True):
                    self._vectors.setdefault(i, vector)
        with self._lock:
            matrix = np.stack([self._vectors[i] for i in mine]) if mine else None
        if matrix is None:
            matrix = np.zeros((0, self.embedder.dimension), np.float32)
        return [self.chunks[i] for i in mine], matrix


class _FirstPassEngine:
    """DocumentStore.ingest's IngestEngine for a PendingInline: the chunks it already cut, the vectors made so far,
    the rest embedded here; which documents are skipped, and every write, stay the store's."""

    def __init__(self, pending: PendingInline):
        self.pending = pending

    def prepare(self, changed: Iterable[tuple[Document, str, bool]], chunking, embedder) -> Iterator[tuple]:
        from pipelines.store.document_store import document_row, prepare_document

        ours = {d.id: content_hash(d) for d in self.pending.docs}
        for doc, digest, replaces in changed:
            if ours.get(doc.id) != digest:  # not what the chunks were cut from (never, for an inline collection)
                row, chunks = prepare_document(doc, digest, chunking)
                yield row, chunks, replaces, self.pending.embedder.embed([c.text for c in chunks])
                continue
            chunks, vectors = self.pending.embed_document(doc)
            yield document_row(doc, digest, chunks), chunks, replaces, vectors
