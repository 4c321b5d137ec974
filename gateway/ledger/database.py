"""The ledger database: connections and the numbered, append-only migrations (migrations/sqlite/NNN_*.sql)."""
from __future__ import annotations

import json
import sqlite3
import time
from importlib import resources
from pathlib import Path

from gateway.ledger.records import CALL_COLUMNS, REQUEST_COLUMNS, RequestRecord


def _migrations() -> list[tuple[int, str, str]]:
    folder = resources.files("gateway.ledger").joinpath("migrations", "sqlite")
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




def _request_row(record: RequestRecord) -> tuple:
    # getattr, not dataclasses.asdict: asdict deep-copies calls and provenance, ~70 us of GIL time a record
    values = [getattr(record, c) for c in REQUEST_COLUMNS]
    values[REQUEST_COLUMNS.index("stream")] = int(record.stream)
    values[REQUEST_COLUMNS.index("provenance")] = json.dumps(record.provenance) if record.provenance is not None else None
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
            f"INSERT OR REPLACE INTO requests ({', '.join(REQUEST_COLUMNS)})"
            f" VALUES ({', '.join('?' * len(REQUEST_COLUMNS))})",
            [_request_row(r) for r in records],
        )
        conn.executemany(
            f"INSERT INTO upstream_calls ({', '.join(CALL_COLUMNS)}) VALUES ({', '.join('?' * len(CALL_COLUMNS))})",
            [row for r in records for row in _call_rows(r)],
        )


