"""The ledger writer: migrations, batching off the request path, and nothing accepted is ever lost."""
from __future__ import annotations

import json
import sqlite3

from gateway.ledger.writer import Ledger

from gateway.ledger.database import connect
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
    ledger.close()


def test_records_submitted_after_close_are_written_at_once(tmp_path):
    path = tmp_path / "l.sqlite3"
    ledger = Ledger(path)
    ledger.submit(record("before", BASE, "rag", []))
    ledger.close()
    ledger.submit(record("after", BASE + 1, "long", []))  # e.g. a stream that ended during shutdown
    assert rows(path) == ["after", "before"]
