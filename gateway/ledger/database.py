"""The ledger database: connections and the numbered, append-only migrations (migrations/<dialect>/NNN_*.sql).

A ledger location is a SQLite file path (the default) or a `postgresql://` URL; each engine has its own set of
migrations with the same numbers and the same effect (tests/test_engines.py compares them). write_records adds each
batch to the rollups (gateway.ledger.rollups, from the figures records.py describes), whose remaining delete triggers'
migration is generated there.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import sqlite3
import time
from collections.abc import Callable
from contextlib import nullcontext, suppress
from importlib import resources
from pathlib import Path
from typing import Any

from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_random

from gateway.ledger import rollups
from gateway.ledger.dialect import (
    POSTGRESQL,
    SQLITE,
    Dialect,
    PostgresConnection,
    connect_postgres,
    dialect_of,
    is_postgres,
)
from gateway.ledger.records import (
    CALL_COLUMNS,
    FEATURE_COLUMNS,
    LABEL_COLUMNS,
    REQUEST_COLUMNS,
    RequestRecord,
    call_rows,
    insert_sql,
    label_row,
    request_row,
)

logger = logging.getLogger(__name__)

# any constant: the advisory lock that makes two replicas starting at once migrate one after the other
_MIGRATION_LOCK = 7_235_911


def _migrations(dialect: Dialect = SQLITE) -> list[tuple[int, str, str]]:
    folder = resources.files("gateway.ledger").joinpath("migrations", dialect.migrations)
    found = []
    for entry in folder.iterdir():
        name = entry.name
        if name.endswith(".sql") and name[:3].isdigit():
            found.append((int(name[:3]), name, entry.read_text(encoding="utf-8")))
    return sorted(found)


# how long a SQLite connection waits for another connection's write lock: the CLI may wait
BUSY_TIMEOUT_S = 30.0
# a request may not (nor the ledger's writer thread, which writes the requests' in-flight rows): past this, a file
# another process holds locked is, for the request, a database that is down
# (the outage path: rows spooled to the dead-letter file, the answer given, replayed later; a key with limits 503)
REQUEST_BUSY_TIMEOUT_S = 2.0


def connect(location: str | Path, busy_timeout: float | None = None) -> Any:
    """A writable connection: sqlite3's for a path (waiting up to `busy_timeout` seconds for a lock, else
    BUSY_TIMEOUT_S), a PostgresConnection for a postgresql:// URL (no call waiting longer than `busy_timeout`, else
    as long as the server takes: the CLI's migrations and reports may run for minutes)."""
    if is_postgres(location):
        return connect_postgres(str(location), stall_s=busy_timeout)
    busy_timeout = BUSY_TIMEOUT_S if busy_timeout is None else busy_timeout
    path = str(location)
    if path == ":memory:" or path.startswith("file:") or os.path.exists(path):
        conn = _open_sqlite(path, busy_timeout)
    else:
        # a new file (first start, or the old one deleted under a running gateway): the -wal and -shm left at its
        # name belong to the file that is gone, and a new file paired with them reads its pages (disk I/O error).
        # Under a lock on the folder, so a second process reopening at the same moment keeps the first one's new ones
        folder = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        try:
            fcntl.flock(folder, fcntl.LOCK_EX)
            if not os.path.exists(path):
                for stale in (path + "-wal", path + "-shm"):
                    with suppress(FileNotFoundError):
                        os.unlink(stale)
            conn = _open_sqlite(path, busy_timeout)
        finally:
            os.close(folder)  # and the lock with it
    conn.row_factory = sqlite3.Row
    return conn


# how often a connection looks again at the file its path names: an os.stat costs 2-9 us and the ledger's writer
# asks once per batch, the key store once per lookup. Rows written in this window after the file is deleted under
# the gateway go to the deleted file
IDENTITY_CHECK_S = 0.1


class SqliteConnection(sqlite3.Connection):
    """A connection that knows which file it opened: `broken` when its path no longer names that file (deleted or
    renamed away under the gateway; looked at once per IDENTITY_CHECK_S), so its holders reconnect as they do for a
    broken PostgreSQL connection, and rows go to the file at the path rather than to an unlinked inode that is gone
    at the next restart."""

    path = ""
    identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the file at open; None for :memory:
    created = False  # the file was made by this connect: it needs the migrations
    _moved = False
    _checked_at = -math.inf  # time.monotonic() of the last look

    @property
    def broken(self) -> bool:
        if self.identity is None or self._moved:
            return self._moved
        now = time.monotonic()
        if now - self._checked_at < IDENTITY_CHECK_S:
            return False
        self._checked_at = now
        try:
            found = os.stat(self.path)
        except FileNotFoundError:
            self._moved = True
        else:
            self._moved = (found.st_dev, found.st_ino) != self.identity
        if self._moved:
            logger.warning(
                "ledger file %s was deleted or replaced while open: reopening it (a new file if none)", self.path
            )
        return self._moved


