"""Ledger and report benchmark: one million synthetic requests, then the reports and the write cost.

    .venv/bin/python tests/benchmarks/bench_ledger.py --rows 1000000
    .venv/bin/python tests/benchmarks/bench_ledger.py --rows 1000000 --postgres   # the same on PostgreSQL

--postgres starts a throwaway PostgreSQL server (tests/support/engines.py: Debian's binaries, fsync off as in the tests),
bulk-loads the same rows with COPY into the raw tables, applies the later migrations, then times the reports and
the admin endpoints (no CLI or write-path figures).

Fills a ledger (fixed seed; 60% of the long legs read most of their prompt from the provider's prompt cache) with
the raw tables only (migrations 001, 005, 006, 011), applies the rest (their backfills build the rollups), then times:
the report functions, the CLI commands as subprocesses (Python start-up included), the admin endpoints through
a Starlette app, and the write path: Ledger.submit on the caller's thread and the writer's per-row cost (its
rollups included). Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from gateway.ledger import reports  # noqa: E402
from gateway.ledger.database import _migrations, connect, migrate, write_records  # noqa: E402
from gateway.ledger.records import RequestRecord, UpstreamCall
from gateway.ledger.summary import summary  # noqa: E402
from gateway.ledger.writer import Ledger

ROUTES = ["rag", "long", "rag>long", "direct", "passthrough", "none"]
ROUTE_WEIGHTS = [55, 22, 10, 6, 5, 2]
CHEAP, LONG = "openai/gpt-4o-mini", "openai/gpt-4.1"


# The raw tables without rollups or triggers: 001, plus the columns 005 (prompt cache) and 006 (unpriced) add to
# them, and 011's requests in flight (the writer settles them with each row). They depend on no rollup, so
# migrate() applies 002-004 and 007-010 afterwards (their backfills build the
# rollups) and the schema ends as the gateway's.
RAW_MIGRATIONS = (1, 5, 6, 11)
CACHE_READS = 0.6  # the share of long legs that read 90% of their prompt from OpenAI's prompt cache
REQUEST_LOADED = (
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
)
CALL_LOADED = (
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
)
INSERT_REQUESTS = f"INSERT INTO requests ({', '.join(REQUEST_LOADED)}) VALUES ({', '.join('?' * len(REQUEST_LOADED))})"
ROW_COUNTS = ("requests", "upstream_calls", "request_rollup_hourly", "call_rollup_hourly")
INSERT_CALLS = f"INSERT INTO upstream_calls ({', '.join(CALL_LOADED)}) VALUES ({', '.join('?' * len(CALL_LOADED))})"


def apply_raw_migrations(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL)")
    for version, name, sql in _migrations():
        if version in RAW_MIGRATIONS:
            conn.executescript(sql)
            conn.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)", (version, name, time.time()))
    conn.commit()


def synthetic(rows: int, days: float, keys: int, seed: int, end: float):
    """(request row, call rows) tuples in the order of REQUEST_LOADED and CALL_LOADED."""
    rng = random.Random(seed)
    cache_rng = random.Random(seed + 1)  # its own draws: the traffic is the one measured before caching was added
    start = end - days * 86400
    step = days * 86400 / rows
    key_ids = [f"k_{i:016x}" for i in range(keys)]
    policies = ["default", "strict", "cheap-first"]
    for i in range(rows):
        at = start + i * step + rng.random() * step
        route = rng.choices(ROUTES, ROUTE_WEIGHTS)[0]
        status = rng.choices([200, 400, 429, 502], [95, 2, 1, 2])[0]
        context = rng.randrange(2_000, 120_000)
        completion = rng.randrange(10, 600)
        counterfactual = context * 2e-6 + completion * 8e-6
        calls = []
        if route in ("rag", "rag>long", "direct", "passthrough"):
            prompt = rng.randrange(300, 4000) if route != "direct" else rng.randrange(50, 800)
            calls.append(
                (
                    CHEAP,
                    "rag" if route != "direct" else route,
                    prompt,
                    completion,
                    prompt * 0.15e-6 + completion * 0.6e-6,
                    rng.uniform(200, 2000),
                )
            )
            calls[-1] += (0, 0.0)
        if route in ("long", "rag>long"):
            # a cache read: 90% of the prompt at $0.50/M instead of $2/M; that long leg is the counterfactual
            cached = context * 9 // 10 if cache_rng.random() < CACHE_READS else 0
            saving = cached * 1.5e-6
            counterfactual -= saving
            calls.append((LONG, "long", context, completion, counterfactual, rng.uniform(1000, 12000), cached, saving))
        error = "upstream error" if status >= 500 else None
        rid = f"req_{i:08d}"
        request = (
            rid,
            at,
            rng.choice(key_ids),
            rng.choice(policies),
            "selfroute-auto",
            route,
            "classifier",
            status,
            error,
            0,
            sum(c[5] for c in calls) + rng.uniform(5, 100),
            sum(c[2] for c in calls),
            sum(c[3] for c in calls),
            sum(c[4] for c in calls),
            context,
            counterfactual,
            None,
            sum(c[6] for c in calls),
            sum(c[7] for c in calls),
        )
        call_rows = [
            (rid, at, m, r, p, c, cost, lat, error if j == len(calls) - 1 else None, ct, sv)
            for j, (m, r, p, c, cost, lat, ct, sv) in enumerate(calls)
        ]
        yield request, call_rows


def fill(path: Path, args) -> None:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")  # bulk load only; the gateway writes with synchronous=NORMAL
    apply_raw_migrations(conn)
    started = time.perf_counter()
    requests, calls = [], []
    with conn:
        for request, call_rows in synthetic(args.rows, args.days, args.keys, args.seed, args.end):
            requests.append(request)
            calls.extend(call_rows)
            if len(requests) >= 50_000:
                conn.executemany(INSERT_REQUESTS, requests)
                conn.executemany(INSERT_CALLS, calls)
                requests, calls = [], []
        if requests:
            conn.executemany(INSERT_REQUESTS, requests)
            conn.executemany(INSERT_CALLS, calls)
    print(f"bulk insert of {args.rows:,} requests (raw tables): {time.perf_counter() - started:.1f} s")
    started = time.perf_counter()
    applied = migrate(conn)
    print(f"migration {applied} (rollup backfill): {time.perf_counter() - started:.1f} s")
    counts = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ROW_COUNTS}
    print("rows:", ", ".join(f"{t} {n:,}" for t, n in counts.items()))
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def fill_postgres(url: str, args) -> None:
    """The same synthetic rows, COPYed into the raw tables; the later migrations then build the rollups."""
    from gateway.ledger.dialect import POSTGRESQL

    conn = connect(url)
    with conn:
        conn.execute(
            "CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at double precision NOT NULL)"
        )
        for version, name, sql in _migrations(POSTGRESQL):
            if version in RAW_MIGRATIONS:
                conn.script(sql)
                conn.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)", (version, name, time.time()))
    started = time.perf_counter()
    # one COPY at a time on a connection: the calls wait in memory (about 1.1 a request)
    pending_calls = []
    with conn.raw.transaction(), conn.raw.cursor() as cur:
        with cur.copy(f"COPY requests ({', '.join(REQUEST_LOADED)}) FROM STDIN") as copy:
            for request, call_rows in synthetic(args.rows, args.days, args.keys, args.seed, args.end):
                copy.write_row(request)
                pending_calls.extend(call_rows)
        with cur.copy(f"COPY upstream_calls ({', '.join(CALL_LOADED)}) FROM STDIN") as copy:
            for row in pending_calls:
                copy.write_row(row)
    print(f"COPY of {args.rows:,} requests (raw tables): {time.perf_counter() - started:.1f} s")
    started = time.perf_counter()
    applied = migrate(conn)
    print(f"migration {applied} (rollup backfill): {time.perf_counter() - started:.1f} s")
    conn.raw.autocommit = True
    conn.execute("VACUUM ANALYZE")
    counts = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ROW_COUNTS}
    print("rows:", ", ".join(f"{t} {n:,}" for t, n in counts.items()))
    conn.close()


def timed(label: str, fn, repeat: int) -> None:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    print(
        f"  {label:<58} first {times[0] * 1000:8.1f} ms   median {statistics.median(times) * 1000:8.1f} ms"
        f"   max {max(times) * 1000:8.1f} ms"
    )


def bench_reports(path: Path, repeat: int) -> None:
    print("report functions (gateway.ledger.reports, one read-only connection):")
    conn = reports.connect_reader(path)
    week = reports.Filters(since=time.time() - 7 * 86400 + 1234.5)  # not hour-aligned: rollup + raw edges
    timed("costs --by day (all time)", lambda: reports.costs(conn, "day"), repeat)
    timed("costs --by route (all time)", lambda: reports.costs(conn, "route"), repeat)
    timed("costs --by model (all time)", lambda: reports.costs(conn, "model"), repeat)
    timed("costs --by key (all time)", lambda: reports.costs(conn, "key"), repeat)
    timed("costs --by hour --since 7d", lambda: reports.costs(conn, "hour", week), repeat)
    timed(
        "costs --by day --route long --key k_0..03 (all time)",
        lambda: reports.costs(conn, "day", reports.Filters(route="long", key=f"k_{3:016x}")),
        repeat,
    )
    timed(
        "logs --route long (20 newest)",
        lambda: reports.list_requests(conn, reports.Filters(route="long"), limit=20),
        repeat,
    )
    page = reports.list_requests(conn, reports.Filters(route="long"), limit=100)
    timed(
        "logs --route long, page 2 by cursor",
        lambda: reports.list_requests(conn, reports.Filters(route="long"), limit=100, cursor=page["next_cursor"]),
        repeat,
    )
    timed(
        "logs --status error --since 7d",
        lambda: reports.list_requests(conn, reports.Filters.parse(status="error", since="7d"), limit=20),
        repeat,
    )
    timed("dashboard summary, 24h window", lambda: summary(conn, window=86400), repeat)
    timed("dashboard summary, 7d window", lambda: summary(conn, window=7 * 86400), repeat)
    timed("dashboard summary, 30d window (histogram percentiles)", lambda: summary(conn, window=30 * 86400), repeat)
    timed("dashboard summary, 1h window (minute buckets)", lambda: summary(conn, window=3600), repeat)
    conn.close()


def bench_cli(data_dir: Path, repeat: int) -> None:
    print("CLI as a subprocess (includes Python start-up and imports):")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for argv in (["costs", "--by", "day"], ["logs", "--route", "long"], ["costs", "--by", "model", "--since", "7d"]):
        cmd = [sys.executable, "-m", "gateway.cli", *argv, "--data-dir", str(data_dir)]
        timed(
            " ".join(["selfroute", *argv]),
            lambda: subprocess.run(cmd, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL),
            repeat,
        )
    timed(
        "python -c 'import gateway.cli' (start-up floor)",
        lambda: subprocess.run([sys.executable, "-c", "import gateway.cli"], check=True, env=env, cwd=ROOT),
        repeat,
    )


def bench_http(path, repeat: int, rows: int, dead_letter_dir: Path | None = None) -> None:
    import warnings

    with warnings.catch_warnings():  # starlette's note about httpx2 is not ours to act on
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    from gateway.server.auth import Authenticator

    print("admin endpoints (Starlette app in process, httpx test client, admin key):")
    from tests.support.ledger import admin_app

    app = admin_app(Ledger(path, dead_letter_dir=dead_letter_dir), Authenticator(["sk-user"], "sk-admin"))
    headers = {"Authorization": "Bearer sk-admin"}
    with TestClient(app) as client:
        for url in (
            "/v1/admin/costs?by=day",
            "/v1/admin/costs?by=model",
            "/v1/admin/costs?by=hour&since=7d",
            "/v1/admin/requests?route=long",
            "/v1/admin/requests?status=error&since=1d&limit=100",
            f"/v1/admin/requests/req_{rows // 2:08d}",
            "/v1/admin/summary?window=24h",
            "/v1/admin/summary?window=7d",
        ):

            def get(url=url):
                response = client.get(url, headers=headers)
                assert response.status_code == 200, response.text

            timed(f"GET {url}", get, repeat)


def _records(count: int, seed: int) -> list[RequestRecord]:
    out = []
    for request, call_rows in synthetic(count, 1, 20, seed, time.time()):
        (
            rid,
            at,
            key,
            policy,
            alias,
            route,
            reason,
            status,
            error,
            _,
            latency,
            p,
            c,
            cost,
            ctx,
            cf,
            _,
            cached,
            saved,
        ) = request
        out.append(
            RequestRecord(
                id=f"w{seed}_{rid}",
                created_at=at,
                key_id=key,
                policy=policy,
                alias=alias,
                route=route,
                reason=reason,
                status=status,
                error=error,
                latency_ms=latency,
                prompt_tokens=p,
                completion_tokens=c,
                cost_usd=cost,
                context_tokens=ctx,
                counterfactual_cost_usd=cf,
                cached_tokens=cached,
                cache_saving_usd=saved,
                provenance={"chunks": [{"document": "doc.txt", "chunk": 7, "score": 0.81}]},
                calls=[
                    UpstreamCall(
                        model=m,
                        route=r,
                        prompt_tokens=pt,
                        completion_tokens=ct,
                        cost_usd=co,
                        latency_ms=la,
                        error=er,
                        created_at=at,
                        cached_tokens=cc,
                        cache_saving_usd=sv,
                    )
                    for _, _, m, r, pt, ct, co, la, er, cc, sv in call_rows
                ],
            )
        )
    return out


def bench_writes(path: Path, count: int) -> None:
    from gateway.server.metrics import GatewayMetrics

    print(f"write path ({count:,} records):")
    records = _records(count, seed=11)
    for label, subscribers in (
        ("Ledger.submit (no subscriber)", []),
        ("Ledger.submit + GatewayMetrics.observe", [GatewayMetrics().observe]),
    ):
        ledger = Ledger(path)
        for callback in subscribers:
            ledger.subscribe(callback)
        ledger.start()
        per_call = []
        for rec in records:
            started = time.perf_counter()
            ledger.submit(rec)
            per_call.append(time.perf_counter() - started)
        ledger.flush(timeout=300)
        ledger.close()
        per_call.sort()
        print(
            f"  {label:<45} mean {statistics.mean(per_call) * 1e6:6.1f} us   p50 {per_call[len(per_call) // 2] * 1e6:6.1f} us"
            f"   p99 {per_call[int(len(per_call) * 0.99)] * 1e6:6.1f} us   (caller's thread)"
        )
        records = _records(count, seed=12)

    def writer_cost(target: Path, label: str, with_rollups: bool) -> None:
        conn = connect(target)
        if with_rollups:
            migrate(conn)
        batch = _records(count, seed=13 if with_rollups else 14)
        started = time.perf_counter()
        for i in range(0, len(batch), 256):  # the writer's batch size
            write_records(conn, batch[i : i + 256])
        elapsed = time.perf_counter() - started
        conn.close()
        print(f"  {label:<58} {elapsed / len(batch) * 1e6:6.1f} us/row (batches of 256, synchronous=NORMAL)")

    scratch = Path(tempfile.mkdtemp(prefix="bench_ledger_w_"))
    try:
        # since migration 015 the writer adds each batch to the rollups itself: there is no write without them
        writer_cost(scratch / "rollups.sqlite3", "writer, empty ledger, all migrations (batched rollups)", True)
    finally:
        shutil.rmtree(scratch)
    writer_cost(path, "writer, the 1M-request ledger, all migrations", True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--days", type=float, default=60.0, help="span of the synthetic traffic, ending now")
    parser.add_argument("--keys", type=int, default=20, help="distinct API keys")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--writes", type=int, default=20_000, help="records for the write-path measurements")
    parser.add_argument("--data-dir", type=Path, help="keep the ledger here (default: a temporary directory)")
    parser.add_argument("--reuse", action="store_true", help="reuse an existing ledger in --data-dir")
    parser.add_argument("--postgres", action="store_true", help="a throwaway PostgreSQL server instead of SQLite")
    args = parser.parse_args()
    args.end = time.time()
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="bench_ledger_"))
    data_dir.mkdir(parents=True, exist_ok=True)
    if args.postgres:
        return bench_postgres(args, data_dir)
    path = data_dir / "ledger.sqlite3"
    print(f"python {sys.version.split()[0]}, sqlite {sqlite3.sqlite_version}, {os.cpu_count()} CPUs, ledger {path}")
    try:
        if not (args.reuse and path.exists()):
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
            fill(path, args)
        print(f"ledger size: {path.stat().st_size / 1e6:.0f} MB")
        bench_reports(path, args.repeat)
        bench_http(path, args.repeat, args.rows)
        bench_cli(data_dir, max(2, args.repeat // 2))
        bench_writes(path, args.writes)
    finally:
        if args.data_dir is None:
            shutil.rmtree(data_dir)
    return 0


def bench_postgres(args, data_dir: Path) -> int:
    from tests.support.engines import start_postgres

    server = start_postgres()
    try:
        version = server.connect().execute("SHOW server_version").fetchone()[0]
        url = server.create_database("bench_ledger")
        print(f"python {sys.version.split()[0]}, PostgreSQL {version}, {os.cpu_count()} CPUs, ledger {url}")
        fill_postgres(url, args)
        with server.connect() as conn:
            size = conn.execute("SELECT pg_database_size('bench_ledger')").fetchone()[0]
        print(f"ledger size: {size / 1e6:.0f} MB")
        bench_reports(url, args.repeat)
        bench_http(url, args.repeat, args.rows, dead_letter_dir=data_dir)
    finally:
        server.stop()
        shutil.rmtree(server.root, ignore_errors=True)
        if args.data_dir is None:
            shutil.rmtree(data_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
