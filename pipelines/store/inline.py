"""Inline collections: the documents attached to requests, embedded once into a collection named by their content
and kept for later requests about the same documents.

Several replicas may share the store, so what is kept is decided from the store alone: each use is recorded there
(USAGE_TABLE), the cap counts every inline collection in it, and only collections idle for
settings.inline_cache_idle_seconds are dropped. A reader whose collection was dropped all the same (another
replica's clock ahead, a read slower than the idle period) embeds the documents again and reads once more (read):
slower, never an error. Names are an HMAC under a secret kept in the store, so no client can derive the name of
another key's attached documents. While new documents are embedded in the background, questions on them are
answered from a first pass (pending: pipelines.store.pending).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, TypeVar

import pyarrow as pa

from pipelines.cancellation import current_flag, detached
from pipelines.documents import Document
from pipelines.errors import CollectionNotFound, StoreUnavailable
from pipelines.scope import SHARED, KeyScope
from pipelines.store import filters
from pipelines.store.lance_errors import dropped, storage_failed
from pipelines.store.locks import KeyedLocks
from pipelines.store.names import INLINE_PREFIX, content_hash, is_inline
from pipelines.store.pending import CLOSE_TIMEOUT_S, MAX_PENDING, MAX_PENDING_PER_KEY, PendingInline
from pipelines.store.tables import DOCS, PRIMARY_KEY, compact, upsert

if TYPE_CHECKING:
    from pipelines.store.document_store import DocumentStore, IngestEngine

log = logging.getLogger(__name__)
T = TypeVar("T")

# when each inline collection was last used, by any process sharing the store: one row per collection. Not a
# collection (its name ends in neither suffix), so listings never see it.
USAGE_TABLE = "selfroute-inline-usage"
# a process re-records a use at most this often per collection (each record is a write to the store), and never
# less often than a quarter of the idle period, so a collection in use always looks recently used
_USAGE_REFRESH_S = 60.0
# the store's secret that inline collection names are keyed with (HMAC-SHA256): one row, kept in the store itself so
# every replica sharing it (an S3 bucket) names the same documents alike. Not a collection either.
SECRET_TABLE = "selfroute-inline-secret"
_SECRET_ROW = "inline-names"
_USAGE_COMPACT_EVERY = 100  # usage records (each a table version) between compactions


# the inline collections whose embedding work the calls made inside embedding_started() began (None outside one)
_started: ContextVar[list[str] | None] = ContextVar("selfroute_embedding_started", default=None)


@contextmanager
def embedding_started() -> Iterator[list[str]]:
    """The names of the inline collections whose embedding the calls inside this block began: of all the requests
    asking about the same new documents at once, only the one that started their one ingestion (in this thread, or
    in the background for a first pass) finds it here, so the tokens are charged once, to the request that did the
    work (the others waited for it, or read its first pass)."""
    started: list[str] = []
    token = _started.set(started)
    try:
        yield started
    finally:
        _started.reset(token)


def _note_started(name: str) -> None:
    started = _started.get()
    if started is not None:
        started.append(name)


class InlineCollections:
    """The inline collections of one DocumentStore: naming, ingesting once, usage records and idle eviction."""

    def __init__(self, store: DocumentStore):
        self.store = store
        self._ingesting = KeyedLocks()  # per inline collection: one ingestion of the same new documents
        self._usage_lock = threading.Lock()
        self._recorded_use: dict[str, float] = {}  # inline collection -> when this process last recorded its use
        self._usage_writes = 0
        self._secret: bytes | None = None
        self._secret_lock = threading.Lock()
        self._pending: dict[str, PendingInline] = {}  # inline collections embedded in the background, by name
        # first passes being made (their documents chunked) right now, by name: they hold a slot under the caps
        self._reserved: dict[str, KeyScope] = {}
        self._pending_lock = threading.Lock()
        self._making = KeyedLocks()  # per inline collection: its documents chunked once for the first pass
        self._closed = False

    @property
    def settings(self):
        return self.store.settings

    # -- making and reading ----------------------------------------------------------------------
    def collection(
        self,
        docs: list[Document],
        should_stop: Callable[[], bool] | None = None,
        scope: KeyScope = SHARED,
        engine: IngestEngine | None = None,
    ) -> str:
        """See DocumentStore.inline_collection. `engine`: a first pass's (pipelines.store.pending), which brings the
        chunks and vectors it made."""
        name = self.name(docs, scope)
        # recorded before ingesting: from now on no process takes it for idle
        self._record_use(name)
        if not self.holds(name, docs):
            # one ingestion for every request with these documents: a request that leaves while waiting for it
            # stops waiting; the ingestion itself stops once no request holding or waiting for it is left
            with self._ingesting.hold(name, current_flag()) as held:
                if not self.holds(name, docs):

                    def stop() -> bool:
                        return (should_stop is not None and should_stop()) or held.abandoned()

                    if engine is None:  # a first pass's ingestion was noted when it began (pending)
                        _note_started(name)
                    with detached():
                        self.store.ingest(name, docs, should_stop=stop, engine=engine)
                    self._drop_foreign(name, docs)
                    self._drop_idle()  # only a new collection can take the store past the cap
        return name

    def read(
        self,
        docs: list[Document],
        read: Callable[[str], T],
        should_stop: Callable[[], bool] | None = None,
        scope: KeyScope = SHARED,
    ) -> T:
        """See DocumentStore.read_inline."""
        name = self.name(docs, scope)
        try:
            return read(self.store.inline_collection(docs, should_stop, scope))
        except (CollectionNotFound, StoreUnavailable):
            if self.holds(name, docs):
                raise  # still there: a real failure, not a drop
        log.info(
            "inline collection %s was dropped while in use (by another process sharing the store?); "
            "embedding its documents again",
            name,
        )
        try:
            return read(self.store.inline_collection(docs, should_stop, scope))
        except CollectionNotFound:
            # dropped twice in a moment: a store too busy to keep anything; the client may try again
            raise StoreUnavailable(StoreUnavailable.message) from None

    # -- the first pass while new documents are embedded (pipelines.store.pending) -----------------
    def pending(self, docs: list[Document], scope: KeyScope = SHARED) -> PendingInline | None:
        """See DocumentStore.inline_pending."""
        if self.settings.first_pass_candidates == 0:
            return None
        name = self.name(docs, scope)
        with self._pending_lock:
            found = self._pending.get(name)
        if found is not None:
            return found
        self._record_use(name)
        if self.holds(name, docs):
            return None
        with self._making.hold(name):  # twenty first questions at once: one chunking, one background ingestion
            with self._pending_lock:
                found = self._pending.get(name)
                if found is not None or self._closed or not self._room(scope):
                    return found
                # the slot is taken now, not once chunked: twenty new document sets at once must not all pass
                self._reserved[name] = scope
            try:
                made = PendingInline(self, name, docs, scope)  # chunking: outside the registry's lock
            finally:
                with self._pending_lock:
                    del self._reserved[name]
            with self._pending_lock:
                if self._closed:
                    return None
                self._pending[name] = made
            _note_started(name)  # its background ingestion is this caller's work
            return made

    def _room(self, scope: KeyScope) -> bool:
        """Whether another background ingestion may start for this key (under self._pending_lock): MAX_PENDING in
        the process, MAX_PENDING_PER_KEY of them for one key, so that one key's many new documents leave the first
        pass to the others."""
        scopes = [p.scope for p in self._pending.values()] + list(self._reserved.values())
        return len(scopes) < MAX_PENDING and scopes.count(scope) < MAX_PENDING_PER_KEY

    def finished(self, pending: PendingInline) -> None:
        """A background ingestion ended (done, failed or stopped): later requests read the collection itself, or,
        should it not hold the documents (failed), start again."""
        with self._pending_lock:
            if self._pending.get(pending.name) is pending:
                del self._pending[pending.name]

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the background ingestions under way now to end (done, failed or stopped)."""
        with self._pending_lock:
            pending = list(self._pending.values())
        for p in pending:
            p.join(timeout)

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Stop the background ingestions between embedding slices and wait for them; no new ones start. What
        they wrote stays (whole documents' chunks at most: never taken for a complete collection)."""
        with self._pending_lock:
            self._closed = True
            pending = list(self._pending.values())
        for p in pending:
            p.stop()
        for p in pending:
            p.join(timeout)

    def holds(self, collection: str, docs: list[Document]) -> bool:
        """Whether the inline collection holds exactly these documents: the same ids with the same content hashes,
        embedded in this store's embedding space, and nothing else (a count would take any documents of the right
        number for these). Held in another space (another model or backend wrote it), it is made again (upserts)."""
        docs_table = self.store._open(collection + DOCS)
        if docs_table is None:
            return False
        try:
            space = self.store.embedder.space
            return self.store._known_versions(docs_table) == {d.id: (content_hash(d), space) for d in docs}
        except RuntimeError as exc:
            if dropped(exc):  # dropped between opening and reading
                return False
            raise

    def _drop_foreign(self, collection: str, docs: list[Document]) -> None:
        """After an inline ingest: documents in the collection that are not these go (none can be there unless
        something other than the gateway wrote it)."""
        docs_table, _ = self.store._tables(collection)
        wanted = {d.id for d in docs}
        for doc_id in sorted(set(self.store._known_hashes(docs_table)) - wanted):
            log.warning("inline collection %s held a document it was not made from; removed", collection)
            self.store.delete_document(collection, doc_id)

    # -- naming ----------------------------------------------------------------------------------
    def name(self, docs: list[Document], scope: KeyScope = SHARED) -> str:
        """See DocumentStore.inline_name."""
        if not docs:
            raise ValueError("no documents to make an inline collection from")
        digest = hmac.new(self._inline_secret(), digestmod=hashlib.sha256)
        if scope.tag:
            digest.update(scope.tag.encode("utf-8") + b"\0")
        for doc in sorted(docs, key=lambda d: d.id):
            digest.update(doc.id.encode("utf-8") + b"\0" + content_hash(doc).encode() + b"\0")
        return INLINE_PREFIX + digest.hexdigest()[:32]

    def _inline_secret(self) -> bytes:
        with self._secret_lock:
            if self._secret is None:
                self._secret = self._load_or_create_secret()
            return self._secret

    def _load_or_create_secret(self) -> bytes:
        """The store's inline-name secret, made by the first process that needs it. Two replicas making it at once:
        the row is an insert-if-absent on an (unenforced) primary key, so the second's insert conflicts, retries,
        finds the row and inserts nothing; both then read the one that won."""
        table = self.store._open(SECRET_TABLE)
        if table is None:
            schema = pa.schema(
                [pa.field("id", pa.string(), nullable=False, metadata=PRIMARY_KEY), ("secret", pa.string())]
            )
            table = self.store.db.create_table(SECRET_TABLE, schema=schema, exist_ok=True)
        secret = self._read_secret(table)
        if secret is None:
            row = pa.table({"id": [_SECRET_ROW], "secret": [secrets.token_hex(32)]}, schema=table.schema)
            table.merge_insert("id").when_not_matched_insert_all().execute(row)
            secret = self._read_secret(table)
        if secret is None:
            raise RuntimeError(f"the inline-name secret in {SECRET_TABLE} could not be read back")
        self._tighten_local(SECRET_TABLE)
        return bytes.fromhex(secret)

    @staticmethod
    def _read_secret(table) -> str | None:
        rows = table.search().where(filters.equals("id", _SECRET_ROW)).select(["secret"]).limit(None).to_list()
        return rows[0]["secret"] if rows else None

    def _tighten_local(self, table_name: str) -> None:
        """On a local store, the secret's files are the owner's alone (0700 folders, 0600 files). An object
        store's access is its bucket policy's."""
        uri = self.store.uri
        if "://" in uri and not uri.startswith("file://"):
            return
        root = os.path.join(uri.removeprefix("file://"), table_name + ".lance")
        for folder, _, files in os.walk(root):
            os.chmod(folder, 0o700)
            for name in files:
                os.chmod(os.path.join(folder, name), 0o600)

    # -- usage and eviction ----------------------------------------------------------------------
    def _usage_table(self):
        table = self.store._open(USAGE_TABLE)
        if table is None:
            schema = pa.schema(
                [pa.field("name", pa.string(), nullable=False, metadata=PRIMARY_KEY), ("used_at", pa.float64())]
            )
            table = self.store.db.create_table(USAGE_TABLE, schema=schema, exist_ok=True)
        return table

    def _write_usage(self, names: list[str], used_at: float) -> None:
        table = self._usage_table()
        upsert(table, ["name"], pa.table({"name": names, "used_at": [used_at] * len(names)}, schema=table.schema))

    def _record_use(self, name: str) -> None:
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
            due = self._usage_writes % _USAGE_COMPACT_EVERY == 0
        try:
            self._write_usage([name], now)
            if due:
                compact(self._usage_table())
        except Exception as exc:  # bookkeeping: a failed record (a commit conflict) must not fail the request
            if storage_failed(exc):
                raise  # the store is down: the request's own reads would fail too
            log.warning("could not record the use of inline collection %s: %s", name, exc)
            with self._usage_lock:
                self._recorded_use.pop(name, None)  # the next use tries again

    def _drop_idle(self) -> None:
        """Drop the least recently used inline collections beyond the cap, counted over the whole store, but none
        used within the idle period: until they go idle the store holds more than the cap. Housekeeping: a failure
        other than the store being down (a commit conflict with another process dropping) is logged, and the next
        new inline collection tries again."""
        try:
            self._drop_idle_now()
        except Exception as exc:
            if storage_failed(exc):
                raise
            log.warning("could not drop idle inline collections: %s", exc)

    def _drop_idle_now(self) -> None:
        names = sorted(n[: -len(DOCS)] for n in self.store._table_names() if n.endswith(DOCS) and is_inline(n))
        over = len(names) - self.settings.inline_cache_collections
        if over <= 0:
            return
        table = self._usage_table()
        rows = table.search().select(["name", "used_at"]).limit(None).to_arrow()
        used = dict(zip(rows["name"].to_pylist(), rows["used_at"].to_pylist(), strict=True))
        now = time.time()
        unrecorded = [n for n in names if n not in used]
        if unrecorded:  # made before uses were recorded (an older version): idle from now on
            self._write_usage(unrecorded, now)
        idle_before = now - self.settings.inline_cache_idle_seconds
        idle = sorted((used[n], n) for n in names if n in used and used[n] <= idle_before)
        gone_now = [n for _, n in idle[:over]]
        for name in gone_now:
            self.store.delete_collection(name)
        gone = set(gone_now) | (set(used) - set(names))
        with self._usage_lock:
            for name in gone_now:
                self._recorded_use.pop(name, None)
        # rows of collections no other process is creating right now (none was used within the idle period)
        stale = sorted(n for n in gone if n in gone_now or used[n] <= idle_before)
        for i in range(0, len(stale), filters.BATCH):
            table.delete(filters.among("name", stale[i : i + filters.BATCH]))
        compact(table)
        log.info(
            "dropped %d inline collections (the store holds %d, cap %d%s)",
            len(gone_now),
            len(names) - len(gone_now),
            self.settings.inline_cache_collections,
            ""
            if len(gone_now) == over
            else f"; the others were used in the last {self.settings.inline_cache_idle_seconds:g}s",
        )
