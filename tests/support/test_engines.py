"""The shared engines: a real PostgreSQL (psycopg 3) and S3 (moto server) under LanceDB.

Also checks that the PostgreSQL ledger migrations (gateway/ledger/migrations/postgresql) build the same schema
as the SQLite ones and keep the same rollups, including re-written and deleted requests.
"""

from __future__ import annotations

import json
import random
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.engines import postgres_server, postgres_url, s3_bucket, s3_server  # noqa: F401  (fixtures)

REPO = Path(__file__).resolve().parents[2]
MIGRATIONS = [
    "001_ledger.sql",
    "002_hourly_rollups.sql",
    "003_daily_rollups.sql",
    "004_keys.sql",
    "005_cached_tokens.sql",
    "006_unpriced_calls.sql",
    "007_cache_rollups.sql",
    "008_rollup_cache_columns.sql",
    "009_key_admin_periods.sql",
    "010_learning.sql",
    "011_in_flight.sql",
    "014_policy_reloads.sql",
]
ROLLUPS = [
    "request_rollup_hourly",
    "call_rollup_hourly",
    "request_rollup_daily",
    "call_rollup_daily",
    "latency_rollup_hourly",
]


def sqlite_migrations_dir() -> Path:
    for candidate in (REPO / "gateway/ledger/migrations/sqlite", REPO / "gateway/migrations"):
        if (candidate / MIGRATIONS[0]).is_file():
            return candidate
    raise FileNotFoundError("no SQLite ledger migrations under gateway/ledger/migrations/sqlite or gateway/migrations")


POSTGRES_MIGRATIONS = REPO / "gateway/ledger/migrations/postgresql"


# ------------------------------------------------------------------------------------------------ PostgreSQL


def test_postgres_round_trip(postgres_server, postgres_url):
    import psycopg

    assert postgres_url.startswith(f"postgresql://postgres@127.0.0.1:{postgres_server.port}/db_")
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT current_setting('server_version_num')::int").fetchone()[0] >= 150000
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, name text NOT NULL, price double precision)")
        conn.cursor().executemany("INSERT INTO items VALUES (%s, %s, %s)", [(1, "a", 0.5), (2, "b", None)])
        conn.commit()
    with psycopg.connect(postgres_url) as conn:  # a second connection sees the committed rows
        assert conn.execute("SELECT id, name, price FROM items ORDER BY id").fetchall() == [
            (1, "a", 0.5),
            (2, "b", None),
        ]
    other = postgres_server.create_database()
    with psycopg.connect(other) as conn:  # each database starts empty
        assert conn.execute("SELECT to_regclass('items')").fetchone()[0] is None
    postgres_server.drop_database(other.rsplit("/", 1)[1])


# ------------------------------------------------------------------------------------------------ LanceDB on S3


def _lance_round_trip(uri: str, storage_options: dict | None) -> None:
    import lancedb

    db = lancedb.connect(uri, storage_options=storage_options)
    table = db.create_table(
        "chunks", data=[{"id": i, "text": f"chunk {i}", "vector": [float(i), 1.0, 0.0]} for i in range(5)]
    )
    table.add([{"id": 9, "text": "chunk 9", "vector": [9.0, 1.0, 0.0]}])
    assert table.count_rows() == 6
    assert [row["id"] for row in table.search([8.9, 1.0, 0.0]).limit(2).to_list()] == [9, 4]
    again = lancedb.connect(uri, storage_options=storage_options)  # a second connection reads it back
    assert again.list_tables().tables == ["chunks"]
    assert sorted(again.open_table("chunks").to_arrow().column("id").to_pylist()) == [0, 1, 2, 3, 4, 9]


def test_lancedb_on_s3_with_storage_options(s3_bucket):
    _lance_round_trip(s3_bucket.uri, s3_bucket.storage_options)
    keys = [o["Key"] for o in s3_bucket.client().list_objects_v2(Bucket=s3_bucket.bucket)["Contents"]]
    assert keys and all(k.startswith(f"{s3_bucket.prefix}/chunks.lance/") for k in keys)


