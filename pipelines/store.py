"""Document store on LanceDB: collections of documents, their chunks and vectors, hybrid search.

Each collection is two LanceDB tables in the database at `uri` (a local directory, or any LanceDB URI
such as s3://bucket/path): `<name>__docs` (one row per document, full text kept for the long route)
and `<name>__chunks` (one row per chunk with its vector, plus a full-text index on the chunk text).
Ingestion is idempotent by content hash, and its writes are upserts keyed by document id and chunk
position, so several processes may write one collection at once. Embedding happens outside any lock;
only the brief writes to one collection are serialised within a process. Searches run concurrently.
"""
from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import TypeVar

import numpy as np
import pyarrow as pa

from pipelines.cache import LockedLRU
from pipelines.cancellation import cancelled
from pipelines.chunk_search import CHUNK_COLUMNS, hybrid_search, row_chunk
from pipelines.chunking import Chunk, ScoredChunk, chunk_document
from pipelines.documents import Document
from pipelines.errors import CollectionNotFound, StoreUnavailable
from pipelines.embedding import Embedder
from pipelines.scope import SHARED, KeyScope
from pipelines.settings import RagSettings
from pipelines.structure import find_cross_references, split_sections
from pipelines.tokens import count_tokens

log = logging.getLogger(__name__)
T = TypeVar("T")

# fullmatch, not match with "$": "$" also matches before a final newline
_COLLECTION_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
_DOCS, _CHUNKS = "__docs", "__chunks"
_INLINE_PREFIX = "inline-"
# when each inline collection was last used, by any process sharing the store: one row per collection. Not a
# collection (its name ends in neither suffix), so listings never see it.
_INLINE_USAGE = "selfroute-inline-usage"
# a process re-records a use at most this often per collection (each record is a write to the store), and never
# less often than a quarter of the idle period, so a collection in use always looks recently used
_USAGE_REFRESH_S = 60.0
# the store's secret that inline collection names are keyed with (HMAC-SHA256), so no client can derive the name of
# another key's attached documents: one row, kept in the store itself so every replica sharing it (an S3 bucket) names
# the same documents alike. Not a collection either.
_INLINE_SECRET = "selfroute-inline-secret"
_SECRET_ROW = "inline-names"
_USAGE_COMPACT_EVERY = 100  # usage records (each a table version) between compactions
# Ingestion writes in batches: one LanceDB write per batch keeps the number of fragments low.
_WRITE_BATCH_CHUNKS = 4096
# and embeds a batch in slices of this many model batches: concurrent ingestions take turns on the model,
# cancellation is prompt, progress steady
_EMBED_SLICE_BATCHES = 4
# Lance's (unenforced) primary key: concurrent upserts of the same new key then conflict and retry
# instead of both inserting it
_PRIMARY_KEY = {"lance-schema:unenforced-primary-key": "true"}
_KEEP_OLD_VERSIONS = timedelta(minutes=5)
# chunk vectors kept in memory for long-context scoring (384 floats each: 50,000 are about 77 MB)
_VECTOR_CACHE_CHUNKS = 50_000


def _storage_failed(exc: Exception) -> bool:
    """LanceDB's IO errors: an unreachable bucket, a refused disk."""
    return isinstance(exc, OSError) or (isinstance(exc, RuntimeError) and "LanceError(IO)" in str(exc))


def _dropped(exc: Exception) -> bool:
    """LanceDB's error for a table whose files went while it was open: another process dropped it."""
    return isinstance(exc, RuntimeError) and "lance error: Not found" in str(exc)


def _io_as_unavailable(method):
    """A store method whose storage failed (LanceDB's IO errors: an unreachable bucket, a refused disk) raises
    StoreUnavailable; the cause goes to the log. One whose collection was dropped while it read it (its first
    argument names the collection) raises CollectionNotFound."""
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except (OSError, RuntimeError) as exc:
            if _dropped(exc):
                collection = args[1] if len(args) > 1 and isinstance(args[1], str) else ""
                raise CollectionNotFound(collection) from None
            if not _storage_failed(exc):
                raise
            log.warning("document store unavailable: %s", exc)
            raise StoreUnavailable(StoreUnavailable.message) from None
    return wrapper