def reopened(conn: Any, location: str | Path, busy_timeout: float | None = None) -> Any:
    """`conn`, or, when it is None or broken (closed here: a PostgreSQL connection that failed, a SQLite file
    deleted or replaced under the gateway), a new connection to `location`; a SQLite file this makes is migrated as
    at start. For the holders of a long-lived connection that writes (the ledger's, the labels')."""
    if conn is not None and getattr(conn, "broken", False):
        with suppress(Exception):  # it is dropped whatever closing it says
            conn.close()
        conn = None
    if conn is None:
        conn = connect(location, busy_timeout)
        if getattr(conn, "created", False):
            migrate(conn)
    return conn


def _open_sqlite(path: str, busy_timeout: float) -> SqliteConnection:
    existed = os.path.exists(path)
    conn = sqlite3.connect(path, timeout=busy_timeout, check_same_thread=False, factory=SqliteConnection)
    # switching a new file to WAL answers "database is locked" at once, without the busy timeout, while another
    # process (a worker or replica starting at the same moment) does the same: retry it for a while
    for attempt in Retrying(
        retry=retry_if_exception(_locked),
        stop=stop_after_delay(busy_timeout),
        wait=wait_random(0.01, 0.1),
        reraise=True,
    ):
        with attempt:
            conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.path = path
    conn.created = not existed
    with suppress(OSError):  # the identity is taken once WAL mode has written the file (sqlite3 creates it lazily)
        found = os.stat(path)
        conn.identity = (found.st_dev, found.st_ino)
    return conn


def _locked(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)


def migrate(conn: Any) -> list[int]:
    """Apply the migrations not yet applied, in order; returns the versions applied now."""
    if dialect_of(conn) is POSTGRESQL:
        return _migrate_postgres(conn)
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
        " applied_at REAL NOT NULL)"
    )
    done = {row[0] for row in conn.execute("SELECT version FROM schema_migrations")}
    applied = []
    for version, name, sql in _migrations():
        if version in done:
            continue
        try:
            # one script, one transaction: a migration and its bookkeeping row land together or not at all
            conn.executescript(
                f"BEGIN;\n{sql}\n;INSERT INTO schema_migrations (version, name, applied_at)"
                f" VALUES ({version}, '{name}', {time.time()});\nCOMMIT;"
            )
        except (sqlite3.OperationalError, sqlite3.IntegrityError):
            # another process (a second worker or replica starting at the same moment) applied it while this
            # one waited for the write lock: its transaction failed whole; go on if the version is there now.
            # A migration whose objects a later one dropped (007's, by 008) runs again without error until its
            # bookkeeping row, already there: IntegrityError, and the rollback undoes it.
            if conn.in_transaction:
                conn.rollback()
            if version not in {row[0] for row in conn.execute("SELECT version FROM schema_migrations")}:
                raise
            continue
        applied.append(version)
    return applied


def _migrate_postgres(conn: PostgresConnection) -> list[int]:
    applied = []
    with conn:  # one transaction under a lock: a second replica waits, then finds the work done
        conn.execute("SELECT pg_advisory_xact_lock(?)", (_MIGRATION_LOCK,))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at double precision NOT NULL)"
        )
        done = {row[0] for row in conn.execute("SELECT version FROM schema_migrations")}
        for version, name, sql in _migrations(POSTGRESQL):
            if version in done:
                continue
            conn.script(sql)  # the whole file in one execute, without parameters: several statements are fine
            conn.execute(
                "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                (version, name, time.time()),
            )
            applied.append(version)
    return applied


