"""The rollups kept per batch by the ledger's writer (gateway/ledger/rollups.py): on both engines they equal a fresh
aggregation of the raw rows after writes, re-writes and deletes, after a ledger of the trigger era is migrated, after
a writer killed mid-batch, and after a burst through the gateway; the migration that carries the remaining triggers
is what the generator writes now."""

from __future__ import annotations

import concurrent.futures
import os
import random
import signal
import subprocess
import sys
import textwrap

import openai
import pytest

from gateway.ledger import budget
from gateway.ledger.database import _migrations, connect, migrate, write_records
from gateway.ledger.dialect import POSTGRESQL, SQLITE, dialect_of
from gateway.ledger.records import CALL_COLUMNS, REQUEST_COLUMNS, RequestRecord, UpstreamCall, call_rows, request_row
from gateway.ledger.rollups import GENERATED, migration_sql
from tests.support.rollups import assert_rollups_match_raw_rows

BATCHED = 15  # the migration that left the rollups to the writer


@pytest.mark.parametrize("dialect", [SQLITE, POSTGRESQL], ids=["sqlite", "postgresql"])
def test_the_latest_trigger_migration_is_what_the_description_generates(dialect):
    """A figure added to records.py's measures needs a new migration (its ALTER TABLEs, then the regenerated
    triggers): `python -m gateway.ledger.rollups <dialect>` writes the triggers' part."""
    generated = [(version, name, sql) for version, name, sql in _migrations(dialect) if sql.startswith(GENERATED)]
    assert generated, "no migration carries the generated rollup triggers"
    version, name, sql = generated[-1]
    assert version == BATCHED
    assert sql == migration_sql(dialect.name), f"{dialect.migrations}/{name} is not what rollups.py generates"


def _migrate_to(conn, last: int) -> None:
    """The migrations up to `last`, with their bookkeeping rows (migrate() then applies the rest)."""
    postgres = dialect_of(conn) is POSTGRESQL
    create = (
        "CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL, applied_at real NOT NULL)"
    )
    with conn:
        conn.execute(create)
    for version, name, sql in _migrations(dialect_of(conn)):
        if version > last:
            break
        mark = f"INSERT INTO schema_migrations VALUES ({version}, '{name}', 0)"
        if postgres:
            with conn:
                conn.script(sql)
                conn.execute(mark)
        else:
            conn.executescript(f"BEGIN;\n{sql}\n;{mark};\nCOMMIT;")


def _records(rng: random.Random, n: int, start: float, prefix: str = "req") -> list[RequestRecord]:
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
                id=f"{prefix}-{i}",
                created_at=created,
                key_id=rng.choice([None, "k_a", "k_b"]),
                policy=rng.choice([None, "default", "reading"]),
                alias="selfroute",
                route=rng.choice([None, "rag", "long", "rag>long", "passthrough"]),
                reason="r",
                status=rng.choice([200, 200, 200, 400, 499, 502]),
                # every latency bucket's neighbourhood, bounds included (5, 10, ... 600000 ms) and past the last
                latency_ms=rng.choice([None, rng.uniform(1, 3000), rng.choice([5.0, 10.0, 600000.0, 7e5])]),
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


def _traffic(conn, seed: int, prefix: str = "req") -> list[RequestRecord]:
    """Writes; re-writes (a record submitted again with other figures and groups, one batch holding an id twice);
    deletes of legs and of whole requests outside the writer; on PostgreSQL an ad-hoc UPDATE of a request's group."""
    rng = random.Random(seed)
    records = _records(rng, 240, 1_700_000_000.0, prefix)
    for batch in range(0, len(records), 40):
        write_records(conn, records[batch : batch + 40])
    rewritten = _records(random.Random(seed + 1), 240, 1_700_050_000.0, prefix)
    again = rng.sample(rewritten, 80)
    write_records(conn, again[:40])
    write_records(conn, [*again[40:], rewritten[0], _records(random.Random(seed + 2), 1, 1_700_000_000.0, prefix)[0]])
    gone = rng.sample([r.id for r in records], 30)
    with conn:
        for request_id in gone[:10]:
            conn.execute("DELETE FROM upstream_calls WHERE request_id = ?", (request_id,))
        for request_id in gone[10:]:
            conn.execute("DELETE FROM upstream_calls WHERE request_id = ?", (request_id,))
            conn.execute("DELETE FROM requests WHERE id = ?", (request_id,))
        if dialect_of(conn) is POSTGRESQL:  # SQLite has no UPDATE triggers, before or after 015
            for request_id in rng.sample([r.id for r in records if r.id not in gone], 10):
                conn.execute("UPDATE requests SET route = 'moved', status = 503 WHERE id = ?", (request_id,))
    write_records(conn, [r for r in rewritten if r.id in gone[10:15]])  # back after their delete
    return records


