"""What the rollups must hold: a fresh GROUP BY over the raw rows (requests, upstream_calls), on either engine.

The writer adds each batch in Python (gateway/ledger/rollups.py) and the delete triggers take rows out; this
recomputes every rollup table from the raw rows with SQL aggregates (records.Measure.raw_sum), so a drift of any
figure, group or bucket fails the comparison."""

from __future__ import annotations

import pytest

from gateway.ledger.dialect import dialect_of
from gateway.ledger.records import CALL_MEASURES, REQUEST_MEASURES

_REQUEST_KEY = "coalesce(r.route, ''), coalesce(r.policy, ''), coalesce(r.key_id, ''), r.status"


def _fresh(conn) -> dict[str, list[tuple]]:
    hour = dialect_of(conn).bucket("r.created_at", 3600)
    req = ", ".join(m.raw_sum("r.") for m in REQUEST_MEASURES)
    call = ", ".join(m.raw_sum("c.") for m in CALL_MEASURES)
    legs = "upstream_calls c JOIN requests r ON r.id = c.request_id"
    queries = {
        "request_rollup_hourly": f"SELECT {hour}, {_REQUEST_KEY}, {req} FROM requests r GROUP BY 1, 2, 3, 4, 5",
        "request_rollup_daily": f"SELECT {hour} / 24, {_REQUEST_KEY}, {req} FROM requests r GROUP BY 1, 2, 3, 4, 5",
        "call_rollup_hourly": f"SELECT {hour}, c.model, {_REQUEST_KEY}, {call} FROM {legs} GROUP BY 1, 2, 3, 4, 5, 6",
        "call_rollup_daily": f"SELECT {hour} / 24, c.model, {_REQUEST_KEY}, {call} FROM {legs}"
        " GROUP BY 1, 2, 3, 4, 5, 6",
        "latency_rollup_hourly": f"SELECT {hour}, coalesce(r.route, ''), (SELECT b.bucket FROM latency_buckets b"
        " WHERE b.upper_ms >= r.latency_ms ORDER BY b.upper_ms LIMIT 1), count(*) FROM requests r"
        " WHERE r.latency_ms IS NOT NULL GROUP BY 1, 2, 3",
    }
    return {table: sorted(tuple(row) for row in conn.execute(sql).fetchall()) for table, sql in queries.items()}


# the column that counts a rollup row's raw rows: a group emptied by deletes stays, at zero
_COUNT = {
    "request_rollup_hourly": 5,
    "request_rollup_daily": 5,
    "call_rollup_hourly": 6,
    "call_rollup_daily": 6,
    "latency_rollup_hourly": 3,
}


def rollups_of(conn) -> dict[str, list[tuple]]:
    """Every rollup table's non-empty groups, sorted."""
    out = {}
    for table, count in _COUNT.items():
        rows = [tuple(row) for row in conn.execute(f"SELECT * FROM {table}").fetchall()]
        assert all(row[count] >= 0 for row in rows), f"{table}: a group counted below zero"
        out[table] = sorted(row for row in rows if row[count] != 0)
    return out


def assert_rollups_match_raw_rows(conn) -> dict[str, list[tuple]]:
    """The rollups equal a fresh aggregation of the raw rows: keys and counts exactly, sums of floats to 1e-9
    (a batch adds in another order than SQL's sum). Returns the rollups."""
    kept, fresh = rollups_of(conn), _fresh(conn)
    for table in _COUNT:
        got, want = kept[table], fresh[table]
        assert [row[: _COUNT[table]] for row in got] == [row[: _COUNT[table]] for row in want], f"{table}: groups"
        for g, w in zip(got, want, strict=True):
            for a, b in zip(g, w, strict=True):
                if isinstance(a, float) or isinstance(b, float):
                    assert a == pytest.approx(b, rel=1e-9, abs=1e-9), (table, g, w)
                else:
                    assert a == b, (table, g, w)
    return kept