def test_lancedb_on_s3_with_environment(s3_bucket, monkeypatch):
    for name, value in s3_bucket.env.items():
        monkeypatch.setenv(name, value)
    _lance_round_trip(s3_bucket.uri, None)


_LANCE_WORKER = r"""
import json, sys, time
from datetime import timedelta
from pathlib import Path
import lancedb, pyarrow as pa
a = json.loads(sys.argv[1])
table = lancedb.connect(a["uri"], storage_options=a["storage_options"]).open_table("t")
Path(a["ready"]).touch()
while not Path(a["go"]).exists():
    time.sleep(0.002)
errors = []
for start in range(a["lo"], a["hi"], a["step"]):
    rows = [{"id": i, "who": a["tag"], "vector": [float(i), 0.0]} for i in range(start, min(start + a["step"], a["hi"]))]
    data = pa.Table.from_pylist(rows, schema=table.schema)  # non-null id: a declared primary key requires it
    try:
        if a["mode"] == "add":
            table.add(data)
        else:
            table.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(
                data, timeout=timedelta(minutes=3))  # the default gives conflict retries 30 s: tight on a busy CPU
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
print(json.dumps(errors))
"""


def lance_schema(primary_key: bool):
    """id, who, vector; with primary_key, `id` is Lance's unenforced primary key (non-null, field metadata)."""
    import pyarrow as pa

    meta = {"lance-schema:unenforced-primary-key": "true"} if primary_key else None
    return pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=meta),
            pa.field("who", pa.string()),
            pa.field("vector", pa.list_(pa.float32(), 2)),
        ]
    )


