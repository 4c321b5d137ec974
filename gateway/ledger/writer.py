"""The ledger's off-request writer.

Requests hand records to `Ledger.submit`, which only enqueues; a writer thread batches them
into the database so the ledger never sits on a request's critical path. The database is a SQLite file or a
shared PostgreSQL (several gateway replicas writing to one ledger); a batch that cannot be written is retried
over about half a minute (a PostgreSQL restart or failover), then record by record, and what still fails is kept
in a dead-letter file.
"""
from __future__ import annotations

import json
import logging
import queue
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from gateway.ledger.database import connect, migrate, write_records
from gateway.ledger.dialect import database_error_types, is_postgres
from gateway.ledger.records import RequestRecord
from gateway.settings import private_file

logger = logging.getLogger(__name__)


# seconds to wait before each retry of a failed batch: ~30 s in all covers a database restart
RETRY_DELAYS = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0)
DEAD_LETTER_FILE = "ledger.failed.jsonl"  # where a PostgreSQL ledger's unwritable records go (in dead_letter_dir)


class Ledger:
    """Owns the ledger database; `submit` is non-blocking, a writer thread persists in batches.

    `location` is a SQLite file path or a postgresql:// URL. A PostgreSQL ledger keeps its dead-letter file in
    `dead_letter_dir` (the gateway's data directory), a SQLite one next to the database file.
    """

    def __init__(self, location: str | Path, *, batch_size: int = 256, dead_letter_dir: str | Path | None = None,
                 retry_delays: tuple[float, ...] = RETRY_DELAYS):
        self.location: str | Path = location if is_postgres(location) else Path(location)
        self.path: Path | None = None if is_postgres(location) else Path(location)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            private_file(self.path)
        if self.path is None and dead_letter_dir is None:
            raise ValueError("a PostgreSQL ledger needs a local dead_letter_dir for the records it cannot write")
        self._dead_letter_dir = Path(dead_letter_dir) if dead_letter_dir is not None else None
        self._retry_delays = retry_delays
        self._errors, self._transient = database_error_types()
        self._batch_size = batch_size
        self._queue: queue.Queue[RequestRecord | None] = queue.Queue()
        self._subscribers: list[Callable[[RequestRecord], None]] = []
        self._thread: threading.Thread | None = None
        self._closed = False
        conn = connect(self.location)
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
            conn = self._write(None, [record])
            if conn is not None:
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
        """Records the database would not take (disk full, locked past the timeout, PostgreSQL down for longer
        than the retries) are kept here as JSON lines."""
        if self.path is not None:
            return self.path.with_name(self.path.name + ".failed.jsonl")
        return self._dead_letter_dir / DEAD_LETTER_FILE

    def _try(self, conn, records: list[RequestRecord]):
        """Write `records` on `conn` (connecting first when it is None); returns (connection or None, error)."""
        try:
            if conn is None:
                conn = connect(self.location)
            write_records(conn, records)
            return conn, None
        except self._errors as exc:
            if conn is not None and getattr(conn, "in_transaction", False):
                try:
                    conn.rollback()
                except self._errors:
                    pass
            if conn is not None and is_postgres(self.location):  # it may be broken: a new one next time
                try:
                    conn.close()
                except self._errors:
                    pass
                conn = None
            return conn, exc

    def _write(self, conn, batch: list[RequestRecord]):
        """Write a batch; on failure retry with back-off, then record by record; what still fails is kept in
        the dead-letter file, so an accepted request is never silently lost. Returns the connection to reuse."""
        conn, error = self._try(conn, batch)
        for attempt, delay in enumerate(self._retry_delays):
            # a refused record (a constraint, a bad value) gets one retry; an unreachable, restarting or
            # locked database (OperationalError, deadlocks included) gets them all
            if error is None or (attempt and not isinstance(error, self._transient)):
                break
            logger.warning("ledger write of %d records failed (%s); retrying in %.1f s", len(batch), error, delay)
            time.sleep(delay)
            conn, error = self._try(conn, batch)
        if error is not None:
            logger.error("ledger batch of %d records kept failing; writing them one by one", len(batch))
            for record in batch:
                conn, error = self._try(conn, [record])
                if error is not None:
                    logger.error("ledger write failed for %s (%s): kept in %s", record.id, error, self.dead_letter_path)
                    self.dead_letter_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                    # the ledger's records, like the database file: its owner's only
                    with private_file(self.dead_letter_path).open("a", encoding="utf-8") as out:
                        out.write(json.dumps({"error": str(error), "record": asdict(record)}, default=str) + "\n")
        return conn

    def _run(self) -> None:
        conn = None
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
                    conn = self._write(conn, batch)
                for marker in markers:
                    marker.done.set()
                if stop:
                    return
        finally:
            if conn is not None:
                conn.close()


@dataclass
class _FlushMarker:
    done: threading.Event