def _location(engine: str, tmp_path, request, name: str = "l"):
    if engine == "sqlite":
        return tmp_path / f"{name}.sqlite3"
    return request.getfixturevalue("postgres_server").create_database()


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_rollups_equal_the_raw_rows_after_writes_rewrites_and_deletes(engine, tmp_path, request):
    conn = connect(_location(engine, tmp_path, request))
    try:
        assert BATCHED in migrate(conn)
        _traffic(conn, seed=7)
        kept = assert_rollups_match_raw_rows(conn)
        assert all(kept.values())  # every rollup saw traffic
        assert len({row[2] for row in kept["latency_rollup_hourly"]}) >= 8  # many buckets, the last one included
        assert 37 in {row[2] for row in kept["latency_rollup_hourly"]}
    finally:
        conn.close()


def _old_writer(conn, records: list[RequestRecord]) -> None:
    """The trigger era's writer, statement for statement (before 015): the triggers kept the rollups."""
    columns, marks = ", ".join(REQUEST_COLUMNS), ", ".join("?" * len(REQUEST_COLUMNS))
    if dialect_of(conn) is POSTGRESQL:
        sql = f"INSERT INTO requests ({columns}) VALUES ({marks}) ON CONFLICT (id) DO UPDATE SET " + ", ".join(
            f"{c} = excluded.{c}" for c in REQUEST_COLUMNS[1:]
        )
    else:
        sql = f"INSERT OR REPLACE INTO requests ({columns}) VALUES ({marks})"
    with conn:
        conn.executemany("DELETE FROM upstream_calls WHERE request_id = ?", [(r.id,) for r in records])
        conn.executemany(sql, [request_row(r) for r in records])
        legs = [row for r in records for row in call_rows(r)]
        conn.executemany(
            f"INSERT INTO upstream_calls ({', '.join(CALL_COLUMNS)}) VALUES ({', '.join('?' * len(CALL_COLUMNS))})",
            legs,
        )


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_a_ledger_of_the_trigger_era_keeps_its_rollups_through_the_migration(engine, tmp_path, request):
    """Rows written while triggers kept the rollups (014), then 015, then the writer re-writing and deleting some
    of those rows and adding new ones: the rollups equal the raw rows at each step."""
    conn = connect(_location(engine, tmp_path, request))
    try:
        _migrate_to(conn, BATCHED - 1)
        old = _records(random.Random(3), 200, 1_700_000_000.0, "old")
        for batch in range(0, len(old), 50):
            _old_writer(conn, old[batch : batch + 50])
        _old_writer(conn, _records(random.Random(4), 30, 1_700_090_000.0, "old"))  # re-written by the old writer
        before = assert_rollups_match_raw_rows(conn)
        assert migrate(conn)[0] == BATCHED  # and those after it
        assert assert_rollups_match_raw_rows(conn) == before  # the migration itself changes no figure
        write_records(conn, _records(random.Random(5), 60, 1_700_000_000.0, "old"))  # old ids, other groups
        _traffic(conn, seed=9, prefix="new")
        assert_rollups_match_raw_rows(conn)
    finally:
        conn.close()


_KILLED_WRITER = """
import os, signal, sys
from gateway.ledger import budget, rollups
from gateway.ledger.budget import Estimate, InFlight
from gateway.ledger.database import connect, write_records
from gateway.ledger.records import RequestRecord, UpstreamCall

conn = connect(sys.argv[1])
records = []
for i in range(50):
    r = RequestRecord(id=f"k-{i}", created_at=1_700_000_000.0 + i * 97, key_id="k_a", policy="p", alias="a",
                      route="rag", reason=None, status=200, latency_ms=20.0 + i, prompt_tokens=10, cost_usd=0.01)
    r.calls.append(UpstreamCall(model="cheap", route="rag", prompt_tokens=10, cost_usd=0.01, latency_ms=5.0))
    records.append(r)
budget.reserve_many(conn, [InFlight.of(r, Estimate()) for r in records])
write_records(conn, records[:20])
real = rollups.add

def add_then_die(conn, batch):
    real(conn, batch)  # the batch's rows and rollups written, not committed
    os.kill(os.getpid(), signal.SIGKILL)

rollups.add = add_then_die
write_records(conn, records[20:])
"""


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_a_writer_killed_mid_batch_leaves_rows_and_rollups_together(engine, tmp_path, request):
    """kill -9 inside a batch's transaction (its rows and rollup upserts sent, no commit): neither is there, the
    batch's requests are still in flight, and the next start charges them at their estimate (settle_abandoned)
    with their rollups."""
    location = _location(engine, tmp_path, request)
    conn = connect(location)
    migrate(conn)
    conn.close()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    child = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_KILLED_WRITER), str(location)],
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()
    conn = connect(location)
    try:
        assert conn.execute("SELECT count(*) FROM requests").fetchone()[0] == 20
        assert conn.execute("SELECT count(*) FROM requests_in_flight").fetchone()[0] == 30
        assert_rollups_match_raw_rows(conn)
        assert budget.settle_abandoned(conn, budget.abandoned(conn)) == 30  # what the writer's start-up sweep does
        assert conn.execute("SELECT count(*) FROM requests WHERE status = 0").fetchone()[0] == 30
        kept = assert_rollups_match_raw_rows(conn)
        assert sum(row[5] for row in kept["request_rollup_daily"]) == 50
        # a real record arriving after its estimate was charged replaces it, in the rollups too
        late = RequestRecord(
            id="k-25", created_at=1_700_000_000.0 + 25 * 97, key_id="k_a", policy="p", alias="a", route="rag",
            reason=None, status=200, latency_ms=3.0, prompt_tokens=10, cost_usd=0.5,
        )  # fmt: skip
        assert write_records(conn, [late]) == 1
        assert budget.settle_abandoned(conn, [budget.InFlight("k-26", 1_700_000_000.0, "k_a", "p", "a")]) == 0
        assert_rollups_match_raw_rows(conn)
    finally:
        conn.close()


