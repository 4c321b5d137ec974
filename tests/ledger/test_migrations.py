"""The ledger schema after every migration, spelled out in full (as simonw/llm's test_migrate.py does):
a migration that adds, drops or retypes anything must change this file too."""

from __future__ import annotations

import sqlite3

import pytest

from gateway.ledger import database
from gateway.ledger.database import connect, migrate
from gateway.ledger.records import CALL_COLUMNS, CALL_MEASURES, REQUEST_COLUMNS, REQUEST_MEASURES
from gateway.ledger.writer import Ledger

# table -> [(column, declared type, not null, primary-key position)]
EXPECTED_TABLES = {
    "api_keys": [
        ("name", "TEXT", 0, 1),
        ("prefix", "TEXT", 1, 0),
        ("salt", "TEXT", 1, 0),
        ("hash", "TEXT", 1, 0),
        ("models", "TEXT", 0, 0),
        ("collections", "TEXT", 0, 0),
        ("budget_usd", "REAL", 0, 0),
        ("rpm", "INTEGER", 0, 0),
        ("tpm", "INTEGER", 0, 0),
        ("created_at", "REAL", 1, 0),
        ("expires_at", "REAL", 0, 0),
        ("revoked_at", "REAL", 0, 0),
        ("admin", "INTEGER", 1, 0),
        ("budget_period_s", "REAL", 0, 0),
        ("period_anchor", "REAL", 0, 0),
        ("rotated_at", "REAL", 0, 0),
    ],
    "call_rollup_daily": [
        ("day", "INTEGER", 1, 1),
        ("model", "TEXT", 1, 2),
        ("route", "TEXT", 1, 3),
        ("policy", "TEXT", 1, 4),
        ("key_id", "TEXT", 1, 5),
        ("status", "INTEGER", 1, 6),
        ("calls", "INTEGER", 1, 0),
        ("errors", "INTEGER", 1, 0),
        ("prompt_tokens", "INTEGER", 1, 0),
        ("completion_tokens", "INTEGER", 1, 0),
        ("cost_usd", "REAL", 1, 0),
        ("latency_ms_sum", "REAL", 1, 0),
        ("latency_count", "INTEGER", 1, 0),
        ("cache_hits", "INTEGER", 1, 0),
        ("cached_tokens", "INTEGER", 1, 0),
        ("cache_saving_usd", "REAL", 1, 0),
    ],
    "call_rollup_hourly": [
        ("hour", "INTEGER", 1, 1),
        ("model", "TEXT", 1, 2),
        ("route", "TEXT", 1, 3),
        ("policy", "TEXT", 1, 4),
        ("key_id", "TEXT", 1, 5),
        ("status", "INTEGER", 1, 6),
        ("calls", "INTEGER", 1, 0),
        ("errors", "INTEGER", 1, 0),
        ("prompt_tokens", "INTEGER", 1, 0),
        ("completion_tokens", "INTEGER", 1, 0),
        ("cost_usd", "REAL", 1, 0),
        ("latency_ms_sum", "REAL", 1, 0),
        ("latency_count", "INTEGER", 1, 0),
        ("cache_hits", "INTEGER", 1, 0),
        ("cached_tokens", "INTEGER", 1, 0),
        ("cache_saving_usd", "REAL", 1, 0),
    ],
    "collection_owners": [("collection", "TEXT", 0, 1), ("owner", "TEXT", 1, 0), ("created_at", "REAL", 1, 0)],
    "gateway_processes": [
        ("id", "TEXT", 0, 1),
        ("host", "TEXT", 1, 0),
        ("pid", "INTEGER", 1, 0),
        ("started_at", "REAL", 1, 0),
        ("updated_at", "REAL", 1, 0),
        ("generation", "INTEGER", 1, 0),
        ("state", "TEXT", 1, 0),
    ],
    "labels": [
        ("id", "INTEGER", 0, 1),
        ("request_id", "TEXT", 1, 0),
        ("created_at", "REAL", 1, 0),
        ("source", "TEXT", 1, 0),
        ("key_id", "TEXT", 0, 0),
        ("verdict", "TEXT", 0, 0),
        ("good", "INTEGER", 1, 0),
        ("score", "REAL", 0, 0),
        ("cost_usd", "REAL", 1, 0),
        ("label_request_id", "TEXT", 0, 0),
    ],
    "latency_buckets": [("bucket", "INTEGER", 0, 1), ("upper_ms", "REAL", 1, 0)],
    "latency_rollup_hourly": [
        ("hour", "INTEGER", 1, 1),
        ("route", "TEXT", 1, 2),
        ("bucket", "INTEGER", 1, 3),
        ("requests", "INTEGER", 1, 0),
    ],
    "policy_reloads": [
        ("generation", "INTEGER", 0, 1),
        ("requested_at", "REAL", 1, 0),
        ("requested_by", "TEXT", 1, 0),
        ("policy_sha256", "TEXT", 0, 0),
    ],
    "rate_windows": [("key_id", "TEXT", 1, 1), ("minute", "INTEGER", 1, 2), ("requests", "INTEGER", 1, 0)],
    "request_features": [
        ("request_id", "TEXT", 0, 1),
        ("created_at", "REAL", 1, 0),
        ("version", "INTEGER", 1, 0),
        ("data", "TEXT", 1, 0),
    ],
    "request_rollup_daily": [
        ("day", "INTEGER", 1, 1),
        ("route", "TEXT", 1, 2),
        ("policy", "TEXT", 1, 3),
        ("key_id", "TEXT", 1, 4),
        ("status", "INTEGER", 1, 5),
        ("requests", "INTEGER", 1, 0),
        ("prompt_tokens", "INTEGER", 1, 0),
        ("completion_tokens", "INTEGER", 1, 0),
        ("context_tokens", "INTEGER", 1, 0),
        ("cost_usd", "REAL", 1, 0),
        ("counterfactual_cost_usd", "REAL", 1, 0),
        ("latency_ms_sum", "REAL", 1, 0),
        ("latency_count", "INTEGER", 1, 0),
        ("cache_hits", "INTEGER", 1, 0),
        ("cached_tokens", "INTEGER", 1, 0),
        ("cache_saving_usd", "REAL", 1, 0),
    ],
    "request_rollup_hourly": [
        ("hour", "INTEGER", 1, 1),
        ("route", "TEXT", 1, 2),
        ("policy", "TEXT", 1, 3),
        ("key_id", "TEXT", 1, 4),
        ("status", "INTEGER", 1, 5),
        ("requests", "INTEGER", 1, 0),
        ("prompt_tokens", "INTEGER", 1, 0),
        ("completion_tokens", "INTEGER", 1, 0),
        ("context_tokens", "INTEGER", 1, 0),
        ("cost_usd", "REAL", 1, 0),
        ("counterfactual_cost_usd", "REAL", 1, 0),
        ("latency_ms_sum", "REAL", 1, 0),
        ("latency_count", "INTEGER", 1, 0),
        ("cache_hits", "INTEGER", 1, 0),
        ("cached_tokens", "INTEGER", 1, 0),
        ("cache_saving_usd", "REAL", 1, 0),
    ],
    "requests": [
        ("id", "TEXT", 0, 1),
        ("created_at", "REAL", 1, 0),
        ("key_id", "TEXT", 0, 0),
        ("policy", "TEXT", 0, 0),
        ("alias", "TEXT", 0, 0),
        ("route", "TEXT", 0, 0),
        ("reason", "TEXT", 0, 0),
        ("status", "INTEGER", 1, 0),
        ("error", "TEXT", 0, 0),
        ("stream", "INTEGER", 1, 0),
        ("latency_ms", "REAL", 0, 0),
        ("prompt_tokens", "INTEGER", 1, 0),
        ("completion_tokens", "INTEGER", 1, 0),
        ("cost_usd", "REAL", 1, 0),
        ("context_tokens", "INTEGER", 1, 0),
        ("counterfactual_cost_usd", "REAL", 1, 0),
        ("provenance", "TEXT", 0, 0),
        ("cached_tokens", "INTEGER", 1, 0),
        ("cache_saving_usd", "REAL", 1, 0),
        ("client_request_id", "TEXT", 0, 0),
    ],
    "requests_in_flight": [  # WITHOUT ROWID since migration 016: its primary key is NOT NULL
        ("request_id", "TEXT", 1, 1),
        ("created_at", "REAL", 1, 0),
        ("expires_at", "REAL", 1, 0),
        ("owner", "TEXT", 1, 0),
        ("key_id", "TEXT", 0, 0),
        ("policy", "TEXT", 0, 0),
        ("alias", "TEXT", 0, 0),
        ("stream", "INTEGER", 1, 0),
        ("prompt_tokens", "INTEGER", 1, 0),
        ("completion_tokens", "INTEGER", 1, 0),
        ("cost_usd", "REAL", 1, 0),
        ("client_request_id", "TEXT", 0, 0),
    ],
    "schema_migrations": [("version", "INTEGER", 0, 1), ("name", "TEXT", 1, 0), ("applied_at", "REAL", 1, 0)],
    "sqlite_sequence": [("name", "", 0, 0), ("seq", "", 0, 0)],
    "upstream_calls": [
        ("id", "INTEGER", 0, 1),
        ("request_id", "TEXT", 1, 0),
        ("created_at", "REAL", 1, 0),
        ("model", "TEXT", 1, 0),
        ("route", "TEXT", 0, 0),
        ("prompt_tokens", "INTEGER", 1, 0),
        ("completion_tokens", "INTEGER", 1, 0),
        ("cost_usd", "REAL", 1, 0),
        ("latency_ms", "REAL", 0, 0),
        ("error", "TEXT", 0, 0),
        ("cached_tokens", "INTEGER", 1, 0),
        ("cache_saving_usd", "REAL", 1, 0),
        ("unpriced", "INTEGER", 1, 0),
    ],
}
EXPECTED_INDEXES = [
    "api_keys_prefix",
    "labels_created_at",
    "labels_request_id",
    "request_features_created_at",
    "requests_client_request_id",
    "requests_created_at",
    "requests_in_flight_key",
    "requests_key_created_at",
    "requests_policy_created_at",
    "requests_route_created_at",
    "requests_status_created_at",
    "upstream_calls_model_created_at",
    "upstream_calls_request_id",
    "upstream_calls_unpriced",
]
# migration 015: the writer adds each batch to the rollups; only the triggers for deletes made outside it remain
EXPECTED_TRIGGERS = ["call_rollup_delete", "latency_rollup_delete", "request_rollup_delete"]