@pytest.mark.parametrize(
    "mode",
    [
        "merge_insert_pk",
        "add",
        pytest.param(
            "merge_insert",
            marks=pytest.mark.xfail(
                strict=False,
                reason="Lance cannot see two concurrent merge_inserts inserting the same new key unless `id`"
                " is a declared (unenforced) primary key: both commit and the key is duplicated (lance-format/lance#4585,"
                " #8949; lancedb/lancedb#3377)",
            ),
        ),
    ],
)
def test_lancedb_on_s3_concurrent_writers(s3_bucket, tmp_path, mode):
    """Two processes commit to one table at once. Lance commits a manifest with a conditional PUT
    (If-None-Match: *), which moto honours (412 to the loser, who rebases and retries), so no commit is lost:
    no DynamoDB commit lock is needed. merge_insert keyed by `id` leaves no duplicate ids when `id` carries
    Lance's unenforced-primary-key metadata (the commit then carries a filter of inserted keys, checked
    against concurrent commits); without it, racing inserts of the same new id both land."""
    import lancedb

    schema = lance_schema(primary_key=mode == "merge_insert_pk")
    db = lancedb.connect(s3_bucket.uri, storage_options=s3_bucket.storage_options)
    db.create_table("t", schema=schema)
    n, step = 100, 10
    if mode == "add":  # appends of disjoint ids
        ranges, expected = [("A", 0, n), ("B", n, 2 * n)], set(range(2 * n))
    else:  # both upsert the same, new ids at the same time, batch by batch
        ranges, expected = [("A", 0, n), ("B", 0, n)], set(range(n))
    go = tmp_path / "go"
    procs = []
    for tag, lo, hi in ranges:
        args = dict(
            uri=s3_bucket.uri,
            storage_options=s3_bucket.storage_options,
            ready=str(tmp_path / tag),
            go=str(go),
            tag=tag,
            lo=lo,
            hi=hi,
            step=step,
            mode=mode,
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", _LANCE_WORKER, json.dumps(args)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    deadline = time.monotonic() + 120
    while not all((tmp_path / tag).exists() for tag, _, _ in ranges):
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        assert time.monotonic() < deadline, "workers did not start"
        time.sleep(0.01)
    go.touch()  # both start committing at once
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        assert json.loads(out.strip().splitlines()[-1]) == []

    table = lancedb.connect(s3_bucket.uri, storage_options=s3_bucket.storage_options).open_table("t")
    rows = table.to_arrow().to_pylist()
    ids = [row["id"] for row in rows]
    assert table.version == 1 + sum(-(-(hi - lo) // step) for _, lo, hi in ranges)  # every commit landed
    assert set(ids) == expected
    assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} duplicate ids"


# ------------------------------------------------------------------------------------------------ ledger migrations


def sqlite_ledger() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    conn.execute("PRAGMA foreign_keys=ON")
    for name in MIGRATIONS:  # as gateway's migrate(): one script, one transaction
        conn.executescript(f"BEGIN;\n{(sqlite_migrations_dir() / name).read_text()}\n;COMMIT;")
    return conn


def postgres_ledger(url: str, migrations: list[str] = MIGRATIONS):
    import psycopg

    conn = psycopg.connect(url)
    for name in migrations:
        conn.execute((POSTGRES_MIGRATIONS / name).read_text())  # no parameters: several statements are fine
        conn.commit()
    return conn


_TYPE_CLASS = {
    "integer": "integer",
    "bigint": "integer",
    "smallint": "integer",
    "double precision": "real",
    "real": "real",
    "numeric": "real",
    "text": "text",
    "character varying": "text",
}


def sqlite_schema(conn: sqlite3.Connection) -> dict:
    tables = [
        r[0]
        for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
        )
    ]
    schema = {}
    for table in tables:
        info = conn.execute(f"PRAGMA table_info({table})").fetchall()  # cid, name, type, notnull, default, pk
        pk = [r[1] for r in sorted((r for r in info if r[5]), key=lambda r: r[5])]
        columns = [
            (r[1], {"INTEGER": "integer", "REAL": "real", "TEXT": "text"}[r[2].upper()], bool(r[3]) or r[1] in pk)
            for r in info
        ]  # SQLite does not mark PK columns NOT NULL
        indexes, unique = {}, []
        for _, name, is_unique, origin, _ in conn.execute(f"PRAGMA index_list({table})").fetchall():
            cols = [r[2] for r in conn.execute(f"PRAGMA index_info({name})").fetchall()]
            if origin == "c":
                indexes[name] = (cols, bool(is_unique))
            elif origin == "u":
                unique.append(cols)
        schema[table] = {"columns": columns, "pk": pk, "indexes": indexes, "unique": sorted(unique)}
    return schema


def postgres_schema(conn) -> dict:
    tables = [
        r[0]
        for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' AND table_type = 'BASE TABLE'"
            " ORDER BY table_name"
        )
    ]
    schema = {}
    for table in tables:
        columns = [
            (name, _TYPE_CLASS[dtype], nullable == "NO")
            for name, dtype, nullable in conn.execute(
                "SELECT column_name, data_type, is_nullable FROM information_schema.columns"
                " WHERE table_schema = 'public' AND table_name = %s ORDER BY ordinal_position",
                (table,),
            )
        ]
        indexes, unique, pk = {}, [], []
        for name, is_unique, is_primary, constraint, cols in conn.execute(
            "SELECT c.relname, i.indisunique, i.indisprimary, con.contype,"
            " array(SELECT a.attname FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, n)"
            "       JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum ORDER BY k.n)::text[]"
            " FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " LEFT JOIN pg_constraint con ON con.conindid = i.indexrelid"
            " WHERE i.indrelid = %s::regclass",
            (table,),
        ):
            if is_primary:
                pk = list(cols)
            elif constraint == "u":
                unique.append(list(cols))
            else:
                indexes[name] = (list(cols), is_unique)
        schema[table] = {"columns": columns, "pk": pk, "indexes": indexes, "unique": sorted(unique)}
    return schema


