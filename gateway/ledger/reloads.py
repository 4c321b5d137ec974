"""The policy reload across workers and replicas, in the ledger database (migration 014).

`policy_reloads`: one row per POST /v1/admin/reload that loaded, its generation the row's number. Every serving
process on the database reads the newest generation every few seconds (gateway.server.reloads, off the request path)
and reloads its own models when it is newer than the one it acted on. `gateway_processes`: what each process has in
force (model files' sha256, thresholds, the generation, the last reload error), written by the process itself, so
any process (or `GET /v1/admin/reload`) can say what is in force where.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from gateway.ledger.database import connect
from gateway.ledger.dialect import is_postgres, reachable

_T = TypeVar("_T")

# a process's row older than this is no longer kept (it stopped without removing it: killed, or the machine died)
FORGET_AFTER_S = 86400.0

_PUBLISH = (
    "INSERT INTO gateway_processes (id, host, pid, started_at, updated_at, generation, state)"
    " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET updated_at = excluded.updated_at,"
    " generation = excluded.generation, state = excluded.state"
)


class ReloadLog:
    """One connection, used from one thread at a time (the reload watcher, or the admin call's worker thread)."""

    def __init__(self, location: str | Path, busy_timeout: float | None = None):
        """busy_timeout: as KeyStore's. The watcher holds the lock while it reads; a call to a hung PostgreSQL
        that never ended kept a shutdown waiting for the lock for good (probe11)."""
        self.location = location
        self._busy_timeout = busy_timeout
        self._lock = threading.Lock()
        self._conn: Any = None

    def _run(self, work: Callable[[Any], _T]) -> _T:
        with self._lock:
            if self._conn is None:
                self._conn = connect(self.location, self._busy_timeout)
            try:
                with self._conn:  # one short transaction: nothing is left open between checks
                    return work(self._conn)
            except Exception:
                if is_postgres(self.location):  # the connection may be broken: a new one next time
                    self._drop()
                raise

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001  (closing a broken connection: nothing more to do)
                pass

    @reachable
    def latest(self) -> int:
        """The newest reload generation (0: none yet). One indexed read: the cheap check every process makes."""
        return int(
            self._run(lambda c: c.execute("SELECT coalesce(max(generation), 0) FROM policy_reloads").fetchone())[0]
        )

    @reachable
    def add(self, requested_by: str, policy_sha256: str | None) -> int:
        """A new generation, for the other processes to load; returns its number."""
        row = self._run(
            lambda c: c.execute(
                "INSERT INTO policy_reloads (requested_at, requested_by, policy_sha256) VALUES (?, ?, ?)"
                " RETURNING generation",
                (time.time(), requested_by, policy_sha256),
            ).fetchone()
        )
        return int(row[0])

    @reachable
    def publish(self, process: dict[str, Any]) -> None:
        """Write this process's row: `process` has id, host, pid, started_at, generation and the rest (JSON)."""
        now = time.time()
        row = (
            process["id"],
            process["host"],
            process["pid"],
            process["started_at"],
            now,
            process["generation"],
            json.dumps(process, default=str),
        )

        def write(conn: Any) -> None:
            conn.execute(_PUBLISH, row)
            conn.execute("DELETE FROM gateway_processes WHERE updated_at < ?", (now - FORGET_AFTER_S,))

        self._run(write)

    @reachable
    def forget(self, process_id: str) -> None:
        """A process stopping removes its row."""
        self._run(lambda c: c.execute("DELETE FROM gateway_processes WHERE id = ?", (process_id,)))

    @reachable
    def processes(self) -> list[dict[str, Any]]:
        """Every process's row, oldest start first: its state as it wrote it, and when (`updated_at`)."""
        rows = self._run(
            lambda c: c.execute("SELECT state, updated_at FROM gateway_processes ORDER BY started_at, id").fetchall()
        )
        return [{**json.loads(state), "updated_at": updated_at} for state, updated_at in rows]

    def close(self) -> None:
        with self._lock:
            self._drop()