def test_two_replicas_writing_the_same_key_and_day_keep_the_rollups(postgres_url, tmp_path):
    """Two replicas' writers on one PostgreSQL ledger, at once, on the same key, day and rollup rows, some
    request ids submitted by both (a replayed record): every request lands once and the rollups add up."""
    from gateway.ledger.writer import Ledger

    writers = [Ledger(postgres_url, dead_letter_dir=tmp_path / name, batch_size=16) for name in ("a", "b")]
    shared = _records(random.Random(11), 40, 1_700_000_000.0, "both")
    for record in shared:
        record.key_id, record.created_at = "k_a", 1_700_000_000.0 + (record.created_at % 86400) / 100
    batches = []
    for n in range(2):
        own = _records(random.Random(20 + n), 300, 1_700_000_000.0, f"w{n}")
        for record in own:
            record.key_id, record.created_at = "k_a", 1_700_000_000.0 + (record.created_at % 86400) / 100
        batches.append(own[:150] + shared + own[150:])
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda pair: [pair[0].submit(r) for r in pair[1]], zip(writers, batches, strict=True)))
    for writer in writers:
        writer.flush(timeout=60)
        writer.close()
        assert not writer.dead_letter_path.exists()
    conn = connect(postgres_url)
    try:
        assert conn.execute("SELECT count(*) FROM requests").fetchone()[0] == 640
        kept = assert_rollups_match_raw_rows(conn)
        assert sum(row[5] for row in kept["request_rollup_daily"]) == 640
    finally:
        conn.close()


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_a_burst_through_the_gateway_keeps_the_rollups_and_the_budget(engine, upstream, tmp_path, monkeypatch, request):
    """60 concurrent requests through the official client from two keys, one with a budget: the rollups equal the
    raw rows and the budgeted key stays within one reservation of its budget."""
    from gateway.server.auth import Authenticator
    from tests.support.gateway import running_gateway
    from tests.support.policies import DROP, make_policy

    monkeypatch.setenv("OPENAI_API_BASE", f"{upstream[0]}/v1")
    # $1 and $2 a thousand tokens: "a b c" with max_tokens 10 reserves $0.03 and costs $0.011
    priced = {"input_cost_per_mtok": 1000.0, "output_cost_per_mtok": 2000.0}
    kwargs = {"ledger_url": request.getfixturevalue("postgres_url")} if engine == "postgresql" else {}
    policy = make_policy(
        upstream[0],
        cheap={"model": "openai/sleep-1", **priced, "context_window": DROP},
        long={"model": "openai/dribble-long", **priced},
        passthrough=DROP,
    )
    with running_gateway(tmp_path, policy, auth=Authenticator(admin_key="sk-admin-test"), **kwargs) as (url, app):
        keys = app.state.gateway.keys
        _, limited = keys.create("limited", budget_usd=0.05)
        _, free = keys.create("free")

        def ask(i: int) -> int:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key=limited if i % 2 else free, max_retries=0)
            try:
                client.chat.completions.create(
                    model="openai/sleep-1", max_tokens=10, messages=[{"role": "user", "content": "a b c"}]
                )
                return 200
            except openai.APIStatusError as exc:
                return exc.status_code

        with concurrent.futures.ThreadPoolExecutor(30) as pool:
            statuses = list(pool.map(ask, range(60)))
        ledger = app.state.gateway.ledger
        ledger.flush()
        conn = connect(ledger.location)
        try:
            assert set(statuses) == {200, 429} and statuses.count(200) >= 31
            assert conn.execute("SELECT count(*) FROM requests").fetchone()[0] == 60
            kept = assert_rollups_match_raw_rows(conn)
            assert sum(row[5] for row in kept["request_rollup_daily"]) == 60
            spent = keys.spend(["limited"])["limited"]
            assert spent <= 0.05 + 0.03  # within one reservation ($0.03) of the budget
            answered = sum(1 for i, status in enumerate(statuses) if i % 2 and status == 200)
            assert answered >= 1 and spent == pytest.approx(answered * 0.011)
            assert conn.execute("SELECT count(*) FROM requests_in_flight").fetchone()[0] == 0
        finally:
            conn.close()