def test_postgres_migrations_match_sqlite_schema(postgres_url):
    lite = sqlite_ledger()
    with postgres_ledger(postgres_url) as pg:
        assert postgres_schema(pg) == sqlite_schema(lite)
        assert set(postgres_schema(pg)) == {
            "requests",
            "upstream_calls",
            "latency_buckets",
            *ROLLUPS,
            "api_keys",
            "collection_owners",
            "rate_windows",
            "request_features",
            "labels",
            "requests_in_flight",
            "policy_reloads",
            "gateway_processes",
        }
        assert (
            pg.execute("SELECT bucket, upper_ms FROM latency_buckets ORDER BY bucket").fetchall()
            == lite.execute("SELECT bucket, upper_ms FROM latency_buckets ORDER BY bucket").fetchall()
        )


# A small ledger workload: requests with legs over three UTC days, NULL dimensions, NULL latencies, failed legs.
BASE = 1_767_225_600.0  # 2026-01-01T00:00:00Z
REQUEST_COLUMNS = [
    "id",
    "created_at",
    "key_id",
    "policy",
    "alias",
    "route",
    "reason",
    "status",
    "error",
    "stream",
    "latency_ms",
    "prompt_tokens",
    "completion_tokens",
    "cost_usd",
    "context_tokens",
    "counterfactual_cost_usd",
    "provenance",
    "cached_tokens",
    "cache_saving_usd",
]
CALL_COLUMNS = [
    "request_id",
    "created_at",
    "model",
    "route",
    "prompt_tokens",
    "completion_tokens",
    "cost_usd",
    "latency_ms",
    "error",
    "cached_tokens",
    "cache_saving_usd",
]