def _finite(value: Any) -> Any:
    """JSON without NaN or infinity (PostgreSQL's JSON functions and strict readers refuse them): those become null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _feature_rows(records: list[RequestRecord]) -> list[tuple]:
    return [
        (r.id, r.created_at, int(r.features.get("version", 1)), json.dumps(_finite(r.features), default=str))
        for r in records
        if r.features is not None
    ]


_UPSERT_FEATURES = (
    insert_sql("request_features", FEATURE_COLUMNS)
    + " ON CONFLICT (request_id) DO UPDATE SET created_at = excluded.created_at, version = excluded.version,"
    " data = excluded.data"
)
INSERT_LABEL = insert_sql("labels", LABEL_COLUMNS)


def _write_learning(conn: Any, records: list[RequestRecord]) -> None:
    """The learning rows of a batch (migration 010), in the batch's transaction. Labels ride only on the judge's own
    request record, which is submitted once."""
    features = _feature_rows(records)
    if features:
        conn.executemany(_UPSERT_FEATURES, features)
    labels = [label_row(label) for r in records for label in r.labels]
    if labels:
        conn.executemany(INSERT_LABEL, labels)


_INSERT_REQUEST = insert_sql("requests", REQUEST_COLUMNS)
_INSERT_CALL = insert_sql("upstream_calls", CALL_COLUMNS)
# a finished request's row replaces its reservation in the same transaction (gateway/ledger/budget.py): its key's
# spend is never counted twice, nor missing for a moment. Both statements take a batch's ids at once: SQLite's list
# padded to a power of two (a few statement texts, each prepared once), PostgreSQL's an array
_SETTLE = {
    SQLITE: "DELETE FROM requests_in_flight WHERE request_id IN ({})",
    POSTGRESQL: "DELETE FROM requests_in_flight WHERE request_id = ANY(?)",
}
_EXISTING = {
    SQLITE: "SELECT id FROM requests WHERE id IN ({})",
    POSTGRESQL: "SELECT id FROM requests WHERE id = ANY(?)",
}


_MAX_IDS = 4096  # SQLite ids per statement: under its limit of 32,766 parameters, padding included


def _by_ids(conn: Any, statements: dict[Dialect, str], ids: list[str], *, read: bool = False) -> list:
    """Run the statement for `ids`; with `read`, returns the rows it reads (on PostgreSQL's pipeline, reading waits
    for the answer: a statement whose rows nobody reads does not)."""
    if dialect_of(conn) is POSTGRESQL:
        cursor = conn.execute(statements[POSTGRESQL], (ids,))
        return cursor.fetchall() if read else []
    found = []
    for start in range(0, len(ids), _MAX_IDS):
        chunk = ids[start : start + _MAX_IDS]
        size = 1 << (len(chunk) - 1).bit_length()
        found += conn.execute(statements[SQLITE].format(", ".join("?" * size)), chunk + chunk[:1] * (size - len(chunk)))
    return found


def _pipeline(conn: Any) -> Any:
    """PostgreSQL: the batch's statements sent without waiting for each one's answer (psycopg's pipeline mode), one
    round trip where the answers are needed; SQLite runs in-process."""
    return conn.pipeline() if dialect_of(conn) is POSTGRESQL else nullcontext()


def write_records(
    conn: Any,
    records: list[RequestRecord],
    *,
    keep_existing: bool = False,
    first: Callable[[Any], None] | None = None,
) -> int:
    """Insert a batch of records, their legs, learning rows and rollups (gateway.ledger.rollups.add) in one
    transaction, each record's in-flight row (its reservation) deleted in it. A record re-submitted under the same
    id replaces the old one; with `keep_existing`, a recorded request keeps its row (an abandoned reservation's
    estimate never replaces the real record). `first(conn)` runs at the start of the same transaction (the writer's
    new in-flight rows: one commit for both). Returns how many records were written."""
    records = list({r.id: r for r in records}.values())  # the last version of an id wins within a batch too
    if not records and first is None:
        return 0
    ids = [r.id for r in records]
    with conn, _pipeline(conn):
        if first is not None:
            first(conn)
        if not records:
            return 0
        # a write first: on SQLite it takes the database's write lock, so what is found existing holds until the
        # commit (on PostgreSQL another replica inserting one of these ids makes the INSERT fail, and the writer
        # retries the batch record by record)
        _by_ids(conn, _SETTLE, ids)
        existing = {row[0] for row in _by_ids(conn, _EXISTING, ids, read=True)}
        if existing and keep_existing:
            records = [r for r in records if r.id not in existing]
        elif existing:
            # the old row and legs out; their DELETE triggers take them out of the rollups (a rare path: replays,
            # and a real record after its abandoned estimate). Legs first: their trigger reads the request's groups
            old = [(request_id,) for request_id in sorted(existing)]
            conn.executemany("DELETE FROM upstream_calls WHERE request_id = ?", old)
            conn.executemany("DELETE FROM requests WHERE id = ?", old)
        if records:
            conn.executemany(_INSERT_REQUEST, [request_row(r) for r in records])
            legs = [row for r in records for row in call_rows(r)]
            if legs:
                conn.executemany(_INSERT_CALL, legs)
            rollups.add(conn, records)
            _write_learning(conn, records)
    return len(records)
