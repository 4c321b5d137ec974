"""The ledger writer: migrations, batching off the request path, and nothing accepted is ever lost."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import threading
import time
from dataclasses import asdict

import pytest

from gateway.ledger.database import IDENTITY_CHECK_S, connect
from gateway.ledger.writer import Ledger
from tests.support.ledger import BASE, CHEAP, call, record


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
    conn.execute(
        "CREATE TRIGGER poison BEFORE INSERT ON requests WHEN NEW.reason = 'poison' "
        "BEGIN SELECT RAISE(ABORT, 'poisoned'); END"
    )
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


def test_a_file_renamed_away_under_the_writer_is_reopened_at_its_path(tmp_path, caplog):
    """The writer checks once per batch (at most every IDENTITY_CHECK_S) that its path still names the file it has
    open: after a rename the next batch goes to a new file at the path, migrated as at start, with a warning
    (before: into the renamed file)."""
    path = tmp_path / "l.sqlite3"
    ledger = Ledger(path)
    ledger.submit(record("before", BASE, "rag", []))
    ledger.flush()
    path.rename(tmp_path / "moved.sqlite3")
    time.sleep(IDENTITY_CHECK_S)  # the path is looked at again at most this often
    ledger.submit(record("after", BASE + 1, "rag", [call(CHEAP, "rag", 10, 1, 0.001)]))
    ledger.flush()
    assert rows(path) == ["after"]
    assert "deleted or replaced while open" in caplog.text
    ledger.close()


def test_the_writer_thread_writes_in_flight_rows_on_its_own_connection(tmp_path):
    """Reservations without limits and finished rows go through one connection of the writer thread: SQLite drops a
    connection's page cache whenever another has committed since, so two connections on one thread re-read their
    pages every cycle (before, the in-flight rows used the request path's connection)."""
    from gateway.ledger.budget import InFlight

    ledger = Ledger(tmp_path / "l.sqlite3")
    for i in range(20):
        done = ledger.reserve_soon(lambda i=i: (InFlight(f"r{i}", BASE + i, None, None, None), None))
        done.result(timeout=10)
        ledger.submit(record(f"r{i}", BASE + i, "rag", [call(CHEAP, "rag", 10, 1, 0.001)]))
    ledger.flush()
    assert rows(tmp_path / "l.sqlite3") == sorted(f"r{i}" for i in range(20))
    assert ledger._request_conn is None  # never opened
    ledger.close()


def test_the_path_is_looked_at_once_per_interval_not_per_call(tmp_path, monkeypatch):
    """`broken` is asked per batch and per key lookup: it stats the path at most once per IDENTITY_CHECK_S (an
    os.stat is 2-9 us; before, one per call), and still sees a rename once the interval has passed."""
    path = tmp_path / "l.sqlite3"
    conn = connect(path)
    looked: list[str] = []
    real = os.stat

    def counting(target, *args, **kwargs):
        if str(target) == str(path):
            looked.append(str(target))
        return real(target, *args, **kwargs)

    monkeypatch.setattr(os, "stat", counting)
    start = time.monotonic()
    assert not any(conn.broken for _ in range(1000))
    if time.monotonic() - start < IDENTITY_CHECK_S:  # a very slow machine may take one more look
        assert len(looked) == 1
    path.rename(tmp_path / "moved.sqlite3")
    time.sleep(IDENTITY_CHECK_S)
    assert conn.broken and conn.broken  # and it stays so
    conn.close()


# ------------------------------------------------------------------------------------------------ PostgreSQL


def pg_ids(url: str) -> list[str]:
    import psycopg

    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute("SELECT id FROM requests ORDER BY id")]