class IngestCancelled(Exception):
    """An ingestion stopped because should_stop() said so (its client left)."""


class KeyedLocks:
    """One lock per key, created on first use and dropped when nobody holds or waits for it."""

    def __init__(self):
        self._guard = threading.Lock()
        self._locks: dict[str, list] = {}  # key -> [lock, holders and waiters]

    @contextmanager
    def hold(self, key: str):
        with self._guard:
            entry = self._locks.setdefault(key, [threading.Lock(), 0])
            entry[1] += 1
        try:
            with entry[0]:
                yield
        finally:
            with self._guard:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._locks[key]


def _upsert(table, keys: list[str], data: pa.Table) -> None:
    if data.num_rows:
        table.merge_insert(keys).when_matched_update_all().when_not_matched_insert_all().execute(data)


def validate_collection_name(name: str) -> str:
    if not isinstance(name, str) or not _COLLECTION_NAME.fullmatch(name) or name.startswith("."):
        raise ValueError(
            f"invalid collection name {name!r}: use 1-128 letters, digits, '-', '_' or '.' (not starting with '.')"
        )
    return name


def check_writable_name(name: str) -> str:
    """A collection name a client or `selfroute ingest` may write to: valid, and not an inline collection's
    (`inline-*` is reserved for the documents attached to requests, which the gateway alone writes)."""
    validate_collection_name(name)
    if name.startswith(_INLINE_PREFIX):
        raise ValueError(f"collection names starting with {_INLINE_PREFIX!r} are reserved for the gateway's "
                         "attached-document caches; choose another name")
    return name


