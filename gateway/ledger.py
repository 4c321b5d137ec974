"""The cost ledger: SQLite (WAL) with numbered, append-only migrations and an off-request writer.

Requests hand records to `Ledger.submit`, which only enqueues; a writer thread batches them
into SQLite so the ledger never sits on a request's critical path.
"""
from __future__ import annotations

import json
import logging
import queue
import sqlite3
import threading
import time
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable

logger = logging.getLogger(__name__)

LEDGER_FILE = "ledger.sqlite3"


@dataclass
class UpstreamCall:
    model: str
    route: str | None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    latency_ms: float | None = None
    error: str | None = None
    created_at: float = field(default_factory=time.time)


@dataclass
class RequestRecord:
    id: str
    created_at: float
    key_id: str | None
    policy: str | None
    alias: str | None
    route: str | None
    reason: str | None
    status: int
    error: str | None = None
    stream: bool = False
    latency_ms: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    context_tokens: int = 0
    counterfactual_cost_usd: float = 0.0
    provenance: dict[str, Any] | None = None
    calls: list[UpstreamCall] = field(default_factory=list)


def _migrations() -> list[tuple[int, str, str]]:
    folder = resources.files("gateway").joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        name = entry.name
        if name.endswith(".sql") and name[:3].isdigit():
            found.append((int(name[:3]), name, entry.read_text(encoding="utf-8")))
    return sorted(found)


def connect(path: str | Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), timeout=30, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.row_factory = sqlite3.Row
    return conn


def migrate(conn: sqlite3.Connection) -> list[int]:
    """Apply the migrations not yet applied, in order; returns the versions applied now."""
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
        " applied_at REAL NOT NULL)"
    )
    done = {row[0] for row in conn.execute("SELECT version FROM schema_migrations")}
    applied = []
    for version, name, sql in _migrations():
        if version in done:
            continue
        # one script, one transaction: a migration and its bookkeeping row land together or not at all
        conn.executescript(
            f"BEGIN;\n{sql}\n;INSERT INTO schema_migrations (version, name, applied_at)"
            f" VALUES ({version}, '{name}', {time.time()});\nCOMMIT;"
        )
        applied.append(version)
    return applied


_REQUEST_COLUMNS = [
    "id", "created_at", "key_id", "policy", "alias", "route", "reason", "status", "error", "stream",
    "latency_ms", "prompt_tokens", "completion_tokens", "cost_usd", "context_tokens",
    "counterfactual_cost_usd", "provenance",
]
_CALL_COLUMNS = [
    "request_id", "created_at", "model", "route", "prompt_tokens", "completion_tokens", "cost_usd",
    "latency_ms", "error",
]


def _request_row(record: RequestRecord) -> tuple:
    # getattr, not dataclasses.asdict: asdict deep-copies calls and provenance, ~70 us of GIL time a record
    values = [getattr(record, c) for c in _REQUEST_COLUMNS]
    values[_REQUEST_COLUMNS.index("stream")] = int(record.stream)
    values[_REQUEST_COLUMNS.index("provenance")] = json.dumps(record.provenance) if record.provenance is not None else None
    return tuple(values)


def _call_rows(record: RequestRecord) -> list[tuple]:
    return [
        (record.id, c.created_at, c.model, c.route, c.prompt_tokens, c.completion_tokens, c.cost_usd,
         c.latency_ms, c.error)
        for c in record.calls
    ]


def write_records(conn: sqlite3.Connection, records: list[RequestRecord]) -> None:
    """Insert a batch of records in one transaction."""
    with conn:
        # a re-submitted record replaces its request row; its legs must be replaced too, not duplicated
        conn.executemany("DELETE FROM upstream_calls WHERE request_id = ?", [(r.id,) for r in records])
        conn.executemany(
            f"INSERT OR REPLACE INTO requests ({', '.join(_REQUEST_COLUMNS)})"
            f" VALUES ({', '.join('?' * len(_REQUEST_COLUMNS))})",
            [_request_row(r) for r in records],
        )
        conn.executemany(
            f"INSERT INTO upstream_calls ({', '.join(_CALL_COLUMNS)}) VALUES ({', '.join('?' * len(_CALL_COLUMNS))})",
            [row for r in records for row in _call_rows(r)],
        )


class Ledger:
    """Owns the ledger file; `submit` is non-blocking, a writer thread persists in batches."""

    def __init__(self, path: str | Path, *, batch_size: int = 256):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._batch_size = batch_size
        self._queue: queue.Queue[RequestRecord | None] = queue.Queue()
        self._subscribers: list[Callable[[RequestRecord], None]] = []
        self._thread: threading.Thread | None = None
        self._closed = False
        conn = connect(self.path)
        try:
            migrate(conn)
        finally:
            conn.close()

    def subscribe(self, callback: Callable[[RequestRecord], None]) -> None:
        """Call `callback(record)` for every submitted record (from the submitting thread)."""
        self._subscribers.append(callback)

    def start(self) -> None:
        self._closed = False
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="selfroute-ledger", daemon=True)
            self._thread.start()

    def submit(self, record: RequestRecord) -> None:
        for callback in self._subscribers:
            try:
                callback(record)
            except Exception:  # a metrics bug must never fail a request
                logger.exception("ledger subscriber failed")
        if self._closed:  # a stream that ends after shutdown: write it now rather than to a dying thread
            conn = connect(self.path)
            try:
                self._write(conn, [record])
            finally:
                conn.close()
            return
        if self._thread is None:
            self.start()
        self._queue.put(record)

    def flush(self, timeout: float = 10.0) -> None:
        """Block until everything submitted so far is on disk."""
        done = threading.Event()
        if self._thread is None:  # nobody started the writer yet: the marker would wait out the timeout
            self.start()
        self._queue.put(_FlushMarker(done))  # type: ignore[arg-type]
        done.wait(timeout)

    def close(self) -> None:
        self._closed = True
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=30)
            self._thread = None

    @property
    def dead_letter_path(self) -> Path:
        """Records SQLite would not take (disk full, locked past the timeout) are kept here as JSON lines."""
        return self.path.with_name(self.path.name + ".failed.jsonl")

    def _write(self, conn: sqlite3.Connection, batch: list[RequestRecord]) -> None:
        """Write a batch; on failure retry once, then record by record; what still fails is kept in the
        dead-letter file, so an accepted request is never silently lost."""
        for attempt in range(2):
            try:
                write_records(conn, batch)
                return
            except sqlite3.Error:
                if attempt == 0:
                    time.sleep(0.5)
        logger.error("ledger batch of %d records failed twice; writing them one by one", len(batch))
        for record in batch:
            try:
                write_records(conn, [record])
            except sqlite3.Error as exc:
                logger.error("ledger write failed for %s (%s): kept in %s", record.id, exc, self.dead_letter_path)
                with self.dead_letter_path.open("a", encoding="utf-8") as out:
                    out.write(json.dumps({"error": str(exc), "record": asdict(record)}, default=str) + "\n")

    def _run(self) -> None:
        conn = connect(self.path)
        try:
            while True:
                item = self._queue.get()
                batch: list[RequestRecord] = []
                markers: list[_FlushMarker] = []
                stop = False
                while True:
                    if item is None:
                        stop = True
                    elif isinstance(item, _FlushMarker):
                        markers.append(item)
                    else:
                        batch.append(item)
                    if len(batch) >= self._batch_size:
                        break
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                if batch:
                    self._write(conn, batch)
                for marker in markers:
                    marker.done.set()
                if stop:
                    return
        finally:
            conn.close()


@dataclass
class _FlushMarker:
    done: threading.Event