def _record(rng: random.Random, rid: str) -> tuple[tuple, list[tuple]]:
    created = BASE + rng.uniform(0, 3 * 86400)
    route = rng.choice(["rag", "long", "rag>long", "direct", None])
    calls = []
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        prompt = rng.randrange(0, 30000)
        # provider prompt cache: none, a read (a saving), or a write (Anthropic's dearer write: a negative saving)
        cached, saving = rng.choice(
            [(0, 0.0), (0, 0.0), (prompt // 2, round(rng.uniform(0, 0.01), 6)), (0, -round(rng.uniform(0, 0.002), 6))]
        )
        calls.append(
            (
                rid,
                created,
                rng.choice(["openai/gpt-4o-mini", "openai/gpt-4.1", "local/smollm2"]),
                rng.choice(["rag", "long", "direct"]),
                prompt,
                rng.randrange(0, 900),
                round(rng.uniform(0, 0.05), 6),
                rng.choice([None, rng.uniform(1, 200000)]),
                rng.choice([None, None, None, "timeout"]),
                cached,
                saving,
            )
        )
    request = (
        rid,
        created,
        rng.choice(["k_alice", "k_bob", None]),
        rng.choice(["default", "strict", None]),
        "selfroute-auto",
        route,
        rng.choice(["classifier", None]),
        rng.choice([200, 200, 200, 400, 502]),
        None,
        rng.randrange(2),
        rng.choice([None, rng.uniform(0, 700000), rng.uniform(0, 3000)]),
        sum(c[4] for c in calls),
        sum(c[5] for c in calls),
        sum(c[6] for c in calls),
        rng.randrange(0, 40000),
        round(rng.uniform(0, 0.05), 6),
        json.dumps({"chunks": []}),
        sum(c[9] for c in calls),
        sum(c[10] for c in calls),
    )
    return request, calls


def _workload(seed: int = 7) -> list[tuple[str, list]]:
    """('write', [(request, calls), ...]) batches and ('delete', [ids]) steps, with re-writes of existing ids."""
    rng = random.Random(seed)
    ids = [f"r{i:03d}" for i in range(150)]
    steps: list[tuple[str, list]] = [
        ("write", [_record(rng, rid) for rid in ids[i : i + 25]]) for i in range(0, len(ids), 25)
    ]
    # re-writes: a fresh record under an old id (new hour, route, status, legs ...), in batches like the writer's,
    # one batch re-writing the same id twice
    again = rng.sample(ids, 40)
    steps.append(("write", [_record(rng, rid) for rid in again[:20]]))
    steps.append(("write", [_record(rng, rid) for rid in again[20:]] + [_record(rng, again[0])]))
    # same dimensions, other amounts (the hourly row is replaced in place)
    request, calls = _record(rng, "r001")
    old = [rec for kind, batch in steps if kind == "write" for rec in batch if rec[0][0] == "r001"][-1][0]
    same = (old[0], old[1], old[2], old[3], old[4], old[5], old[6], old[7], *request[8:])
    steps.append(("write", [(same, [(c[0], old[1], *c[2:]) for c in calls])]))
    steps.append(("delete", rng.sample(ids, 15) + ["r001"]))
    steps.append(("write", [_record(rng, rid) for rid in ["r001", "r900"]]))  # back after its delete; a new one
    return steps


def _apply_sqlite(conn: sqlite3.Connection, steps) -> None:
    for kind, batch in steps:
        with conn:
            if kind == "delete":
                conn.executemany("DELETE FROM upstream_calls WHERE request_id = ?", [(rid,) for rid in batch])
                conn.executemany("DELETE FROM requests WHERE id = ?", [(rid,) for rid in batch])
                continue
            # gateway's SQLite writer, statement for statement
            conn.executemany("DELETE FROM upstream_calls WHERE request_id = ?", [(r[0],) for r, _ in batch])
            conn.executemany(
                f"INSERT OR REPLACE INTO requests ({', '.join(REQUEST_COLUMNS)})"
                f" VALUES ({', '.join('?' * len(REQUEST_COLUMNS))})",
                [r for r, _ in batch],
            )
            conn.executemany(
                f"INSERT INTO upstream_calls ({', '.join(CALL_COLUMNS)}) VALUES ({', '.join('?' * len(CALL_COLUMNS))})",
                [c for _, calls in batch for c in calls],
            )


def _apply_postgres(conn, steps, writer: str) -> None:
    insert = f"INSERT INTO requests ({', '.join(REQUEST_COLUMNS)}) VALUES ({', '.join(['%s'] * len(REQUEST_COLUMNS))})"
    upsert = insert + " ON CONFLICT (id) DO UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in REQUEST_COLUMNS[1:])
    calls_sql = (
        f"INSERT INTO upstream_calls ({', '.join(CALL_COLUMNS)}) VALUES ({', '.join(['%s'] * len(CALL_COLUMNS))})"
    )
    for kind, batch in steps:
        with conn.transaction():
            cur = conn.cursor()
            if kind == "delete":
                cur.executemany("DELETE FROM upstream_calls WHERE request_id = %s", [(rid,) for rid in batch])
                cur.executemany("DELETE FROM requests WHERE id = %s", [(rid,) for rid in batch])
                continue
            cur.executemany("DELETE FROM upstream_calls WHERE request_id = %s", [(r[0],) for r, _ in batch])
            if writer == "upsert":
                cur.executemany(upsert, [r for r, _ in batch])
            else:  # delete + insert, a record at a time (a batch may hold one id twice)
                for r, _ in batch:
                    cur.execute("DELETE FROM requests WHERE id = %s", (r[0],))
                    cur.execute(insert, r)
            calls = [c for _, cs in batch for c in cs]
            if calls:
                cur.executemany(calls_sql, calls)


def _rows(conn, table: str) -> list[tuple]:
    return sorted(tuple(row) for row in conn.execute(f"SELECT * FROM {table}").fetchall())


def _assert_same_rows(got: list[tuple], want: list[tuple], table: str) -> None:
    assert len(got) == len(want), table
    for g, w in zip(got, want):
        assert len(g) == len(w), table
        for a, b in zip(g, w):
            if isinstance(b, float) or isinstance(a, float):  # a fresh sum adds in another order
                assert a == pytest.approx(b, rel=1e-9, abs=1e-9), (table, g, w)
            else:  # keys and counts: exactly, and of the same type (ints stay ints)
                assert (type(a), a) == (type(b), b), (table, g, w)


@pytest.mark.parametrize("writer", ["upsert", "delete_insert"])
def test_postgres_rollups_match_sqlite(postgres_url, writer):
    steps = _workload()
    lite = sqlite_ledger()
    _apply_sqlite(lite, steps)
    with postgres_ledger(postgres_url) as pg:
        _apply_postgres(pg, steps, writer)
        assert _rows(pg, "requests") == _rows(lite, "requests")
        assert len(_rows(pg, "upstream_calls")) == len(_rows(lite, "upstream_calls"))
        for table in ROLLUPS:  # bit for bit: the triggers do the same float operations in the same order
            assert _rows(pg, table) == _rows(lite, table), table
        _assert_rollups_match_raw_rows(pg)
    assert any(row[5] == 0 for row in _rows(lite, "request_rollup_hourly"))  # emptied groups were exercised
    for table in ("request_rollup_hourly", "call_rollup_hourly", "request_rollup_daily", "call_rollup_daily"):
        assert any(row[13] > 0 for row in _rows(lite, table)), table  # cache hits were counted


def _assert_rollups_match_raw_rows(pg) -> None:
    """The trigger-kept rollups equal a fresh GROUP BY over the raw rows (ignoring groups emptied to zero)."""
    hourly = [r for r in _rows(pg, "request_rollup_hourly") if r[5] != 0]
    fresh = _rows(
        pg,
        "(SELECT floor(created_at / 3600)::bigint, coalesce(route, ''), coalesce(policy, ''),"
        " coalesce(key_id, ''), status, count(*), sum(prompt_tokens)::bigint,"
        " sum(completion_tokens)::bigint, sum(context_tokens)::bigint, sum(cost_usd),"
        " sum(counterfactual_cost_usd), coalesce(sum(latency_ms), 0), count(latency_ms),"
        " count(CASE WHEN cached_tokens > 0 THEN 1 END), sum(cached_tokens)::bigint,"
        " sum(cache_saving_usd) FROM requests GROUP BY 1, 2, 3, 4, 5) AS fresh",
    )
    _assert_same_rows(hourly, fresh, "request_rollup_hourly vs requests")
    calls = [r for r in _rows(pg, "call_rollup_hourly") if r[6] != 0]
    fresh = _rows(
        pg,
        "(SELECT floor(r.created_at / 3600)::bigint, c.model, coalesce(r.route, ''),"
        " coalesce(r.policy, ''), coalesce(r.key_id, ''), r.status, count(*), count(c.error),"
        " sum(c.prompt_tokens)::bigint, sum(c.completion_tokens)::bigint, sum(c.cost_usd),"
        " coalesce(sum(c.latency_ms), 0), count(c.latency_ms),"
        " count(CASE WHEN c.cached_tokens > 0 THEN 1 END), sum(c.cached_tokens)::bigint,"
        " sum(c.cache_saving_usd)"
        " FROM upstream_calls c JOIN requests r ON r.id = c.request_id GROUP BY 1, 2, 3, 4, 5, 6) AS f",
    )
    _assert_same_rows(calls, fresh, "call_rollup_hourly vs upstream_calls")
    daily = [r for r in _rows(pg, "request_rollup_daily") if r[5] != 0]
    fresh = _rows(
        pg,
        "(SELECT hour / 24, route, policy, key_id, status, sum(requests)::bigint,"
        " sum(prompt_tokens)::bigint, sum(completion_tokens)::bigint, sum(context_tokens)::bigint,"
        " sum(cost_usd), sum(counterfactual_cost_usd), sum(latency_ms_sum), sum(latency_count)::bigint,"
        " sum(cache_hits)::bigint, sum(cached_tokens)::bigint, sum(cache_saving_usd)"
        " FROM request_rollup_hourly GROUP BY 1, 2, 3, 4, 5 HAVING sum(requests) <> 0) AS f",
    )
    _assert_same_rows(daily, fresh, "request_rollup_daily vs hourly")
    daily = [r for r in _rows(pg, "call_rollup_daily") if r[6] != 0]
    fresh = _rows(
        pg,
        "(SELECT hour / 24, model, route, policy, key_id, status, sum(calls)::bigint,"
        " sum(errors)::bigint, sum(prompt_tokens)::bigint, sum(completion_tokens)::bigint, sum(cost_usd),"
        " sum(latency_ms_sum), sum(latency_count)::bigint, sum(cache_hits)::bigint,"
        " sum(cached_tokens)::bigint, sum(cache_saving_usd)"
        " FROM call_rollup_hourly GROUP BY 1, 2, 3, 4, 5, 6 HAVING sum(calls) <> 0) AS f",
    )
    _assert_same_rows(daily, fresh, "call_rollup_daily vs hourly")
    latency = [r for r in _rows(pg, "latency_rollup_hourly") if r[3] != 0]
    fresh = _rows(
        pg,
        "(SELECT floor(r.created_at / 3600)::bigint, coalesce(r.route, ''),"
        " (SELECT b.bucket FROM latency_buckets b WHERE b.upper_ms >= r.latency_ms"
        "  ORDER BY b.upper_ms LIMIT 1), count(*)"
        " FROM requests r WHERE r.latency_ms IS NOT NULL GROUP BY 1, 2, 3) AS f",
    )
    assert latency == fresh


def test_postgres_migration_008_backfills_the_cache_columns(postgres_url):
    """A ledger written before 008: its backfill gives the rollups the cache figures of the raw rows."""
    with postgres_ledger(postgres_url, MIGRATIONS[:-1]) as pg:
        _apply_postgres(pg, _workload(), "upsert")
        pg.execute((POSTGRES_MIGRATIONS / MIGRATIONS[-1]).read_text())
        pg.commit()
        _assert_rollups_match_raw_rows(pg)
        for table in ("request_rollup_hourly", "call_rollup_hourly", "request_rollup_daily", "call_rollup_daily"):
            assert any(row[13] > 0 for row in _rows(pg, table)), table


def test_postgres_rollups_follow_plain_updates(postgres_url):
    """Beyond SQLite (which has no UPDATE triggers): ad-hoc UPDATEs of requests and legs keep the rollups right,
    legs moving with their request's hour, route, policy, key and status."""
    steps = _workload()[:3]
    with postgres_ledger(postgres_url) as pg:
        _apply_postgres(pg, steps, "upsert")
        with pg.transaction():
            pg.execute(
                "UPDATE requests SET route = 'long', status = 503, created_at = created_at + 7200,"
                " latency_ms = CASE WHEN latency_ms IS NULL THEN 42 END"
                " WHERE id IN (SELECT request_id FROM upstream_calls LIMIT 10)"
            )
            pg.execute(
                "UPDATE upstream_calls SET cost_usd = cost_usd * 2, error = 'boom', latency_ms = NULL WHERE id % 3 = 0"
            )
            pg.execute(
                "UPDATE upstream_calls SET cached_tokens = prompt_tokens / 3, cache_saving_usd = 0.001 WHERE id % 4 = 1"
            )
            pg.execute("UPDATE upstream_calls SET cached_tokens = 0, cache_saving_usd = 0 WHERE id % 4 = 2")
            pg.execute(
                "UPDATE requests SET cached_tokens = prompt_tokens / 4, cache_saving_usd = 0.002"
                " WHERE id IN (SELECT request_id FROM upstream_calls WHERE id % 5 = 0)"
            )
        _assert_rollups_match_raw_rows(pg)
