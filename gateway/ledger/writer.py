"""The ledger's off-request writer.

Requests hand records to `Ledger.submit`, which only enqueues; a writer thread batches them
into the database so the ledger never sits on a request's critical path.
"""
from __future__ import annotations

import json
import logging
import queue
import sqlite3
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from gateway.ledger.database import connect, migrate, write_records
from gateway.ledger.records import RequestRecord
from gateway.settings import private_file

logger = logging.getLogger(__name__)


class Ledger:
    """Owns the ledger file; `submit` is non-blocking, a writer thread persists in batches."""

    def __init__(self, path: str | Path, *, batch_size: int = 256):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        private_file(self.path)
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