def _wait(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_postgres_down_dead_letters_at_once_and_replays_when_it_is_back(postgres_server, postgres_url, tmp_path):
    """Records accepted while PostgreSQL is down are in the dead-letter file (fsynced) within a second of the
    failed write, not after a retry window, and are written into the database, once each, when it is back."""
    ledger = Ledger(postgres_url, dead_letter_dir=tmp_path)
    ledger.submit(record("before", BASE, "rag", [call(CHEAP, "rag", 10, 1, 0.001)]))
    ledger.flush()
    postgres_server.stop()
    try:
        started = time.monotonic()
        for i in range(20):
            ledger.submit(record(f"down{i:02d}", BASE + i, "rag", [call(CHEAP, "rag", 10, 1, 0.001)]))
        ledger.flush(timeout=30)
        kept = [json.loads(line)["record"]["id"] for line in ledger.dead_letter_path.read_text().splitlines()]
        assert sorted(kept) == [f"down{i:02d}" for i in range(20)]
        assert time.monotonic() - started < 5  # the old writer sat in a 30 s retry window first
        assert ledger.dead_letter_path.parent == tmp_path
        assert stat.S_IMODE(ledger.dead_letter_path.stat().st_mode) == 0o600
    finally:
        postgres_server.start()
    _wait(lambda: len(pg_ids(postgres_url)) == 21)  # replayed by the writer once the database answers again
    _wait(lambda: not ledger.has_dead_letters())
    ledger.close()
    assert pg_ids(postgres_url) == ["before", *(f"down{i:02d}" for i in range(20))]
    assert not list(tmp_path.glob("ledger.failed.jsonl*[0-9]"))


def test_a_dead_letter_file_is_replayed_at_start_up_once_even_when_replayed_twice(postgres_url, tmp_path):
    """A later process on the same data directory replays what an earlier one left (a kill -9 during an outage);
    records are upserts by request id, so lines written twice (or a replay cut short and run again) are one row."""
    first = Ledger(postgres_url, dead_letter_dir=tmp_path)
    lines = [
        json.dumps(
            {"error": "down", "record": asdict(record(f"x{i}", BASE + i, "rag", [call(CHEAP, "rag", 10, 1, 0.001)]))}
        )
        for i in range(5)
    ]
    first.dead_letter_path.write_text("\n".join(lines + lines[:3]) + "\n")
    # a replay interrupted after it moved the file aside but before it removed it
    (tmp_path / "ledger.failed.jsonl.replaying.1.1").write_text("\n".join(lines[2:]) + '\n{"torn')
    first.close()
    second = Ledger(postgres_url, dead_letter_dir=tmp_path)
    try:
        assert pg_ids(postgres_url) == [f"x{i}" for i in range(5)]
        assert not second.has_dead_letters()
        assert (tmp_path / "ledger.failed.jsonl.rejected").read_text() == '{"torn\n'  # kept, not replayed
        from gateway.ledger import reports

        conn = reports.connect_reader(postgres_url)
        try:
            total = reports.costs(conn, "route")["total"]
            assert total["requests"] == 5 and total["cost_usd"] == pytest.approx(0.005)  # no leg counted twice
        finally:
            conn.close()
    finally:
        second.close()


def test_two_postgres_writers_on_the_same_rollup_rows_lose_nothing(postgres_url, tmp_path):
    """Two replicas' writers commit overlapping batches (same hours, routes, keys: the same rollup rows) at once;
    a deadlock between them is retried, so every request lands once and the rollups add up."""
    from gateway.ledger import reports

    writers = [Ledger(postgres_url, dead_letter_dir=tmp_path / name, batch_size=32) for name in ("a", "b")]
    threads, expected = [], []
    for n, writer in enumerate(writers):
        batch = [
            record(
                f"w{n}-{i:03d}",
                BASE + (i * 37 % 7200),
                ["rag", "long"][i % 2],
                [call(CHEAP, "rag", 10, 1, 0.001)],
                key=["k_a", "k_b", "k_c"][i % 3],
            )
            for i in range(300)
        ]
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


def test_close_never_drops_what_a_stuck_writer_holds(tmp_path, monkeypatch):
    """A database that hangs past the shutdown's patience: the writer's batch and the queue go to the dead-letter
    file, and the next start replays them."""
    import gateway.ledger.writer as writer_module

    path = tmp_path / "l.sqlite3"
    ledger = Ledger(path, close_timeout=0.5)
    stuck = threading.Event()
    real = writer_module.write_records

    def hang(conn, records):
        stuck.set()
        time.sleep(3)
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(writer_module, "write_records", hang)
    ledger.submit(record("held", BASE, "rag", []))
    assert stuck.wait(10)
    for i in range(3):
        ledger.submit(record(f"queued{i}", BASE + i, "rag", []))
    ledger.close()
    kept = sorted({json.loads(line)["record"]["id"] for line in ledger.dead_letter_path.read_text().splitlines()})
    assert kept == ["held", "queued0", "queued1", "queued2"]
    monkeypatch.setattr(writer_module, "write_records", real)
    time.sleep(3)  # the stuck thread gives up (and dead-letters its batch again: replays are idempotent)
    Ledger(path).close()
    assert rows(path) == ["held", "queued0", "queued1", "queued2"]
