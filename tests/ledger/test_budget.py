"""Reservations in the ledger database (gateway/ledger/budget.py): atomic against concurrent reservers on SQLite and
PostgreSQL, replaced by the request's row in the writer's transaction, and rows left in flight by a dead process
charged at their estimate without being counted twice or as a success."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time

import pytest

from gateway.ledger import budget, reports, summary
from gateway.ledger.budget import BudgetExceeded, Estimate, InFlight, Limits, TokenLimitExceeded
from gateway.ledger.database import connect, write_records
from gateway.ledger.entry import RequestLedgerEntry
from gateway.ledger.pricing import PriceBook
from gateway.ledger.records import CLIENT_CLOSED, IN_FLIGHT
from gateway.ledger.writer import Ledger
from tests.support.ledger import CHEAP, call, record


@pytest.fixture(params=["sqlite", "postgresql"])
def location(request, tmp_path):
    if request.param == "sqlite":
        return tmp_path / "ledger.sqlite3"
    return request.getfixturevalue("postgres_url")


def _row(rid: str, key: str = "k", cost: float = 0.03, tokens: tuple[int, int] = (10, 10), **kwargs) -> InFlight:
    return InFlight(rid, time.time(), key, "default", "selfroute", False, tokens[0], tokens[1], cost, **kwargs)


def _concurrently(location, rows: list[InFlight], limits: Limits) -> tuple[list[str], list[BaseException]]:
    """Each row reserved from its own connection, all released at once."""
    start = threading.Barrier(len(rows))
    admitted, refused = [], []

    def one(row: InFlight) -> None:
        conn = connect(location)
        try:
            start.wait(timeout=30)
            budget.reserve(conn, row, limits)
            admitted.append(row.request_id)
        except (BudgetExceeded, TokenLimitExceeded) as exc:
            refused.append(exc)
        finally:
            conn.close()

    threads = [threading.Thread(target=one, args=(row,)) for row in rows]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return admitted, refused


def test_twenty_concurrent_reservations_stop_at_the_budget(location, tmp_path):
    """20 reservers at once, $0.03 each against $0.05: one gets in (0.03 fits in 0.05; 0.06 does not), never more:
    a reservation must fit in what is left (before round eleven a second one got in, since 0.03 < 0.05)."""
    Ledger(location, dead_letter_dir=tmp_path).close()
    admitted, refused = _concurrently(location, [_row(f"r{i}") for i in range(20)], Limits(budget_usd=0.05))
    assert len(admitted) == 1 and len(refused) == 19
    assert all(exc.code == "budget_exceeded" for exc in refused)
    conn = connect(location)
    try:
        assert sorted(r.request_id for r in budget.in_flight(conn, "k")) == sorted(admitted)
    finally:
        conn.close()


def test_twenty_concurrent_reservations_stop_at_the_tpm(location, tmp_path):
    Ledger(location, dead_letter_dir=tmp_path).close()
    admitted, refused = _concurrently(location, [_row(f"t{i}", tokens=(100, 30)) for i in range(20)], Limits(tpm=300))
    assert len(admitted) == 2  # 130 and 260 tokens fit in 300; 390 does not
    assert all(exc.code == "rate_limit_exceeded" and exc.retry_after >= 1 for exc in refused)


def test_the_requests_row_replaces_its_reservation_in_one_transaction(location, tmp_path):
    """Spend is recorded + reserved: while the request is in flight its estimate counts, once its row is written
    the actual cost counts, and never both."""
    Ledger(location, dead_letter_dir=tmp_path).close()
    conn = connect(location)
    try:
        budget.reserve(conn, _row("a", cost=0.04), Limits(budget_usd=0.05))
        with pytest.raises(BudgetExceeded):  # 0.04 reserved + 0.02 of a finished request: over 0.05
            write_records(conn, [record("done", time.time(), "rag", [call(CHEAP, "rag", 1, 1, 0.02)], key="k")])
            budget.reserve(conn, _row("b", cost=0.001), Limits(budget_usd=0.05))
        # "a" finishes at $0.01: its reservation goes with its row, and there is room again
        write_records(conn, [record("a", time.time(), "rag", [call(CHEAP, "rag", 1, 1, 0.01)], key="k")])
        assert budget.in_flight(conn) == []
        budget.reserve(conn, _row("b", cost=0.001), Limits(budget_usd=0.05))
        assert [r.request_id for r in budget.in_flight(conn)] == ["b"]
    finally:
        conn.close()


def test_rows_left_by_a_dead_process_are_charged_once_and_never_a_success(location, tmp_path):
    ledger = Ledger(location, dead_letter_dir=tmp_path)
    ledger.close()
    conn = connect(location)
    try:
        dead = _row(
            "dead", cost=0.03, owner=f"{budget.owner_id().rpartition(':')[0]}:999999999", client_request_id="mine-7"
        )
        alive = _row("alive", cost=0.02)  # this process: still being served
        elsewhere = _row("elsewhere", cost=0.02, owner="another-host:1")  # another host: only its lease ends it
        expired = _row("expired", cost=0.01, owner="another-host:2", expires_at=time.time() - 1)
        for row in (dead, alive, elsewhere, expired):
            budget.reserve(conn, row)
        found = budget.abandoned(conn)
        assert sorted(r.request_id for r in found) == ["dead", "expired"]
        assert budget.settle_abandoned(conn, found) == 2
        assert sorted(r.request_id for r in budget.in_flight(conn)) == ["alive", "elsewhere"]
        costs = reports.costs(conn, "route")
        assert costs["total"]["requests"] == 2 and costs["total"]["cost_usd"] == pytest.approx(0.04)
        assert reports.costs(conn, "route", reports.Filters.parse(status="ok"))["total"]["requests"] == 0
        assert reports.costs(conn, "route", reports.Filters.parse(status="0"))["total"]["requests"] == 2
        totals = summary.summary(conn, window=3600)["totals"]
        assert (totals["unfinished"], totals["errors"]) == (2, 2)
        row = conn.execute(
            "SELECT status, error, cost_usd, client_request_id FROM requests WHERE id = ?", ("dead",)
        ).fetchone()
        assert row["cost_usd"] == pytest.approx(0.03)
        assert row["client_request_id"] == "mine-7"  # found by the id the client logged (probe11: it was lost)
        assert row["status"] == IN_FLIGHT and "charged at its estimate" in row["error"]
        # the process was not dead after all (a request outliving its lease): its real row replaces the estimate
        write_records(conn, [record("expired", expired.created_at, "rag", [call(CHEAP, "rag", 1, 1, 0.002)], key="k")])
        costs = reports.costs(conn, "route")
        assert costs["total"]["requests"] == 2 and costs["total"]["cost_usd"] == pytest.approx(0.032)
        # and settling again never overwrites a real row
        budget.reserve(conn, _row("expired", cost=9.0, expires_at=time.time() - 1))  # a stale replayed row
        assert budget.in_flight(conn, "k") == [r for r in budget.in_flight(conn, "k") if r.request_id != "expired"]
    finally:
        conn.close()


def test_a_replayed_reservation_whose_request_has_its_row_is_dropped(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    Ledger(path).close()
    conn = connect(path)
    try:
        write_records(conn, [record("r", time.time(), "rag", [], key="k")])
        budget.reserve(conn, _row("r"))  # e.g. from the dead-letter file, after the row was written directly
        assert budget.in_flight(conn) == []
    finally:
        conn.close()


def test_reservations_handed_over_together_share_one_commit_and_keep_their_limits(location, tmp_path, monkeypatch):
    """Ledger.reserve_soon: rows without limits that wait together go in one transaction, each future is done only
    once its row is committed, and a row with limits in the same group is still checked on its own."""
    ledger = Ledger(location, dead_letter_dir=tmp_path)
    batches: list[int] = []
    real = budget.insert_in_flight
    monkeypatch.setattr(budget, "insert_in_flight", lambda conn, rows: (batches.append(len(rows)), real(conn, rows)))
    hold = threading.Event()

    def first():
        hold.wait(timeout=30)  # the others queue up behind this one
        return _row("first", key="a"), None

    try:
        futures = [ledger.reserve_soon(first)]
        futures += [ledger.reserve_soon(lambda i=i: (_row(f"p{i}", key="a"), None)) for i in range(10)]
        spent = [_row("s0", key="b", cost=0.06)]
        limited = ledger.reserve_soon(lambda: (_row("over", key="b"), Limits(budget_usd=0.05)))
        conn = connect(location)
        try:
            budget.reserve(conn, spent[0])  # key b has a reservation over its budget already
        finally:
            conn.close()
        hold.set()
        for future in futures:
            future.result(timeout=30)
        with pytest.raises(BudgetExceeded):
            limited.result(timeout=30)
        assert sum(batches) == 11 and max(batches) >= 10  # the ten rows that waited: one transaction
        conn = connect(location)
        try:
            assert {r.request_id for r in budget.in_flight(conn, "a")} == {"first", *(f"p{i}" for i in range(10))}
            assert [r.request_id for r in budget.in_flight(conn, "b")] == ["s0"]
        finally:
            conn.close()
    finally:
        ledger.close()


def test_a_reservation_the_database_does_not_take_is_dead_lettered_before_its_future_is_done(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    ledger = Ledger(path)
    try:
        conn = connect(path)
        conn.execute("DROP TABLE requests_in_flight")  # every insert now fails
        conn.commit()
        conn.close()
        ledger.reserve_soon(lambda: (_row("lost?"), None)).result(timeout=30)  # the request goes on
        assert '"request_id": "lost?"' in ledger.dead_letter_path.read_text()
    finally:
        ledger.close()
    ledger.close()
    done = Ledger(path).reserve_soon(lambda: (_row("after"), None))  # never started: a closed ledger too
    assert done.result(timeout=30) is None


def test_a_reservation_is_committed_at_once_while_the_writer_gathers_finished_rows(location, tmp_path):
    """One thread writes both kinds (Ledger._run): a finished row waits out the write window for others to join its
    transaction, but a request waits on its reservation's commit before its upstream call, so a reservation that
    arrives meanwhile is written at once, and the finished row still waits for its window."""
    ledger = Ledger(location, dead_letter_dir=tmp_path, write_window=20.0)
    try:
        ledger.submit(record("done", time.time(), "rag", [], key="k"))  # the writer gathers for 20 s from here
        time.sleep(0.2)
        started = time.monotonic()
        ledger.reserve_soon(lambda: (_row("next"), None)).result(timeout=30)
        assert time.monotonic() - started < 5
        conn = connect(location)
        try:
            assert [r.request_id for r in budget.in_flight(conn)] == ["next"]  # committed: another connection sees it
            assert conn.execute("SELECT count(*) FROM requests").fetchone()[0] == 0  # "done" still gathers others
        finally:
            conn.close()
        ledger.flush()
        conn = connect(location)
        try:
            assert [r[0] for r in conn.execute("SELECT id FROM requests").fetchall()] == ["done"]
        finally:
            conn.close()
    finally:
        ledger.close()


def test_a_record_the_database_refuses_takes_no_reservation_of_its_transaction_with_it(tmp_path):
    """In-flight rows and the finished rows due share one transaction; when the database refuses one record there,
    the in-flight rows still go in (and the requests go on), the other records too, and the refused one is kept in
    the dead-letter file."""
    path = tmp_path / "ledger.sqlite3"
    ledger = Ledger(path, write_window=0.0)
    conn = connect(path)
    conn.execute(
        "CREATE TRIGGER poison BEFORE INSERT ON requests WHEN NEW.reason = 'poison' "
        "BEGIN SELECT RAISE(ABORT, 'poisoned'); END"
    )
    conn.commit()
    conn.close()
    hold = threading.Event()
    try:
        first = ledger.reserve_soon(lambda: (hold.wait(timeout=30), (_row("first"), None))[1])  # the writer is busy
        time.sleep(0.2)
        ledger.submit(record("good", time.time(), "rag", [call(CHEAP, "rag", 10, 1, 0.001)], key="k"))
        ledger.submit(record("bad", time.time(), "rag", [], key="k", reason="poison"))
        second = ledger.reserve_soon(lambda: (_row("second"), None))  # the same cycle as the two records
        hold.set()
        assert first.result(timeout=30) is None and second.result(timeout=30) is None
        ledger.flush()
        conn = connect(path)
        try:
            assert [r[0] for r in conn.execute("SELECT id FROM requests").fetchall()] == ["good"]
            assert {r.request_id for r in budget.in_flight(conn)} == {"first", "second"}
        finally:
            conn.close()
        kept = ledger.dead_letter_path.read_text()
        assert '"id": "bad"' in kept and "poisoned" in kept and "second" not in kept
    finally:
        hold.set()
        ledger.close()


def test_a_reservation_is_not_held_up_by_a_finished_batch_waiting_on_another_processs_lock(tmp_path):
    """The writer thread writes the in-flight rows too, so its own connection waits on a SQLite file another process
    holds locked only as long as a request may (REQUEST_BUSY_TIMEOUT_S), then spools: a reservation queued behind a
    finished batch that waits on the lock is not held for SQLite's 30 s busy timeout. Both rows reach the database
    once the lock goes."""
    path = tmp_path / "ledger.sqlite3"
    ledger = Ledger(path, write_window=0.5)
    try:
        ledger.reserve_soon(lambda: (_row("warm"), None)).result(timeout=30)  # the writer's connection is open
        holder = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sqlite3, sys; c = sqlite3.connect(sys.argv[1], timeout=10); c.execute('BEGIN EXCLUSIVE');"
                " print('locked', flush=True); sys.stdin.read()",
                str(path),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
            ledger.submit(record("done", time.time(), "rag", [], key="k"))  # due in 0.5 s, then waits on the lock
            time.sleep(1.0)
            started = time.monotonic()
            ledger.reserve_soon(lambda: (_row("next"), None)).result(timeout=60)
            took = time.monotonic() - started
        finally:
            assert holder.stdin is not None
            holder.stdin.close()
            holder.wait(timeout=10)
        assert took < 10, took  # the 30 s busy timeout: about 29.5 s
        deadline = time.monotonic() + 30
        while True:  # spooled, then replayed once the file can be written again
            conn = connect(path)
            try:
                done = conn.execute("SELECT count(*) FROM requests WHERE id = 'done'").fetchone()[0]
                flying = {r.request_id for r in budget.in_flight(conn)}
            finally:
                conn.close()
            if (done, flying) == (1, {"warm", "next"}) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert (done, flying) == (1, {"warm", "next"})
    finally:
        ledger.close()


async def _reserved(entry: RequestLedgerEntry) -> None:
    """What a request does before its first upstream call (gateway.server.limits.reserve)."""
    await entry.reserve_soon(Estimate)


def _requests_row(location, request_id: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        conn = connect(location)
        try:
            found = conn.execute("SELECT status FROM requests WHERE id = ?", (request_id,)).fetchone()
            flying = [r.request_id for r in budget.in_flight(conn)]
        finally:
            conn.close()
        if found is not None or time.monotonic() > deadline:
            return (found[0] if found is not None else None), flying
        time.sleep(0.05)


def test_a_request_cancelled_while_its_in_flight_row_is_written_leaves_nothing_in_flight(
    location, tmp_path, monkeypatch
):
    """The client leaves while the writer thread's group commit holds the request's in-flight row
    (Ledger.reserve_async): its finished row reaches the writer only after that commit. Handed over at once, the
    writer's delete of the in-flight row ran beside the uncommitted insert and, on PostgreSQL, did not see it: the
    row stayed in flight, counted against its key, until its lease ran out."""
    ledger = Ledger(location, dead_letter_dir=tmp_path)
    inserted, release = threading.Event(), threading.Event()

    def held_open(conn, rows):  # the in-flight inserts, their transaction held open until the test lets it commit
        conn.executemany(budget._INSERT, [(*row.row(), row.request_id) for row in rows])
        inserted.set()
        release.wait(timeout=30)

    monkeypatch.setattr(budget, "insert_in_flight", held_open)
    entry = RequestLedgerEntry(ledger, PriceBook(), "gone", "default")

    async def request() -> None:
        task = asyncio.get_running_loop().create_task(_reserved(entry))
        assert await asyncio.to_thread(inserted.wait, 30)
        task.cancel()  # the client left
        with pytest.raises(asyncio.CancelledError):
            await task
        entry.finish(CLIENT_CLOSED, "client disconnected before the answer was ready")
        await asyncio.to_thread(ledger.flush, 3)  # what the writer is given meanwhile, it writes now
        release.set()

    try:
        asyncio.run(request())
        assert _requests_row(location, "gone") == (CLIENT_CLOSED, [])
    finally:
        release.set()
        ledger.close()


def test_a_request_cancelled_before_the_writer_takes_its_row_is_never_in_flight(location, tmp_path):
    ledger = Ledger(location, dead_letter_dir=tmp_path)
    hold = threading.Event()
    first = ledger.reserve_soon(lambda: (hold.wait(timeout=30), (_row("first"), None))[1])  # the writer is busy
    entry = RequestLedgerEntry(ledger, PriceBook(), "gone", "default")

    async def request() -> None:
        task = asyncio.get_running_loop().create_task(_reserved(entry))
        await asyncio.sleep(0.05)  # queued behind the first
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        entry.finish(CLIENT_CLOSED, "client disconnected before the answer was ready")

    try:
        asyncio.run(request())
        hold.set()
        first.result(timeout=30)
        assert _requests_row(location, "gone") == (CLIENT_CLOSED, ["first"])
    finally:
        hold.set()
        ledger.close()
