"""The LanceDB document store: collections of documents, their chunks and vectors, hybrid search.

Each collection is two LanceDB tables in the database at `uri` (a local directory, or any LanceDB URI
such as s3://bucket/path): `<name>__docs` (one row per document, full text kept for the long route)
and `<name>__chunks` (one row per chunk with its vector, plus a full-text index on the chunk text).
Ingestion is idempotent by content hash, and its writes are upserts keyed by document id and chunk
position, so several processes may write one collection at once. Embedding happens outside any lock;
only the brief writes to one collection are serialised within a process. Searches run concurrently.
Attached documents' collections live in pipelines.store.inline, the in-memory chunk vectors in
pipelines.store.vectors; filters are typed expressions (pipelines.store.filters).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any, Protocol, TypeVar

import numpy as np
import pyarrow as pa

from pipelines.cancellation import Cancelled, cancelled
from pipelines.chunk_search import CHUNK_COLUMNS, hybrid_search, row_chunk
from pipelines.chunking import Chunk, ScoredChunk, chunk_document
from pipelines.documents import Document
from pipelines.embedding import Embedder, EmbedderOptions, legacy_space
from pipelines.errors import CollectionNotFound
from pipelines.memory import TRIM_AFTER_CHUNKS, release_freed_memory
from pipelines.scope import SHARED, KeyScope
from pipelines.settings import ChunkingSettings, RagSettings
from pipelines.store import filters
from pipelines.store.inline import InlineCollections
from pipelines.store.lance_errors import MISSING_TABLE, io_as_unavailable
from pipelines.store.locks import KeyedLocks
from pipelines.store.names import content_hash, is_inline, validate_collection_name
from pipelines.store.pending import PendingInline
from pipelines.store.tables import CHUNKS, DOCS, SPACE, chunks_schema, compact, docs_schema, upsert, with_space_column
from pipelines.store.vectors import ChunkVectorCache, ChunkVectors
from pipelines.structure import find_cross_references, split_sections
from pipelines.tokens import count_tokens

log = logging.getLogger(__name__)
T = TypeVar("T")

# Ingestion writes in batches: one LanceDB write per batch keeps the number of fragments low.
_WRITE_BATCH_CHUNKS = 4096
# and embeds a batch in slices of this many model batches: concurrent ingestions take turns on the model,
# cancellation is prompt, progress steady
_EMBED_SLICE_BATCHES = 4


class IngestEngine(Protocol):
    """Chunks and embeds documents outside this process (pipelines.ray_ingest.RayIngestEngine)."""

    def prepare(
        self, changed: Iterable[tuple[Document, str, bool]], chunking: ChunkingSettings, embedder: EmbedderOptions
    ) -> Iterable[tuple[dict, list[Chunk], bool, np.ndarray]]:
        """For each (document, content hash, replaces): (its row, its chunks, replaces, the chunks' vectors),
        made by prepare_document with the store's chunking and an embedder built from the store's; any order."""
        ...


def prepare_document(doc: Document, digest: str, chunking: ChunkingSettings) -> tuple[dict, list[Chunk]]:
    """The document row and the chunks an ingestion writes for `doc` (ids, positions, counts): the one
    definition every ingestion uses, in this process or on a Ray worker."""
    chunks = chunk_document(doc, chunking)
    return document_row(doc, digest, chunks), chunks


def document_row(doc: Document, digest: str, chunks: list[Chunk]) -> dict:
    """The document's row, for its chunks (prepare_document's, or the same made earlier: pipelines.store.pending)."""
    return {
        "id": doc.id,
        "title": doc.title,
        "source": doc.source,
        "text": doc.text,
        "content_hash": digest,
        "tokens": count_tokens(doc.text),
        "sections": [s.title for s in split_sections(doc.text) if s.title],
        "cross_refs": len(find_cross_references(doc.text)),
        "chunks": len(chunks),
        "metadata": json.dumps(doc.metadata, ensure_ascii=False, default=str),
    }


class IngestCancelled(Cancelled):
    """An ingestion stopped because should_stop() said so (its client left)."""


@dataclass
class IngestReport:
    collection: str
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    chunks_written: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class DocumentInfo:
    id: str
    title: str | None
    source: str | None
    tokens: int
    sections: list[str]  # section titles in order
    cross_refs: int
    chunks: int
    content_hash: str
    metadata: dict

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class CollectionInfo:
    name: str
    documents: list[DocumentInfo]

    @property
    def chunk_count(self) -> int:
        return sum(d.chunks for d in self.documents)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "document_count": len(self.documents),
            "chunk_count": self.chunk_count,
            "documents": [d.to_dict() for d in self.documents],
        }


class DocumentStore:
    def __init__(self, uri: str, embedder: Embedder, settings: RagSettings | None = None):
        self.uri = str(uri)
        self.embedder = embedder
        self.settings = settings or RagSettings()
        self._db: Any = None  # a lancedb connection, made on first use
        self._writing = KeyedLocks()  # per collection: its writes, each brief (no embedding inside)
        self._connect_lock = threading.Lock()
        self.inline = InlineCollections(self)
        self._vectors = ChunkVectorCache()

    # -- connection and tables -------------------------------------------------------------------
    @property
    def db(self):
        with self._connect_lock:
            if self._db is None:
                import lancedb

                # a zero interval makes every read see the latest committed version (other processes too)
                self._db = lancedb.connect(self.uri, read_consistency_interval=timedelta(0))
            return self._db

    def _table_names(self) -> list[str]:
        db = self.db
        if hasattr(db, "list_tables"):
            names, token = [], None
            while True:
                page = db.list_tables(page_token=token) if token else db.list_tables()
                names.extend(getattr(page, "tables", page))
                token = getattr(page, "page_token", None)
                if not token:
                    return names
        return list(db.table_names())

    def _open(self, name: str):
        try:
            return self.db.open_table(name)
        except MISSING_TABLE:
            return None

    def _tables(self, collection: str, create: bool = False):
        validate_collection_name(collection)
        docs, chunks = self._open(collection + DOCS), self._open(collection + CHUNKS)
        if create and docs is not None:  # about to be written: an older table gets the space column first
            docs = with_space_column(docs)
        if create and (docs is None or chunks is None):
            if chunks is None:
                chunks = self.db.create_table(
                    collection + CHUNKS, schema=chunks_schema(self.embedder.dimension), exist_ok=True
                )
            if docs is None:
                docs = self.db.create_table(collection + DOCS, schema=docs_schema(), exist_ok=True)
        return docs, chunks

    # -- ingestion -------------------------------------------------------------------------------
    @io_as_unavailable
    def ingest(
        self,
        collection: str,
        docs: Iterable[Document],
        progress: Callable[[int], None] | None = None,
        planned: Callable[[int], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
        engine: IngestEngine | None = None,
    ) -> IngestReport:
        """Add documents; unchanged ones (same id, content hash and embedding space) are skipped, changed ones
        replaced: a document stored with another embedder's vectors (another model, or quantised: Embedder.space),
        or before the space was recorded, is embedded again, so one collection never mixes vector spaces.
        Progress is counted in chunks, the slow part: planned(n) when n more chunks are to be embedded,
        progress(n) when n chunks have been embedded. should_stop() (and the request's
        pipelines.cancellation scope) is asked between embedding slices,
        and True abandons the ingest (IngestCancelled; batches already written stay).

        Chunking and embedding hold no lock. Each batch is then written in one short step, as upserts
        keyed by document id and by (document id, chunk position): the CLI and any number of gateway
        processes can write the same collection at once and leave no duplicates.

        `engine`, when given, chunks and embeds the changed documents elsewhere (pipelines.ray_ingest: on a Ray
        cluster) with the same prepare_document; which documents are skipped, and every write, stay here."""
        validate_collection_name(collection)
        started = time.perf_counter()
        report = IngestReport(collection)
        docs_table, chunks_table = self._tables(collection, create=True)
        changed = self._changed(docs, self._known_versions(docs_table), report)
        if engine is None:
            self._ingest_here(collection, docs_table, chunks_table, changed, report, progress, planned, should_stop)
        else:
            self._ingest_prepared(
                collection,
                docs_table,
                chunks_table,
                engine.prepare(changed, self.settings.chunking, self.embedder.options),
                report,
                progress,
                planned,
                should_stop,
            )
        if report.added or report.updated:
            with self._writing.hold(collection):
                self._refresh_indexes(chunks_table)
        if report.chunks_written >= TRIM_AFTER_CHUNKS:
            release_freed_memory()  # the embedding's activations and the writes' buffers, freed but kept by malloc
        report.seconds = time.perf_counter() - started
        log.info(
            "ingested %s: %d added, %d updated, %d unchanged, %d chunks in %.1fs",
            collection,
            len(report.added),
            len(report.updated),
            len(report.unchanged),
            report.chunks_written,
            report.seconds,
        )
        return report

    def _changed(
        self, docs: Iterable[Document], known: dict[str, tuple[str, str | None]], report: IngestReport
    ) -> Iterator[tuple[Document, str, bool]]:
        """(document, content hash, replaces an older version) for each document to (re)write, in order; the
        report's added/updated/unchanged lists are filled as they go by."""
        seen: set[str] = set()
        for doc in docs:
            if doc.id in seen:
                log.warning("document id %r appears twice in one ingest; keeping the first", doc.id)
                continue
            seen.add(doc.id)
            digest = content_hash(doc)
            if known.get(doc.id) == (digest, self.embedder.space):
                report.unchanged.append(doc.id)
                continue
            (report.updated if doc.id in known else report.added).append(doc.id)
            yield doc, digest, doc.id in known

    def _ingest_here(self, collection, docs_table, chunks_table, changed, report, progress, planned, should_stop):
        """Chunk in this process, embed and write a batch of _WRITE_BATCH_CHUNKS at a time."""
        pending: list[tuple[dict, list[Chunk], bool]] = []  # (document row, its chunks, replaces an older version)
        pending_chunks = 0
        for doc, digest, replaces in changed:
            row, chunks = prepare_document(doc, digest, self.settings.chunking)
            pending.append((row, chunks, replaces))
            pending_chunks += len(chunks)
            if planned is not None:
                planned(len(chunks))
            if pending_chunks >= _WRITE_BATCH_CHUNKS:
                report.chunks_written += self._embed_and_write(
                    collection, docs_table, chunks_table, pending, progress, should_stop
                )
                pending, pending_chunks = [], 0
        if pending:
            report.chunks_written += self._embed_and_write(
                collection, docs_table, chunks_table, pending, progress, should_stop
            )

    def _ingest_prepared(self, collection, docs_table, chunks_table, prepared, report, progress, planned, should_stop):
        """Write documents an engine chunked and embedded, a batch of _WRITE_BATCH_CHUNKS at a time."""
        pending: list[tuple[dict, list[Chunk], bool]] = []
        vectors: list[np.ndarray] = []
        pending_chunks = 0
        for row, chunks, replaces, doc_vectors in prepared:
            if (should_stop is not None and should_stop()) or cancelled():
                raise IngestCancelled("ingestion cancelled")
            pending.append((row, chunks, replaces))
            vectors.append(doc_vectors)
            pending_chunks += len(chunks)
            for report_to in (planned, progress):  # an engine's chunks arrive embedded
                if report_to is not None:
                    report_to(len(chunks))
            if pending_chunks >= _WRITE_BATCH_CHUNKS:
                report.chunks_written += self._write(collection, docs_table, chunks_table, pending, vectors)
                pending, vectors, pending_chunks = [], [], 0
        if pending:
            report.chunks_written += self._write(collection, docs_table, chunks_table, pending, vectors)

    @staticmethod
    def _known_hashes(docs_table) -> dict[str, str]:
        if docs_table.count_rows() == 0:
            return {}
        rows = docs_table.search().select(["id", "content_hash"]).limit(None).to_arrow()
        return dict(zip(rows["id"].to_pylist(), rows["content_hash"].to_pylist(), strict=True))

    @staticmethod
    def _known_versions(docs_table) -> dict[str, tuple[str, str | None]]:
        """id -> (content hash, embedding space) of the stored documents; a row written before spaces were recorded
        (null, or an older table without the column) is in legacy_space (pipelines.embedding)."""
        if docs_table.count_rows() == 0:
            return {}
        spaced = SPACE in docs_table.schema.names
        rows = docs_table.search().select(["id", "content_hash", *([SPACE] if spaced else [])]).limit(None).to_arrow()
        spaces = rows[SPACE].to_pylist() if spaced else [None] * rows.num_rows
        if None in spaces:
            spaces = [legacy_space() if space is None else space for space in spaces]
        return {
            i: (h, space)
            for i, h, space in zip(rows["id"].to_pylist(), rows["content_hash"].to_pylist(), spaces, strict=True)
        }

    def _embed_chunks(
        self, chunks: list[Chunk], progress: Callable[[int], None] | None, should_stop: Callable[[], bool] | None
    ) -> np.ndarray:
        """Vectors in slices of a few model batches, so ingestions of different documents take turns on
        the model and progress comes in steady steps; a cancelled one stops before its next model run (a few
        chunks: a whole slice took minutes on loaded cores beside other ingestions)."""

        def stop() -> bool:
            return (should_stop is not None and should_stop()) or cancelled()

        parts = []
        step = self.embedder.batch_size * _EMBED_SLICE_BATCHES
        for i in range(0, len(chunks), step):
            if stop():
                raise IngestCancelled("ingestion cancelled")
            piece = chunks[i : i + step]
            try:
                parts.append(self.embedder.embed([c.text for c in piece], should_stop=stop))
            except Cancelled:
                raise IngestCancelled("ingestion cancelled") from None
            if progress is not None:
                progress(len(piece))
        return np.concatenate(parts) if parts else np.zeros((0, self.embedder.dimension), np.float32)

    def _embed_and_write(
        self,
        collection: str,
        docs_table,
        chunks_table,
        pending: list[tuple[dict, list[Chunk], bool]],
        progress: Callable[[int], None] | None,
        should_stop: Callable[[], bool] | None,
    ) -> int:
        """Embed one batch (no lock), then write it."""
        vectors = self._embed_chunks([c for _, cs, _ in pending for c in cs], progress, should_stop)
        return self._write(collection, docs_table, chunks_table, pending, [vectors])

    def _write(
        self,
        collection: str,
        docs_table,
        chunks_table,
        pending: list[tuple[dict, list[Chunk], bool]],
        vectors: list[np.ndarray],
    ) -> int:
        """Upsert one batch: chunks go in before their document row, so a document row only exists once its
        chunks do; a replaced document's surplus chunks go too. `vectors` are the chunks' rows, in order."""
        chunks = [c for _, cs, _ in pending for c in cs]
        with self._writing.hold(collection):
            if chunks:
                matrix = np.concatenate(vectors).astype(np.float32, copy=False)
                columns = {name: [getattr(c, name) for c in chunks] for name in CHUNK_COLUMNS}
                columns["vector"] = pa.FixedSizeListArray.from_arrays(
                    pa.array(matrix.reshape(-1), type=pa.float32()), matrix.shape[1]
                )
                upsert(chunks_table, ["doc_id", "position"], pa.table(columns, schema=chunks_table.schema))
            surplus = [filters.positions_from(row["id"], len(cs)) for row, cs, replaces in pending if replaces]
            for batch in filters.batches(surplus):
                chunks_table.delete(batch)
            rows = [{**row, SPACE: self.embedder.space} for row, _, _ in pending]  # the vectors' space, with them
            upsert(docs_table, ["id"], pa.Table.from_pylist(rows, schema=docs_table.schema))
        return len(chunks)

    def _refresh_indexes(self, chunks_table) -> None:
        compact(chunks_table)
        if not self._has_text_index(chunks_table):
            try:
                try:
                    from lancedb.index import FTS

                    chunks_table.create_index("text", config=FTS(), replace=True)
                except (ImportError, TypeError):  # lancedb before the unified index API
                    chunks_table.create_fts_index("text", replace=True)
            except Exception as exc:
                # another process writing the collection may have built it at the same moment (a commit
                # conflict); without it, search falls back to vectors only until the next ingestion
                if not self._has_text_index(chunks_table):
                    log.warning("could not build the full-text index of %s: %s", chunks_table.name, exc)

    @staticmethod
    def _has_text_index(chunks_table) -> bool:
        return any("text" in getattr(i, "columns", []) for i in chunks_table.list_indices())

    # -- inline documents (pipelines.store.inline) -----------------------------------------------
    @io_as_unavailable
    def inline_collection(
        self, docs: list[Document], should_stop: Callable[[], bool] | None = None, scope: KeyScope = SHARED
    ) -> str:
        """A collection holding exactly these documents, named by their content hashes; ingested only
        the first time, so asking again about the same documents neither re-chunks nor re-embeds them.
        Requests for documents already ingested never wait for another document's ingestion; two
        requests with the same new documents embed them once. Read it through read_inline, which survives
        its being dropped meanwhile. Each key scope has its own (pipelines.scope)."""
        return self.inline.collection(docs, should_stop, scope)

    @io_as_unavailable
    def inline_pending(self, docs: list[Document], scope: KeyScope = SHARED) -> PendingInline | None:
        """None when these documents' inline collection holds them (read it through read_inline); else the first
        pass over them while their background ingestion runs (pipelines.store.pending): started by the first
        caller, restarted by the next after a failure. None too when the first pass is off
        (rag.first_pass_candidates 0), after close(), or with too many ingestions under way: read_inline then
        embeds the documents before answering."""
        return self.inline.pending(docs, scope)

    def wait_inline(self, timeout: float | None = None) -> None:
        """Wait for the background ingestions of attached documents under way now (tests, benchmarks)."""
        self.inline.wait(timeout)

    def close(self) -> None:
        """Stop and wait for the background ingestions of attached documents (the gateway's shutdown)."""
        self.inline.close()

    def inline_name(self, docs: list[Document], scope: KeyScope = SHARED) -> str:
        """The inline collection of these documents under this key scope (pipelines.scope): an HMAC of the scope,
        the documents' ids and content hashes under the store's secret, so nobody without the store can compute
        it, and one key's attached documents are never another's."""
        return self.inline.name(docs, scope)

    @io_as_unavailable
    def read_inline(
        self,
        docs: list[Document],
        read: Callable[[str], T],
        should_stop: Callable[[], bool] | None = None,
        scope: KeyScope = SHARED,
    ) -> T:
        """read(name) of these documents' inline collection. Should it have been dropped before or during the read
        (the read raises CollectionNotFound, or a storage error, and the collection no longer holds the
        documents), the documents are ingested again and read once more."""
        return self.inline.read(docs, read, should_stop, scope)

    @staticmethod
    def is_inline(collection: str) -> bool:
        return is_inline(collection)

    # -- listing and reading ---------------------------------------------------------------------
    @io_as_unavailable
    def collections(self, include_inline: bool = True) -> list[CollectionInfo]:
        """Every collection with its documents; include_inline=False leaves inline collections out
        without reading them (there can be hundreds)."""
        names = sorted(n[: -len(DOCS)] for n in self._table_names() if n.endswith(DOCS))
        if not include_inline:
            names = [n for n in names if not self.is_inline(n)]
        infos = []
        for name in names:
            try:
                info = self.collection(name)
            except CollectionNotFound:  # deleted since it was listed
                continue
            if info is not None:
                infos.append(info)
        return infos

    @io_as_unavailable
    def collection(self, name: str) -> CollectionInfo | None:
        docs_table, _ = self._tables(name)
        if docs_table is None:
            return None
        columns = ["id", "title", "source", "tokens", "sections", "cross_refs", "chunks", "content_hash", "metadata"]
        rows = docs_table.search().select(columns).limit(None).to_list() if docs_table.count_rows() else []
        infos = [
            DocumentInfo(
                id=r["id"],
                title=r["title"],
                source=r["source"],
                tokens=r["tokens"],
                sections=list(r["sections"] or []),
                cross_refs=r["cross_refs"],
                chunks=r["chunks"],
                content_hash=r["content_hash"],
                metadata=json.loads(r["metadata"] or "{}"),
            )
            for r in rows
        ]
        return CollectionInfo(name, sorted(infos, key=lambda d: d.id))

    @io_as_unavailable
    def documents(self, collection: str, ids: list[str] | None = None) -> list[Document]:
        """Full documents, in the order of `ids` when given, else by id."""
        docs_table, _ = self._tables(collection)
        if docs_table is None or docs_table.count_rows() == 0:
            return []
        query = docs_table.search().select(["id", "title", "source", "text", "metadata"]).limit(None)
        if ids is not None:
            if not ids:
                return []
            query = query.where(filters.among("id", ids))
        found = {
            r["id"]: Document(r["id"], r["text"], r["title"], r["source"], json.loads(r["metadata"] or "{}"))
            for r in query.to_list()
        }
        order = ids if ids is not None else sorted(found)
        return [found[i] for i in order if i in found]

    @io_as_unavailable
    def delete_document(self, collection: str, doc_id: str) -> bool:
        with self._writing.hold(collection):
            docs_table, chunks_table = self._tables(collection)
            if docs_table is None:
                return False
            where = filters.equals("id", doc_id)
            if not docs_table.search().where(where).select(["id"]).limit(1).to_list():
                return False
            chunks_table.delete(filters.equals("doc_id", doc_id))
            docs_table.delete(where)
            return True

    @io_as_unavailable
    def delete_collection(self, collection: str) -> bool:
        with self._writing.hold(collection):
            docs_table, chunks_table = self._tables(collection)
            for table in (docs_table, chunks_table):
                if table is not None:  # another process may drop it first (two replicas dropping idle ones)
                    self.db.drop_table(table.name, ignore_missing=True)
            return docs_table is not None or chunks_table is not None

    # -- search ----------------------------------------------------------------------------------
    @io_as_unavailable
    def search(
        self, collection: str, query: str, k: int | None = None, query_vector: np.ndarray | None = None
    ) -> list[ScoredChunk]:
        """Hybrid search: vector (cosine) and full-text (BM25) rankings fused by reciprocal rank.
        Every hit carries its cosine similarity, also those found by keyword only. Pass query_vector
        (from embedder.embed([query])[0]) when the caller already has it."""
        k = k or self.settings.top_k
        _, table = self._tables(collection)
        if table is None:
            raise CollectionNotFound(collection)
        if query_vector is None:
            query_vector = self.embedder.embed_query(query)
        return hybrid_search(table, query, query_vector, k, hybrid=self.settings.hybrid, rrf_k=self.settings.rrf_k)

    @io_as_unavailable
    def neighbours(
        self, collection: str, wanted: dict[str, Iterable[int]], query_vector: np.ndarray | None = None
    ) -> list[tuple[Chunk, float | None]]:
        """Chunks by (doc_id -> positions), in one query, each with its cosine similarity to
        query_vector (None without one); positions that do not exist are ignored."""
        _, table = self._tables(collection)
        clauses = [filters.positions(doc_id, ps) for doc_id, ps in wanted.items() if ps]
        if table is None or not clauses:
            return []
        columns = [*CHUNK_COLUMNS, *(["vector"] if query_vector is not None else [])]
        rows = table.search().where(filters.any_of(clauses)).select(columns).limit(None).to_list()
        return [
            (
                row_chunk(r),
                None if query_vector is None else float(np.dot(np.asarray(r["vector"], np.float32), query_vector)),
            )
            for r in rows
        ]

    @io_as_unavailable
    def titles(self, collection: str, ids: Iterable[str]) -> dict[str, tuple[str | None, str | None]]:
        """doc id -> (title, source) for the given ids."""
        docs_table, _ = self._tables(collection)
        ids = sorted(set(ids))
        if docs_table is None or not ids:
            return {}
        rows = (
            docs_table.search().where(filters.among("id", ids)).select(["id", "title", "source"]).limit(None).to_list()
        )
        return {r["id"]: (r["title"], r["source"]) for r in rows}

    @io_as_unavailable
    def chunk_vectors(self, collection: str, doc_ids: Iterable[str]) -> dict[str, ChunkVectors]:
        """doc id -> its chunks' spans and vectors, read from the store once per document version and
        then kept in memory (pipelines.store.vectors). CollectionNotFound if the collection is gone."""
        docs_table, chunks_table = self._tables(collection)
        if docs_table is None or chunks_table is None:
            raise CollectionNotFound(collection)
        return self._vectors.read(collection, docs_table, chunks_table, doc_ids, self.embedder.dimension)

    @io_as_unavailable
    def chunks(self, collection: str, doc_ids: Iterable[str] | None = None) -> list[tuple[Chunk, np.ndarray]]:
        """All chunks (of the given documents) with their vectors, in document order."""
        _, table = self._tables(collection)
        if table is None:
            return []
        query = table.search().select(CHUNK_COLUMNS + ["vector"]).limit(None)
        if doc_ids is not None:
            ids = sorted(set(doc_ids))
            if not ids:
                return []
            query = query.where(filters.among("doc_id", ids))
        rows = query.to_list()
        rows.sort(key=lambda r: (r["doc_id"], r["position"]))
        return [(row_chunk(r), np.asarray(r["vector"], dtype=np.float32)) for r in rows]
