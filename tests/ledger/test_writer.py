"""The ledger writer: migrations, batching off the request path, and nothing accepted is ever lost."""
from __future__ import annotations

import json
import sqlite3
import stat
import threading
import time

from gateway.ledger.writer import Ledger

from tests.ledger_fixtures import BASE, CHEAP, call, record


def rows(path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [r[0] for r in conn.execute("SELECT id FROM requests ORDER BY id")]
    finally:
        conn.close()


def test_a_failing_record_does_not_take_its_batch_with_it(tmp_path):
    path = tmp_path / "l.sqlite3"
    ledger = Ledger(path)
    conn = sqlite3.connect(path)
    # a record SQLite refuses, the way a full disk or a constraint would
    conn.execute("CREATE TRIGGER poison BEFORE INSERT ON requests WHEN NEW.reason = 'poison' "
                 "BEGIN SELECT RAISE(ABORT, 'poisoned'); END")
    conn.commit()
    conn.close()
    good = [record(f"r{i}", BASE + i, "rag", [call(CHEAP, "rag", 10, 1, 0.001)]) for i in range(5)]
    bad = record("r-bad", BASE + 9, "rag", [call(CHEAP, "rag", 10, 1, 0.001)], reason="poison")
    for r in [*good[:2], bad, *good[2:]]:
        ledger.submit(r)
    ledger.flush()
    assert rows(path) == ["r0", "r1", "r2", "r3", "r4"]
    [kept] = [json.loads(line) for line in ledger.dead_letter_path.read_text().splitlines()]
    assert kept["record"]["id"] == "r-bad" and "poisoned" in kept["error"]
    assert stat.S_IMODE(ledger.dead_letter_path.stat().st_mode) == 0o600  # the records are as private as the ledger
    ledger.close()


def test_records_submitted_after_close_are_written_at_once(tmp_path):
    path = tmp_path / "l.sqlite3"
    ledger = Ledger(path)
    ledger.submit(record("before", BASE, "rag", []))
    ledger.close()
    ledger.submit(record("after", BASE + 1, "long", []))  # e.g. a stream that ended during shutdown
    assert rows(path) == ["after", "before"]


# ------------------------------------------------------------------------------------------------ PostgreSQL


def pg_ids(url: str) -> list[str]:
    import psycopg

    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute("SELECT id FROM requests ORDER BY id")]


def test_postgres_ledger_survives_a_server_restart(postgres_server, postgres_url, tmp_path):
    """Records accepted while PostgreSQL is down are retried until it is back: none lost, none dead-lettered."""
    ledger = Ledger(postgres_url, dead_letter_dir=tmp_path)
    ledger.submit(record("before", BASE, "rag", [call(CHEAP, "rag", 10, 1, 0.001)]))
    ledger.flush()
    postgres_server.stop()
    try:
        for i in range(20):
            ledger.submit(record(f"down{i:02d}", BASE + i, "rag", [call(CHEAP, "rag", 10, 1, 0.001)]))
        time.sleep(1.5)  # the writer has failed at least once by now and is backing off
    finally:
        postgres_server.start()
    ledger.flush(timeout=60)
    ledger.close()
    assert pg_ids(postgres_url) == ["before", *(f"down{i:02d}" for i in range(20))]
    assert not ledger.dead_letter_path.exists()


def test_postgres_ledger_keeps_what_it_cannot_write_in_the_dead_letter_file(postgres_server, postgres_url, tmp_path):
    ledger = Ledger(postgres_url, dead_letter_dir=tmp_path, retry_delays=(0.1, 0.1))
    postgres_server.stop()
    try:
        ledger.submit(record("lost?", BASE, "rag", [call(CHEAP, "rag", 10, 1, 0.001)]))
        ledger.flush(timeout=30)
    finally:
        postgres_server.start()
    ledger.close()
    [kept] = [json.loads(line) for line in ledger.dead_letter_path.read_text().splitlines()]
    assert kept["record"]["id"] == "lost?" and ledger.dead_letter_path.parent == tmp_path
    assert pg_ids(postgres_url) == []


def test_two_postgres_writers_on_the_same_rollup_rows_lose_nothing(postgres_url, tmp_path):
    """Two replicas' writers commit overlapping batches (same hours, routes, keys: the same rollup rows) at once;
    a deadlock between them is retried, so every request lands once and the rollups add up."""
    from gateway.ledger import reports

    writers = [Ledger(postgres_url, dead_letter_dir=tmp_path / name, batch_size=32) for name in ("a", "b")]
    threads, expected = [], []
    for n, writer in enumerate(writers):
        batch = [record(f"w{n}-{i:03d}", BASE + (i * 37 % 7200), ["rag", "long"][i % 2],
                        [call(CHEAP, "rag", 10, 1, 0.001)], key=["k_a", "k_b", "k_c"][i % 3]) for i in range(300)]
        expected += [r.id for r in batch]
        threads.append(threading.Thread(target=lambda w=writer, b=batch: [w.submit(r) for r in b]))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for writer in writers:
        writer.flush(timeout=60)
        writer.close()
        assert not writer.dead_letter_path.exists()
    assert pg_ids(postgres_url) == sorted(expected)
    conn = reports.connect_reader(postgres_url)
    try:
        assert reports.costs(conn, "route")["total"]["requests"] == 600
        assert reports.costs(conn, "model")["groups"][0]["calls"] == 600
    finally:
        conn.close()
