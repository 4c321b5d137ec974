"""The rollup triggers generated from the one description of the rollups' figures (gateway/ledger/rollups.py):
the migration that carries them is what the generator writes now, and on both engines they keep the rollups
exactly as the hand-written triggers they replace (migration 008's) did."""

from __future__ import annotations

import random

import pytest

from gateway.ledger.database import _migrations, connect, migrate, write_records
from gateway.ledger.dialect import POSTGRESQL, SQLITE, dialect_of
from gateway.ledger.records import RequestRecord, UpstreamCall
from gateway.ledger.rollups import GENERATED, migration_sql

ROLLUP_TABLES = {
    "request_rollup_hourly": "hour, route, policy, key_id, status",
    "request_rollup_daily": "day, route, policy, key_id, status",
    "call_rollup_hourly": "hour, model, route, policy, key_id, status",
    "call_rollup_daily": "day, model, route, policy, key_id, status",
}


@pytest.mark.parametrize("dialect", [SQLITE, POSTGRESQL], ids=["sqlite", "postgresql"])
def test_the_latest_trigger_migration_is_what_the_description_generates(dialect):
    """A figure added to records.py's measures needs a new migration (its ALTER TABLEs, then the regenerated
    triggers): `python -m gateway.ledger.rollups <dialect>` writes the triggers' part."""
    generated = [(version, name, sql) for version, name, sql in _migrations(dialect) if sql.startswith(GENERATED)]
    assert generated, "no migration carries the generated rollup triggers"
    version, name, sql = generated[-1]
    assert sql == migration_sql(dialect.name), f"{dialect.migrations}/{name} is not what rollups.py generates"


def _migrate_to(conn, last: int) -> None:
    """The migrations up to `last` only (no bookkeeping: these ledgers are compared, never reopened)."""
    for version, _name, sql in _migrations(dialect_of(conn)):
        if version > last:
            break
        if dialect_of(conn) is POSTGRESQL:
            with conn:
                conn.script(sql)
        else:
            conn.executescript(f"BEGIN;\n{sql}\n;COMMIT;")


def _records(rng: random.Random, n: int, start: float) -> list[RequestRecord]:
    records = []
    for i in range(n):
        created = start + rng.uniform(0, 3 * 86400)  # three days: hours and days both roll up
        calls = [
            UpstreamCall(
                model=rng.choice(["cheap", "long", "alt"]),
                route=rng.choice(["rag", "long", None]),
                prompt_tokens=rng.randint(0, 5000),
                completion_tokens=rng.randint(0, 500),
                cost_usd=rng.random() / 7,
                latency_ms=rng.choice([None, rng.uniform(1, 900)]),
                error=rng.choice([None, None, "502 upstream"]),
                created_at=created,
                cached_tokens=rng.choice([0, 0, rng.randint(1, 4000)]),
                cache_saving_usd=rng.choice([0.0, rng.random() / 11]),
                unpriced=rng.random() < 0.1,
            )
            for _ in range(rng.randint(0, 3))
        ]
        records.append(
            RequestRecord(
                id=f"req-{i}",
                created_at=created,
                key_id=rng.choice([None, "k_a", "k_b"]),
                policy=rng.choice([None, "default", "reading"]),
                alias="selfroute",
                route=rng.choice([None, "rag", "long", "rag>long", "passthrough"]),
                reason="r",
                status=rng.choice([200, 200, 200, 400, 499, 502]),
                latency_ms=rng.choice([None, rng.uniform(1, 3000)]),
                prompt_tokens=sum(c.prompt_tokens for c in calls),
                completion_tokens=sum(c.completion_tokens for c in calls),
                cost_usd=sum(c.cost_usd for c in calls),
                context_tokens=rng.randint(0, 100000),
                counterfactual_cost_usd=rng.random() / 3,
                calls=calls,
                cached_tokens=sum(c.cached_tokens for c in calls),
                cache_saving_usd=sum(c.cache_saving_usd for c in calls),
            )
        )
    return records


def _traffic(conn, seed: int) -> None:
    """Writes, re-writes (a record submitted again with other figures and groups), deletes of legs and of whole
    requests, and an ad-hoc UPDATE of a request's group, in the same order on every ledger."""
    rng = random.Random(seed)
    records = _records(rng, 240, 1_700_000_000.0)
    for batch in range(0, len(records), 40):
        write_records(conn, records[batch : batch + 40])
    rewritten = _records(random.Random(seed + 1), 240, 1_700_050_000.0)
    write_records(conn, rng.sample(rewritten, 80))
    gone = rng.sample([r.id for r in records], 30)
    with conn:
        for request_id in gone[:10]:
            conn.execute("DELETE FROM upstream_calls WHERE request_id = ?", (request_id,))
        for request_id in gone[10:]:
            conn.execute("DELETE FROM upstream_calls WHERE request_id = ?", (request_id,))
            conn.execute("DELETE FROM requests WHERE id = ?", (request_id,))
        for request_id in rng.sample([r.id for r in records if r.id not in gone], 10):
            conn.execute("UPDATE requests SET route = 'moved', status = 503 WHERE id = ?", (request_id,))


def _rollups(conn) -> dict[str, list[tuple]]:
    return {
        table: [tuple(row) for row in conn.execute(f"SELECT * FROM {table} ORDER BY {key}").fetchall()]
        for table, key in ROLLUP_TABLES.items()
    }


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_generated_triggers_keep_the_rollups_exactly_as_the_hand_written_ones(engine, tmp_path, request):
    if engine == "sqlite":
        old_location, new_location = tmp_path / "old.sqlite3", tmp_path / "new.sqlite3"
    else:
        server = request.getfixturevalue("postgres_server")
        old_location, new_location = server.create_database(), server.create_database()
    old, new = connect(old_location), connect(new_location)
    try:
        _migrate_to(old, 12)  # 008's hand-written triggers
        assert 13 in migrate(new)
        for conn in (old, new):
            _traffic(conn, seed=7)
        before, after = _rollups(old), _rollups(new)
        assert all(before[t] for t in ROLLUP_TABLES)  # every rollup saw traffic
        assert after == before  # the same floats: the same operations in the same order
    finally:
        old.close()
        new.close()