def content_hash(doc: Document) -> str:
    payload = json.dumps([doc.text, doc.title, doc.metadata], sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def _sql_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


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
class ChunkVectors:
    """One document's chunks as arrays: character spans and unit vectors, in position order."""

    starts: np.ndarray
    ends: np.ndarray
    vectors: np.ndarray

    def __len__(self) -> int:
        return len(self.starts)


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
        self._db = None
        self._writing = KeyedLocks()  # per collection: its writes, each brief (no embedding inside)
        self._ingesting = KeyedLocks()  # per inline collection: one ingestion of the same new documents
        self._connect_lock = threading.Lock()
        self._usage_lock = threading.Lock()
        self._recorded_use: dict[str, float] = {}  # inline collection -> when this process last recorded its use
        self._usage_writes = 0
        self._secret: bytes | None = None
        self._secret_lock = threading.Lock()
        # (collection, doc id, content hash) -> ChunkVectors; the hash keeps a replaced document from
        # being scored with its old vectors
        self._vectors: LockedLRU[tuple[str, str, str], ChunkVectors] = LockedLRU(_VECTOR_CACHE_CHUNKS, getsizeof=len)

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
        except (FileNotFoundError, ValueError):
            return None

    def _docs_schema(self) -> pa.Schema:
        return pa.schema(
            [
                pa.field("id", pa.string(), nullable=False, metadata=_PRIMARY_KEY),
                ("title", pa.string()),
                ("source", pa.string()),
                ("text", pa.large_string()),
                ("content_hash", pa.string()),
                ("tokens", pa.int64()),
                ("sections", pa.list_(pa.string())),
                ("cross_refs", pa.int64()),
                ("chunks", pa.int64()),
                ("metadata", pa.string()),
            ]
        )

    def _chunks_schema(self) -> pa.Schema:
        return pa.schema(
            [
                pa.field("doc_id", pa.string(), nullable=False, metadata=_PRIMARY_KEY),
                pa.field("position", pa.int64(), nullable=False, metadata=_PRIMARY_KEY),
                ("text", pa.string()),
                ("section", pa.string()),
                ("tokens", pa.int64()),
                ("start", pa.int64()),
                ("end", pa.int64()),
                ("vector", pa.list_(pa.float32(), self.embedder.dimension)),
            ]
        )

    def _tables(self, collection: str, create: bool = False):
        validate_collection_name(collection)
        docs, chunks = self._open(collection + _DOCS), self._open(collection + _CHUNKS)
        if create and (docs is None or chunks is None):
            if chunks is None:
                chunks = self.db.create_table(collection + _CHUNKS, schema=self._chunks_schema(), exist_ok=True)
            if docs is None:
                docs = self.db.create_table(collection + _DOCS, schema=self._docs_schema(), exist_ok=True)
        return docs, chunks

    # -- ingestion -------------------------------------------------------------------------------
    @_io_as_unavailable
    def ingest(
        self,
        collection: str,
        docs: Iterable[Document],
        progress: Callable[[int], None] | None = None,
        planned: Callable[[int], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> IngestReport:
        """Add documents; unchanged ones (same id and content hash) are skipped, changed ones replaced.
        Progress is counted in chunks, the slow part: planned(n) when n more chunks are to be embedded,
        progress(n) when n chunks have been embedded. should_stop() (and the request's
        pipelines.cancellation scope) is asked between embedding slices,
        and True abandons the ingest (IngestCancelled; batches already written stay).

        Chunking and embedding hold no lock. Each batch is then written in one short step, as upserts
        keyed by document id and by (document id, chunk position): the CLI and any number of gateway
        processes can write the same collection at once and leave no duplicates."""
        validate_collection_name(collection)
        started = time.perf_counter()
        report = IngestReport(collection)
        docs_table, chunks_table = self._tables(collection, create=True)
        known = self._known_hashes(docs_table)
        pending: list[tuple[dict, list[Chunk], bool]] = []  # (document row, its chunks, replaces an older version)
        pending_chunks = 0
        seen: set[str] = set()
        for doc in docs:
            if doc.id in seen:
                log.warning("document id %r appears twice in one ingest; keeping the first", doc.id)
                continue
            seen.add(doc.id)
            digest = content_hash(doc)
            if known.get(doc.id) == digest:
                report.unchanged.append(doc.id)
                continue
            (report.updated if doc.id in known else report.added).append(doc.id)
            chunks = chunk_document(doc, self.settings.chunking)
            pending.append((self._doc_row(doc, digest, len(chunks)), chunks, doc.id in known))
            pending_chunks += len(chunks)
            if planned is not None:
                planned(len(chunks))
            if pending_chunks >= _WRITE_BATCH_CHUNKS:
                report.chunks_written += self._write_batch(collection, docs_table, chunks_table, pending, progress,
                                                           should_stop)
                pending, pending_chunks = [], 0
        if pending:
            report.chunks_written += self._write_batch(collection, docs_table, chunks_table, pending, progress,
                                                       should_stop)
        if report.added or report.updated:
            with self._writing.hold(collection):
                self._refresh_indexes(chunks_table)
        report.seconds = time.perf_counter() - started
        log.info(
            "ingested %s: %d added, %d updated, %d unchanged, %d chunks in %.1fs",
            collection, len(report.added), len(report.updated), len(report.unchanged),
            report.chunks_written, report.seconds,
        )
        return report

    @staticmethod
    def _known_hashes(docs_table) -> dict[str, str]:
        if docs_table.count_rows() == 0:
            return {}
        rows = docs_table.search().select(["id", "content_hash"]).limit(None).to_arrow()
        return dict(zip(rows["id"].to_pylist(), rows["content_hash"].to_pylist()))

    @staticmethod
    def _doc_row(doc: Document, digest: str, n_chunks: int) -> dict:
        return {
            "id": doc.id,
            "title": doc.title,
            "source": doc.source,
            "text": doc.text,
            "content_hash": digest,
            "tokens": count_tokens(doc.text),
            "sections": [s.title for s in split_sections(doc.text) if s.title],
            "cross_refs": len(find_cross_references(doc.text)),
            "chunks": n_chunks,
            "metadata": json.dumps(doc.metadata, ensure_ascii=False, default=str),
        }

    def _embed_chunks(self, chunks: list[Chunk], progress: Callable[[int], None] | None,
                      should_stop: Callable[[], bool] | None) -> np.ndarray:
        """Vectors in slices of a few model batches, so ingestions of different documents take turns on
        the model, a cancelled one stops within a slice, and progress comes in steady steps."""
        parts = []
        step = self.embedder.batch_size * _EMBED_SLICE_BATCHES
        for i in range(0, len(chunks), step):
            if (should_stop is not None and should_stop()) or cancelled():
                raise IngestCancelled("ingestion cancelled")
            piece = chunks[i : i + step]
            parts.append(self.embedder.embed([c.text for c in piece]))
            if progress is not None:
                progress(len(piece))
        return np.concatenate(parts) if parts else np.zeros((0, self.embedder.dimension), np.float32)

    def _write_batch(self, collection: str, docs_table, chunks_table, pending: list[tuple[dict, list[Chunk], bool]],
                     progress: Callable[[int], None] | None, should_stop: Callable[[], bool] | None) -> int:
        """Embed one batch (no lock), then upsert it. Chunks go in before their document row, so a
        document row only exists once its chunks do; a replaced document's surplus chunks go too."""
        chunks = [c for _, cs, _ in pending for c in cs]
        vectors = self._embed_chunks(chunks, progress, should_stop)
        with self._writing.hold(collection):
            if chunks:
                columns = {name: [getattr(c, name) for c in chunks] for name in CHUNK_COLUMNS}
                columns["vector"] = pa.FixedSizeListArray.from_arrays(
                    pa.array(vectors.reshape(-1), type=pa.float32()), vectors.shape[1]
                )
                _upsert(chunks_table, ["doc_id", "position"], pa.table(columns, schema=chunks_table.schema))
            surplus = [f"(doc_id = {_sql_str(row['id'])} AND position >= {len(cs)})" for row, cs, replaces in pending
                       if replaces]
            for i in range(0, len(surplus), 200):
                chunks_table.delete(" OR ".join(surplus[i : i + 200]))
            _upsert(docs_table, ["id"], pa.Table.from_pylist([row for row, _, _ in pending], schema=docs_table.schema))
        return len(chunks)

    @staticmethod
    def _compact(table) -> None:
        # compaction keeps reads fast after many small writes and folds new rows into the indexes;
        # versions older than a few minutes go, so in-flight reads of an older version still finish
        try:
            table.optimize(cleanup_older_than=_KEEP_OLD_VERSIONS)
        except Exception as exc:  # optimisation is an optimisation: a failure must not lose the write
            log.warning("could not optimise %s: %s", table.name, exc)

    def _refresh_indexes(self, chunks_table) -> None:
        self._compact(chunks_table)
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

    # -- inline documents ------------------------------------------------------------------------
    # Attached documents are embedded once into an "inline collection" named by their content, kept for later
    # requests about the same documents. Several replicas may share the store, so what is kept is decided from the
    # store alone: each use is recorded there (_INLINE_USAGE), the cap counts every inline collection in it, and
    # only collections idle for settings.inline_cache_idle_seconds are dropped. A reader whose collection was
    # dropped all the same (another replica's clock ahead, a read slower than the idle period) embeds the documents
    # again and reads once more (read_inline): slower, never an error.

    @_io_as_unavailable
    def inline_collection(self, docs: list[Document], should_stop: Callable[[], bool] | None = None,
                          scope: KeyScope = SHARED) -> str:
        """A collection holding exactly these documents, named by their content hashes; ingested only
        the first time, so asking again about the same documents neither re-chunks nor re-embeds them.
        Requests for documents already ingested never wait for another document's ingestion; two
        requests with the same new documents embed them once. Read it through read_inline, which survives
        its being dropped meanwhile. Each key scope has its own (pipelines.scope)."""
        name = self.inline_name(docs, scope)
        # recorded before ingesting: from now on no process takes it for idle
        self._record_inline_use(name)
        if not self._holds(name, docs):
            with self._ingesting.hold(name):
                if not self._holds(name, docs):
                    self.ingest(name, docs, should_stop=should_stop)
                    self._drop_foreign(name, docs)
                    self._drop_idle_inline()  # only a new collection can take the store past the cap
        return name

    def inline_name(self, docs: list[Document], scope: KeyScope = SHARED) -> str:
        """The inline collection of these documents under this key scope (pipelines.scope): an HMAC of the scope,
        the documents' ids and content hashes under the store's secret, so nobody without the store can compute
        it, and one key's attached documents are never another's."""
        if not docs:
            raise ValueError("no documents to make an inline collection from")
        digest = hmac.new(self._inline_secret(), digestmod=hashlib.sha256)
        if scope.tag:
            digest.update(scope.tag.encode("utf-8") + b"\0")
        for doc in sorted(docs, key=lambda d: d.id):
            digest.update(doc.id.encode("utf-8") + b"\0" + content_hash(doc).encode() + b"\0")
        return _INLINE_PREFIX + digest.hexdigest()[:32]

    def _inline_secret(self) -> bytes:
        with self._secret_lock:
            if self._secret is None:
                self._secret = self._load_or_create_secret()
            return self._secret

    def _load_or_create_secret(self) -> bytes:
        """The store's inline-name secret, made by the first process that needs it. Two replicas making it at once:
        the row is an insert-if-absent on an (unenforced) primary key, so the second's insert conflicts, retries,
        finds the row and inserts nothing; both then read the one that won."""
        table = self._open(_INLINE_SECRET)
        if table is None:
            schema = pa.schema([pa.field("id", pa.string(), nullable=False, metadata=_PRIMARY_KEY),
                                ("secret", pa.string())])
            table = self.db.create_table(_INLINE_SECRET, schema=schema, exist_ok=True)
        secret = self._read_secret(table)
        if secret is None:
            row = pa.table({"id": [_SECRET_ROW], "secret": [secrets.token_hex(32)]}, schema=table.schema)
            table.merge_insert("id").when_not_matched_insert_all().execute(row)
            secret = self._read_secret(table)
        self._tighten_local(_INLINE_SECRET)
        return bytes.fromhex(secret)

    @staticmethod
    def _read_secret(table) -> str | None:
        rows = table.search().where(f"id = {_sql_str(_SECRET_ROW)}").select(["secret"]).limit(None).to_list()
        return rows[0]["secret"] if rows else None

    def _tighten_local(self, table_name: str) -> None:
        """On a local store, the secret's files are the owner's alone (0700 folders, 0600 files). An object
        store's access is its bucket policy's."""
        if "://" in self.uri and not self.uri.startswith("file://"):
            return
        root = os.path.join(self.uri.removeprefix("file://"), table_name + ".lance")
        for folder, _, files in os.walk(root):
            os.chmod(folder, 0o700)
            for name in files:
                os.chmod(os.path.join(folder, name), 0o600)

    @_io_as_unavailable
    def read_inline(self, docs: list[Document], read: Callable[[str], T],
                    should_stop: Callable[[], bool] | None = None, scope: KeyScope = SHARED) -> T:
        """read(name) of these documents' inline collection. Should it have been dropped before or during the read
        (the read raises CollectionNotFound, or a storage error, and the collection no longer holds the
        documents), the documents are ingested again and read once more."""
        name = self.inline_name(docs, scope)
        try:
            return read(self.inline_collection(docs, should_stop, scope))
        except (CollectionNotFound, StoreUnavailable):
            if self._holds(name, docs):
                raise  # still there: a real failure, not a drop
        log.info("inline collection %s was dropped while in use (by another process sharing the store?); "
                 "embedding its documents again", name)
        try:
            return read(self.inline_collection(docs, should_stop, scope))
        except CollectionNotFound:
            # dropped twice in a moment: a store too busy to keep anything; the client may try again
            raise StoreUnavailable(StoreUnavailable.message) from None

    def _holds(self, collection: str, docs: list[Document]) -> bool:
        """Whether the inline collection holds exactly these documents: the same ids with the same content hashes,
        and nothing else (a count would take any documents of the right number for these)."""
        docs_table = self._open(collection + _DOCS)
        if docs_table is None:
            return False
        try:
            return self._known_hashes(docs_table) == {d.id: content_hash(d) for d in docs}
        except RuntimeError as exc:
            if _dropped(exc):  # dropped between opening and reading
                return False
            raise

    def _drop_foreign(self, collection: str, docs: list[Document]) -> None:
        """After an inline ingest: documents in the collection that are not these go (none can be there unless
        something other than the gateway wrote it)."""
        docs_table, _ = self._tables(collection)
        wanted = {d.id for d in docs}
        for doc_id in sorted(set(self._known_hashes(docs_table)) - wanted):
            log.warning("inline collection %s held a document it was not made from; removed", collection)
            self.delete_document(collection, doc_id)

    def _usage_table(self):
        table = self._open(_INLINE_USAGE)
        if table is None:
            schema = pa.schema([pa.field("name", pa.string(), nullable=False, metadata=_PRIMARY_KEY),
                                ("used_at", pa.float64())])
            table = self.db.create_table(_INLINE_USAGE, schema=schema, exist_ok=True)
        return table

    def _write_usage(self, names: list[str], used_at: float) -> None:
        table = self._usage_table()
        _upsert(table, ["name"], pa.table({"name": names, "used_at": [used_at] * len(names)}, schema=table.schema))

    def _record_inline_use(self, name: str) -> None:
        """Record in the store that this inline collection is in use now, unless this process did so recently."""
        now = time.time()
        refresh = min(_USAGE_REFRESH_S, self.settings.inline_cache_idle_seconds / 4)
        with self._usage_lock:
            last = self._recorded_use.get(name)
            if last is not None and now - last < refresh:
                return
            self._recorded_use[name] = now
            if len(self._recorded_use) > 4 * self.settings.inline_cache_collections:
                self._recorded_use = {n: t for n, t in self._recorded_use.items() if now - t < refresh}
            self._usage_writes += 1
            compact = self._usage_writes % _USAGE_COMPACT_EVERY == 0
        try:
            self._write_usage([name], now)
            if compact:
                self._compact(self._usage_table())
        except Exception as exc:  # bookkeeping: a failed record (a commit conflict) must not fail the request
            if _storage_failed(exc):
                raise  # the store is down: the request's own reads would fail too
            log.warning("could not record the use of inline collection %s: %s", name, exc)
            with self._usage_lock:
                self._recorded_use.pop(name, None)  # the next use tries again

    def _drop_idle_inline(self) -> None:
        """Drop the least recently used inline collections beyond the cap, counted over the whole store, but none
        used within the idle period: until they go idle the store holds more than the cap. Housekeeping: a failure
        other than the store being down (a commit conflict with another process dropping) is logged, and the next
        new inline collection tries again."""
        try:
            self._drop_idle_inline_now()
        except Exception as exc:
            if _storage_failed(exc):
                raise
            log.warning("could not drop idle inline collections: %s", exc)

    def _drop_idle_inline_now(self) -> None:
        names = sorted(n[: -len(_DOCS)] for n in self._table_names() if n.endswith(_DOCS) and self.is_inline(n))
        over = len(names) - self.settings.inline_cache_collections
        if over <= 0:
            return
        table = self._usage_table()
        rows = table.search().select(["name", "used_at"]).limit(None).to_arrow()
        used = dict(zip(rows["name"].to_pylist(), rows["used_at"].to_pylist()))
        now = time.time()
        unrecorded = [n for n in names if n not in used]
        if unrecorded:  # made before uses were recorded (an older version): idle from now on
            self._write_usage(unrecorded, now)
        idle_before = now - self.settings.inline_cache_idle_seconds
        idle = sorted((used[n], n) for n in names if n in used and used[n] <= idle_before)
        dropped = [n for _, n in idle[:over]]
        for name in dropped:
            self.delete_collection(name)
        gone = set(dropped) | (set(used) - set(names))
        with self._usage_lock:
            for name in dropped:
                self._recorded_use.pop(name, None)
        # rows of collections no other process is creating right now (none was used within the idle period)
        stale = sorted(n for n in gone if n in dropped or used[n] <= idle_before)
        for i in range(0, len(stale), 200):
            table.delete(f"name IN ({', '.join(_sql_str(n) for n in stale[i : i + 200])})")
        self._compact(table)
        log.info("dropped %d inline collections (the store holds %d, cap %d%s)", len(dropped),
                 len(names) - len(dropped), self.settings.inline_cache_collections,
                 "" if len(dropped) == over else f"; the others were used in the last "
                 f"{self.settings.inline_cache_idle_seconds:g}s")

    @staticmethod
    def is_inline(collection: str) -> bool:
        return collection.startswith(_INLINE_PREFIX)

    # -- listing and reading ---------------------------------------------------------------------
    @_io_as_unavailable
    def collections(self, include_inline: bool = True) -> list[CollectionInfo]:
        """Every collection with its documents; include_inline=False leaves inline collections out
        without reading them (there can be hundreds)."""
        names = sorted(n[: -len(_DOCS)] for n in self._table_names() if n.endswith(_DOCS))
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

    @_io_as_unavailable
    def collection(self, name: str) -> CollectionInfo | None:
        docs_table, _ = self._tables(name)
        if docs_table is None:
            return None
        columns = ["id", "title", "source", "tokens", "sections", "cross_refs", "chunks", "content_hash", "metadata"]
        rows = docs_table.search().select(columns).limit(None).to_list() if docs_table.count_rows() else []
        infos = [
            DocumentInfo(
                id=r["id"], title=r["title"], source=r["source"], tokens=r["tokens"],
                sections=list(r["sections"] or []), cross_refs=r["cross_refs"], chunks=r["chunks"],
                content_hash=r["content_hash"], metadata=json.loads(r["metadata"] or "{}"),
            )
            for r in rows
        ]
        return CollectionInfo(name, sorted(infos, key=lambda d: d.id))

    @_io_as_unavailable
    def documents(self, collection: str, ids: list[str] | None = None) -> list[Document]:
        """Full documents, in the order of `ids` when given, else by id."""
        docs_table, _ = self._tables(collection)
        if docs_table is None or docs_table.count_rows() == 0:
            return []
        query = docs_table.search().select(["id", "title", "source", "text", "metadata"]).limit(None)
        if ids is not None:
            if not ids:
                return []
            query = query.where(f"id IN ({', '.join(_sql_str(i) for i in ids)})")
        found = {
            r["id"]: Document(r["id"], r["text"], r["title"], r["source"], json.loads(r["metadata"] or "{}"))
            for r in query.to_list()
        }
        order = ids if ids is not None else sorted(found)
        return [found[i] for i in order if i in found]

    @_io_as_unavailable
    def delete_document(self, collection: str, doc_id: str) -> bool:
        with self._writing.hold(collection):
            docs_table, chunks_table = self._tables(collection)
            if docs_table is None:
                return False
            where = f"id = {_sql_str(doc_id)}"
            if docs_table.count_rows(where) == 0:
                return False
            chunks_table.delete(f"doc_id = {_sql_str(doc_id)}")
            docs_table.delete(where)
            return True

    @_io_as_unavailable
    def delete_collection(self, collection: str) -> bool:
        with self._writing.hold(collection):
            docs_table, chunks_table = self._tables(collection)
            for table in (docs_table, chunks_table):
                if table is not None:  # another process may drop it first (two replicas dropping idle ones)
                    self.db.drop_table(table.name, ignore_missing=True)
            return docs_table is not None or chunks_table is not None

    # -- search ----------------------------------------------------------------------------------
    @_io_as_unavailable
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

    @_io_as_unavailable
    def neighbours(
        self, collection: str, wanted: dict[str, Iterable[int]], query_vector: np.ndarray | None = None
    ) -> list[tuple[Chunk, float | None]]:
        """Chunks by (doc_id -> positions), in one query, each with its cosine similarity to
        query_vector (None without one); positions that do not exist are ignored."""
        _, table = self._tables(collection)
        clauses = [
            f"(doc_id = {_sql_str(doc_id)} AND position IN ({', '.join(str(int(p)) for p in sorted(set(ps)))}))"
            for doc_id, ps in wanted.items()
            if ps
        ]
        if table is None or not clauses:
            return []
        columns = CHUNK_COLUMNS + (["vector"] if query_vector is not None else [])
        rows = table.search().where(" OR ".join(clauses)).select(columns).limit(None).to_list()
        return [
            (
                row_chunk(r),
                None if query_vector is None else float(np.dot(np.asarray(r["vector"], np.float32), query_vector)),
            )
            for r in rows
        ]

    @_io_as_unavailable
    def titles(self, collection: str, ids: Iterable[str]) -> dict[str, tuple[str | None, str | None]]:
        """doc id -> (title, source) for the given ids."""
        docs_table, _ = self._tables(collection)
        ids = sorted(set(ids))
        if docs_table is None or not ids:
            return {}
        rows = (
            docs_table.search()
            .where(f"id IN ({', '.join(_sql_str(i) for i in ids)})")
            .select(["id", "title", "source"])
            .limit(None)
            .to_list()
        )
        return {r["id"]: (r["title"], r["source"]) for r in rows}

    @_io_as_unavailable
    def chunk_vectors(self, collection: str, doc_ids: Iterable[str]) -> dict[str, ChunkVectors]:
        """doc id -> its chunks' spans and vectors, read from the store once per document version and
        then kept in memory (least recently used dropped first). CollectionNotFound if the collection is gone."""
        docs_table, chunks_table = self._tables(collection)
        if docs_table is None or chunks_table is None:
            raise CollectionNotFound(collection)
        ids = sorted(set(doc_ids))
        if not ids:
            return {}
        rows = (docs_table.search().where(f"id IN ({', '.join(_sql_str(i) for i in ids)})")
                .select(["id", "content_hash"]).limit(None).to_arrow())
        current = dict(zip(rows["id"].to_pylist(), rows["content_hash"].to_pylist()))
        found: dict[str, ChunkVectors] = {}
        for doc_id, digest in current.items():
            entry = self._vectors.get((collection, doc_id, digest))
            if entry is not None:
                found[doc_id] = entry
        missing = [d for d in current if d not in found]
        if missing:
            table = (chunks_table.search().where(f"doc_id IN ({', '.join(_sql_str(i) for i in missing)})")
                     .select(["doc_id", "position", "start", "end", "vector"]).limit(None).to_arrow())
            owners = np.asarray(table["doc_id"].to_pylist(), dtype=object)
            positions = table["position"].to_numpy()
            starts, ends = table["start"].to_numpy(), table["end"].to_numpy()
            vectors = table["vector"].combine_chunks().flatten().to_numpy().reshape(len(table), -1) \
                if len(table) else np.zeros((0, self.embedder.dimension), np.float32)
            for doc_id in missing:
                mine = np.flatnonzero(owners == doc_id)
                mine = mine[np.argsort(positions[mine], kind="stable")]
                entry = ChunkVectors(starts[mine], ends[mine], np.ascontiguousarray(vectors[mine], np.float32))
                found[doc_id] = entry
                self._vectors.put((collection, doc_id, current[doc_id]), entry)
        return found

    @_io_as_unavailable
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
            query = query.where(f"doc_id IN ({', '.join(_sql_str(i) for i in ids)})")
        rows = query.to_list()
        rows.sort(key=lambda r: (r["doc_id"], r["position"]))
        return [(row_chunk(r), np.asarray(r["vector"], dtype=np.float32)) for r in rows]