def schema(conn) -> tuple[dict, list, list]:
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    columns = {t: [(r[1], r[2], r[3], r[5]) for r in conn.execute(f"PRAGMA table_info({t})")] for t in tables}
    indexes = sorted(
        r[0]
        for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND name NOT LIKE 'sqlite_autoindex%'"
        )
    )
    triggers = sorted(r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'"))
    return columns, indexes, triggers


def test_migrations_build_the_complete_schema(tmp_path):
    conn = connect(tmp_path / "ledger.sqlite3")
    applied = migrate(conn)
    columns, indexes, triggers = schema(conn)
    assert applied == sorted(applied) and applied[0] == 1
    assert columns == EXPECTED_TABLES
    assert indexes == EXPECTED_INDEXES
    assert triggers == EXPECTED_TRIGGERS
    assert [r[0] for r in conn.execute("SELECT version FROM schema_migrations ORDER BY version")] == applied


def test_migrations_are_applied_once(tmp_path):
    Ledger(tmp_path / "l.sqlite3").close()
    conn = connect(tmp_path / "l.sqlite3")
    before = schema(conn)
    assert migrate(conn) == []  # a second open applies nothing again
    assert schema(conn) == before


def test_record_columns_are_the_table_columns():
    assert list(REQUEST_COLUMNS) == [c[0] for c in EXPECTED_TABLES["requests"]]
    assert list(CALL_COLUMNS) == [c[0] for c in EXPECTED_TABLES["upstream_calls"] if c[0] != "id"]
    # the rollups' figures, described once (records.REQUEST_MEASURES, CALL_MEASURES), after their dimensions
    for table, measures in (("request_rollup", REQUEST_MEASURES), ("call_rollup", CALL_MEASURES)):
        for tier in ("hourly", "daily"):
            columns = [c[0] for c in EXPECTED_TABLES[f"{table}_{tier}"]]
            assert columns[-len(measures) :] == [m.column for m in measures], f"{table}_{tier}"


def test_processes_starting_together_migrate_a_new_ledger_once(tmp_path):
    """Workers or replicas opening a fresh ledger at the same moment: one applies each migration, the others find
    it done (they used to fail with "table ... already exists"). Fifteen rounds of six at once."""
    import threading

    for round_ in range(15):
        path = tmp_path / f"ledger{round_}.sqlite3"
        start = threading.Barrier(6)
        errors: list[BaseException] = []

        def open_ledger() -> None:
            conn = None
            try:
                start.wait(timeout=60)  # a thread that fails must not leave the others waiting forever
                conn = connect(path)
                migrate(conn)
            except BaseException as exc:  # noqa: BLE001  (reported below)
                errors.append(exc)
                start.abort()
            finally:
                if conn is not None:
                    conn.close()

        threads = [threading.Thread(target=open_ledger) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert errors == []
        conn = connect(path)
        versions = [r[0] for r in conn.execute("SELECT version FROM schema_migrations ORDER BY version")]
        assert versions == sorted(set(versions)) and versions[0] == 1 and schema(conn)[0] == EXPECTED_TABLES
        conn.close()


def test_migration_016_keeps_the_rows_in_flight_in_one_b_tree(tmp_path, monkeypatch):
    """016 rebuilds requests_in_flight WITHOUT ROWID (one b-tree per insert and delete instead of a rowid table and
    its key's index) and drops the unused index on expires_at: the rows in flight at the upgrade are all kept."""
    every = database._migrations()
    monkeypatch.setattr(database, "_migrations", lambda *a: [m for m in every if m[0] < 16])
    conn = connect(tmp_path / "ledger.sqlite3")
    migrate(conn)
    with conn:
        conn.executemany(
            "INSERT INTO requests_in_flight (request_id, created_at, expires_at, owner, key_id, cost_usd)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            [(f"req_{i}", 1.0 + i, 901.0 + i, "host:1", "k_a" if i % 2 else None, 0.01 * i) for i in range(5)],
        )
    monkeypatch.setattr(database, "_migrations", lambda *a: every)
    assert 16 in migrate(conn)
    kept = conn.execute(
        "SELECT request_id, created_at, expires_at, owner, key_id, cost_usd FROM requests_in_flight ORDER BY 1"
    ).fetchall()
    assert [tuple(r) for r in kept] == [
        (f"req_{i}", 1.0 + i, 901.0 + i, "host:1", "k_a" if i % 2 else None, 0.01 * i) for i in range(5)
    ]
    with pytest.raises(sqlite3.OperationalError, match="rowid"):
        conn.execute("SELECT rowid FROM requests_in_flight")
    assert [r[1] for r in conn.execute("PRAGMA index_list(requests_in_flight)") if r[3] == "c"] == [
        "requests_in_flight_key"
    ]
    conn.close()
