"""The ledger's off-request writer, and what keeps the ledger whole when its database is not there.

Requests hand records to `Ledger.submit`, which only enqueues; a writer thread batches them into the database so
the ledger never sits on a request's critical path. The database is a SQLite file or a shared PostgreSQL (several
gateway replicas writing to one ledger).

One thread writes both kinds of row: a request's in-flight row (its reservation, `reserve_soon`/`reserve_async`)
at once, since the request waits on that commit, and finished rows gathered over a short window, in the same
transaction as the in-flight rows when both are due; one thread and one connection, no second writer contending
for SQLite's lock or the GIL.

Durability: before its first upstream call a request is recorded as in flight (`Ledger.reserve`, synchronous,
gateway/ledger/budget.py), so a process killed with kill -9 leaves a record of the spend it had started. A batch
the database does not take goes to the dead-letter file at once, appended and fsynced (a deadlock between two
replicas' writers is retried first), and so does an in-flight row that cannot be written. The writer replays that
file into the database at start-up and, while it is not empty, every few seconds until the database takes it:
records are upserts by request id, so a record replayed twice (a kill -9 mid-replay) is still one row. Closing
the ledger writes or dead-letters everything submitted; nothing is dropped.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import fcntl
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gateway.ledger import budget
from gateway.ledger.budget import InFlight, Limits
from gateway.ledger.database import REQUEST_BUSY_TIMEOUT_S, connect, migrate, reopened, write_records
from gateway.ledger.dialect import UNAVAILABLE_MESSAGE, LedgerConnection, database_error_types, is_postgres
from gateway.ledger.errors import Unavailable
from gateway.ledger.records import RequestRecord, record_from_dict
from gateway.settings import private_file

logger = logging.getLogger(__name__)


# seconds to wait before each retry of a batch that lost a deadlock or serialization conflict to another replica's
# writer (PostgreSQL aborts one of them); any other failure sends the batch to the dead-letter file at once
RETRY_DELAYS = (0.05, 0.2, 0.5)
DEAD_LETTER_FILE = "ledger.failed.jsonl"  # where a PostgreSQL ledger's unwritable records go (in dead_letter_dir)
REPLAY_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0)  # after a failure: how long until the database is tried again
SWEEP_INTERVAL_S = 30.0  # how often abandoned in-flight rows are looked for
CLOSE_TIMEOUT_S = 30.0
# how long the writer lets finished rows gather before it writes a batch: one SQLite transaction costs ~190 us of CPU
# a row when it holds one row and ~80 us when it holds 16 or more (the in-process figures in BENCHMARKS.md section 1,
# round six). Nobody waits on it: a request's spend is held by its in-flight row until its finished row replaces it,
# and flush() and close() cut the wait short
WRITE_WINDOW_S = 0.01
_RETRYABLE_SQLSTATES = {"40P01", "40001"}  # deadlock_detected, serialization_failure


class Ledger:
    """Owns the ledger database; `submit` is non-blocking, a writer thread persists in batches.

    `location` is a SQLite file path or a postgresql:// URL. A PostgreSQL ledger keeps its dead-letter file in
    `dead_letter_dir` (the gateway's data directory), a SQLite one next to the database file.
    """

    def __init__(
        self,
        location: str | Path,
        *,
        batch_size: int = 256,
        dead_letter_dir: str | Path | None = None,
        retry_delays: tuple[float, ...] = RETRY_DELAYS,
        replay_backoff: tuple[float, ...] = REPLAY_BACKOFF_S,
        close_timeout: float = CLOSE_TIMEOUT_S,
        write_window: float = WRITE_WINDOW_S,
    ):
        self.location: str | Path = location if is_postgres(location) else Path(location)
        self.path: Path | None = None if is_postgres(location) else Path(location)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            private_file(self.path)
        if self.path is None and dead_letter_dir is None:
            raise ValueError("a PostgreSQL ledger needs a local dead_letter_dir for the records it cannot write")
        self._dead_letter_dir = Path(dead_letter_dir) if dead_letter_dir is not None else None
        self._retry_delays = retry_delays
        self._backoff = replay_backoff
        self._close_timeout = close_timeout
        self._errors, self._transient = database_error_types()
        self._batch_size = batch_size
        self._write_window = write_window
        # set by flush(), close() and a reservation that arrives while the writer gathers: it writes now
        self._wake = threading.Event()
        # SimpleQueue: a put on the request path is one C call, no Condition to notify. It carries finished rows
        # and reservations both: one thread writes a cycle's new in-flight rows and finished rows in one transaction
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # a reservation is queued / the writer is waiting out its write window: each side sets its own flag before
        # it reads the other's, so a reservation never waits out the window (and no Event is set per row)
        self._reservation_queued = False
        self._gathering = False
        self._taking = threading.Lock()  # a Reservation's state (taken by the writer, or skipped)
        self._subscribers: list[Callable[[RequestRecord], None]] = []
        self._thread: threading.Thread | None = None
        self._closed = False
        self._current: list[RequestRecord] = []  # the batch the writer thread holds (dead-lettered if it hangs)
        self._current_flights: list[tuple[InFlight, Reservation]] = []  # and the in-flight rows it writes with it
        # the database failed lately: until this monotonic moment, writes go to the dead-letter file untried
        self._down_until = 0.0
        self._failures = 0
        self._next_replay = 0.0
        self._replay_due = False  # a write failed since the last replay (a refused record alone waits for a restart)
        self._next_sweep = 0.0
        self._state_lock = threading.Lock()
        self._request_lock = threading.Lock()  # the request path's own connection (reservations)
        self._request_conn: LedgerConnection | None = None
        conn = connect(self.location)
        try:
            migrate(conn)
            self._recover(conn)
        finally:
            conn.close()

    # -- the request path -----------------------------------------------------------------------
    def subscribe(self, callback: Callable[[RequestRecord], None]) -> None:
        """Call `callback(record)` for every submitted record (from the submitting thread)."""
        self._subscribers.append(callback)

    def reserve(self, row: InFlight, limits: Limits | None = None) -> None:
        """Record a request as in flight before its first upstream call, with its reservation (blocking: call it
        from a worker thread). With `limits`, the key's budget and TPM are checked against what is recorded and
        reserved, atomically with the insert: budget.BudgetExceeded / TokenLimitExceeded. An unreachable database
        is Unavailable for a request with limits (they cannot be checked); without limits its row goes to the
        dead-letter file, fsynced, and the request goes on."""
        limited = limits is not None and limits.any
        if not limited and self._database_down():
            self._dead_letter([{"error": "ledger database unavailable", "in_flight": row.to_dict()}])
            return
        try:
            with self._request_lock:
                budget.reserve(self._request_connection(), row, limits)
        except self._errors as exc:
            with self._request_lock:
                self._drop_request_conn()
            transient = isinstance(exc, self._transient)
            if transient:
                self._note_failure()
            logger.warning("ledger could not record request %s in flight (%s)", row.request_id, exc)
            if limited and transient:
                raise Unavailable(UNAVAILABLE_MESSAGE, code="ledger_unavailable") from None
            self._dead_letter([{"error": str(exc), "in_flight": row.to_dict()}])

    def reserve_soon(self, prepare: Callable[[], tuple[InFlight, Limits | None]]) -> concurrent.futures.Future[None]:
        """reserve(*prepare()) on the ledger's writer thread; the future is done when reserve() would have
        returned (the row committed or dead-lettered) or raised. Rows without limits that arrive together go in one
        transaction with the finished rows waiting then (a group commit), so concurrent requests share one commit,
        one thread hop each and no worker pool; a row with limits keeps its own check-and-insert, before that
        transaction. A request that awaits the future before its first upstream call has reserve()'s guarantee.
        `prepare` runs on that thread too (the estimate counts tokens). From the event loop, reserve_async is the
        cheaper way to the same."""
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._hand_over(Reservation(prepare, future))
        return future

    def reserve_async(self, prepare: Callable[[], tuple[InFlight, Limits | None]]) -> Reservation:
        """reserve_soon for a request on the running event loop: `await reservation.future` (an asyncio future, set
        with the others of its group in one call_soon_threadsafe: no concurrent.futures.Future, Condition and
        wrap_future per request). Its request's finished row goes through submit_after(reservation, record)."""
        reservation = Reservation(prepare, asyncio.get_running_loop().create_future(), asyncio.get_running_loop())
        self._hand_over(reservation)
        return reservation

    def _hand_over(self, reservation: Reservation) -> None:
        if self._closed:  # shutting down: no thread to hand it to
            self._reserve_now([reservation])
            return
        if self._thread is None:
            with self._state_lock:
                if self._thread is None:
                    self.start()
        self._queue.put(reservation)
        self._reservation_queued = True
        if self._gathering and not self._wake.is_set():  # the writer waits out its write window: write now
            self._wake.set()

    def submit_after(self, reservation: Reservation | None, record: RequestRecord) -> None:
        """submit(record) once its request's reservation is settled. A request cancelled (its client left) while
        the writer was writing its in-flight row would otherwise queue its finished row before that commit (and a
        row with limits is written on another connection: on PostgreSQL a delete beside an uncommitted insert does
        not see it, and the row stayed in flight, counted against its key, until its lease ran out). One the writer
        has not taken yet is never written: its finished row alone goes in."""
        if reservation is not None and reservation.loop is not None:
            with self._taking:
                if reservation.state == _WAITING:
                    reservation.state = _SKIPPED
                elif reservation.state == _TAKEN:
                    reservation.then = record  # the writer submits it once the row is committed
                    return
        self.submit(record)

    def _take(self, reservation: Reservation) -> bool:
        """Whether the writer writes this one: not when its request was cancelled (or finished) meanwhile."""
        if reservation.loop is None:
            return reservation.future.set_running_or_notify_cancel()
        with self._taking:
            if reservation.state != _WAITING or reservation.future.cancelled():
                reservation.state = _SKIPPED
                return False
            reservation.state = _TAKEN
            return True

    def _reserve_now(self, items: list[Reservation]) -> None:
        """A group of reservations: each with limits on its own, those without in one transaction (a closed
        ledger's, on the caller's thread)."""
        plain, settled = self._prepare(items)
        if plain:
            try:
                self._reserve_plain([row for row, _ in plain])
            except BaseException as exc:
                settled += [(item, exc) for _, item in plain]
            else:
                settled += [(item, None) for _, item in plain]
        self._settle(settled)

    def _prepare(
        self, items: list[Reservation]
    ) -> tuple[list[tuple[InFlight, Reservation]], list[tuple[Reservation, BaseException | None]]]:
        """The reservations still wanted, prepared: those with limits checked and written now, each on its own
        (settled); those without returned with their rows, for one transaction."""
        plain: list[tuple[InFlight, Reservation]] = []
        settled: list[tuple[Reservation, BaseException | None]] = []
        for item in items:
            if not self._take(item):
                continue
            try:
                row, limits = item.prepare()
                if limits is not None and limits.any:
                    self.reserve(row, limits)
                    settled.append((item, None))
                else:
                    plain.append((row, item))
            except BaseException as exc:  # to the request that asked; this thread goes on
                settled.append((item, exc))
        return plain, settled

    def _settle(self, settled: list[tuple[Reservation, BaseException | None]]) -> None:
        """Each reservation's future; one call into each event loop for all of its own; then the finished rows of
        requests that ended while their row was being written (submit_after)."""
        then: list[RequestRecord] = []
        loops: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[None], BaseException | None]]] = {}
        with self._taking:
            for item, _ in settled:
                item.state = _SETTLED
                if item.then is not None:
                    then.append(item.then)
                    item.then = None
        for item, exc in settled:
            if item.loop is None:
                if exc is None:
                    item.future.set_result(None)
                else:
                    item.future.set_exception(exc)
            else:
                loops.setdefault(item.loop, []).append((item.future, exc))
        for loop, results in loops.items():
            with suppress(RuntimeError):  # its loop is closed: nobody waits any more
                loop.call_soon_threadsafe(_resolve, results)
        for record in then:
            self.submit(record)

    def _reserve_plain(self, rows: list[InFlight]) -> None:
        """reserve() for rows without limits, in one transaction, on the request path's connection (a closed
        ledger's, on the caller's thread): what the database does not take goes to the dead-letter file, fsynced,
        and the requests go on."""
        with self._request_lock:
            self._request_conn = self._reserve_on(self._request_conn, rows)

    def _reserve_on(self, conn: Any, rows: list[InFlight]) -> Any:
        """_reserve_plain on `conn` (connecting first when it is None or broken); returns the connection to reuse
        (None after a failure). The writer thread passes its own: a SQLite connection drops its whole page cache whenever
        another connection has committed since its last transaction, so one thread alternating two connections
        re-reads its pages every cycle."""
        if self._database_down():
            self._dead_letter([{"error": "ledger database unavailable", "in_flight": row.to_dict()} for row in rows])
            return conn
        try:
            conn = self._reopened(conn)
            budget.reserve_many(conn, rows)
        except self._errors as exc:
            if conn is not None:
                with suppress(*self._errors):
                    conn.close()
            if isinstance(exc, self._transient):
                self._note_failure()
            logger.warning("ledger could not record %d requests in flight (%s)", len(rows), exc)
            self._dead_letter([{"error": str(exc), "in_flight": row.to_dict()} for row in rows])
            return None
        return conn

    def submit(self, record: RequestRecord) -> None:
        for callback in self._subscribers:
            try:
                callback(record)
            except Exception:  # a metrics bug must never fail a request
                logger.exception("ledger subscriber failed")
        if self._closed:  # a stream that ends after shutdown: write it now rather than to a dying thread
            conn = self._write(None, [record])
            if conn is not None:
                conn.close()
            return
        if self._thread is None:
            self.start()
        self._queue.put(record)

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        self._closed = False
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="selfroute-ledger", daemon=True)
            self._thread.start()

    def flush(self, timeout: float = 10.0) -> None:
        """Block until everything submitted so far is in the database or the dead-letter file."""
        done = threading.Event()
        if self._thread is None:  # nobody started the writer yet: the marker would wait out the timeout
            self.start()
        self._queue.put(_FlushMarker(done))
        self._wake.set()
        done.wait(timeout)

    def close(self) -> None:
        """Stop the writer once it has written (or dead-lettered) everything submitted; a writer stuck past
        `close_timeout` (a database that hangs) leaves its batch and the queue to the dead-letter file."""
        self._closed = True
        thread = self._thread
        if thread is not None:
            self._queue.put(None)
            self._wake.set()
            thread.join(timeout=self._close_timeout)
            self._thread = None
            if thread.is_alive():
                left = list(self._current)
                waiting: list[Reservation] = []
                while True:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if isinstance(item, RequestRecord):
                        left.append(item)
                    elif isinstance(item, Reservation):
                        waiting.append(item)
                flights, self._current_flights = self._current_flights, []
                plain, settled = self._prepare(waiting)
                flights += plain
                self._dead_letter(
                    [
                        {"error": "the ledger writer did not finish before shutdown", "in_flight": row.to_dict()}
                        for row, _ in flights
                    ]
                )
                self._settle([*settled, *((item, None) for _, item in flights)])
                logger.error(
                    "ledger writer did not finish in %.0f s: %d records kept in %s",
                    self._close_timeout,
                    len(left),
                    self.dead_letter_path,
                )
                self._dead_letter(
                    [{"error": "the ledger writer did not finish before shutdown", "record": asdict(r)} for r in left]
                )
        with self._request_lock:
            self._drop_request_conn()

    @property
    def dead_letter_path(self) -> Path:
        """Records the database would not take (down, restarting, disk full, locked past the timeout) are kept
        here as JSON lines until they are replayed."""
        if self.path is not None:
            return self.path.with_name(self.path.name + ".failed.jsonl")
        assert self._dead_letter_dir is not None  # __init__ refuses a PostgreSQL ledger without one
        return self._dead_letter_dir / DEAD_LETTER_FILE

    # -- the dead-letter file -------------------------------------------------------------------
    @contextmanager
    def _file_lock(self) -> Iterator[None]:
        """Every process on this data directory appends to, and replays, one file: they take turns."""
        path = self.dead_letter_path
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(str(path) + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _dead_letter(self, entries: list[dict]) -> None:
        if not entries:
            return
        data = "".join(json.dumps(e, default=str) + "\n" for e in entries).encode("utf-8")
        with self._file_lock():
            # the ledger's records, like the database file: its owner's only
            fd = os.open(self.dead_letter_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, data)
                os.fsync(fd)  # on disk before the request that made it is answered or the process goes
            finally:
                os.close(fd)
        private_file(self.dead_letter_path)

    def _pending_files(self) -> list[Path]:
        path = self.dead_letter_path
        return sorted(path.parent.glob(path.name + ".replaying.*"))

    def has_dead_letters(self) -> bool:
        path = self.dead_letter_path
        return (path.exists() and path.stat().st_size > 0) or bool(self._pending_files())

    def replay(self, conn: Any = None) -> int:
        """Write the dead-letter file's records and in-flight rows into the database; returns how many records
        were written. The file is moved aside first (new failures start a new one) and removed once written; a
        replay cut short leaves it to the next one. Idempotent by request id."""
        path = self.dead_letter_path
        with self._file_lock():
            if path.exists() and path.stat().st_size > 0:
                os.replace(path, path.with_name(f"{path.name}.replaying.{time.time_ns()}.{os.getpid()}"))
        files = self._pending_files()
        if not files:
            return 0
        own = conn is None
        written = 0
        try:
            if own:
                conn = connect(self.location)
            for file in files:
                written += self._replay_file(conn, file)
        finally:
            if own and conn is not None:
                conn.close()
        return written

    def _replay_file(self, conn: Any, file: Path) -> int:
        try:
            text = file.read_text(encoding="utf-8")
        except FileNotFoundError:  # another process replayed it meanwhile
            return 0
        records: dict[str, RequestRecord] = {}
        flights: dict[str, InFlight] = {}
        rejected: list[str] = []
        for line in text.splitlines():
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                if "record" in entry:
                    record = record_from_dict(entry["record"])
                    records[record.id] = record  # the last version of an id wins, as in the database
                else:
                    row = InFlight.from_dict(entry["in_flight"])
                    flights.setdefault(row.request_id, row)
            except (ValueError, TypeError, KeyError):  # a line torn by a kill -9 mid-write: kept, never replayed
                rejected.append(line)
        ordered = list(records.values())
        for start in range(0, len(ordered), self._batch_size):
            batch = ordered[start : start + self._batch_size]
            try:
                write_records(conn, batch)
            except self._transient:
                raise
            except self._errors:  # a record the database refuses: the others still go in
                for record in batch:
                    try:
                        write_records(conn, [record])
                    except self._transient:
                        raise
                    except self._errors as exc:
                        logger.error(
                            "replayed ledger record %s refused (%s): kept in the rejected file", record.id, exc
                        )
                        rejected.append(json.dumps({"error": str(exc), "record": asdict(record)}, default=str))
        for row in flights.values():
            if row.request_id not in records:
                budget.reserve(conn, row)  # skipped when its request's row is already there
        if rejected:
            with self._file_lock():
                target = file.with_name(self.dead_letter_path.name + ".rejected")
                with private_file(target).open("a", encoding="utf-8") as out:
                    out.write("".join(line + "\n" for line in rejected))
        file.unlink(missing_ok=True)
        if records or flights:
            logger.warning(
                "ledger: replayed %d records and %d in-flight rows from %s", len(records), len(flights), file.name
            )
        return len(records)

    # -- the writer thread ----------------------------------------------------------------------
    def _database_down(self) -> bool:
        with self._state_lock:
            return time.monotonic() < self._down_until

    def _note_failure(self) -> None:
        with self._state_lock:
            delay = self._backoff[min(self._failures, len(self._backoff) - 1)]
            self._failures += 1
            self._down_until = self._next_replay = time.monotonic() + delay
            self._replay_due = True

    def _note_success(self) -> None:
        with self._state_lock:
            self._failures = 0
            self._down_until = 0.0

    def _reopened(self, conn: Any = None) -> Any:
        """`conn`, or when it is None or broken a new connection (database.reopened). Requests wait on these
        connections before their first upstream call (the writer thread's too: it writes their in-flight rows, and a
        finished batch waiting on a lock holds them up): a SQLite file locked by another process past a short wait
        takes the outage path, as a PostgreSQL that is down does (REQUEST_BUSY_TIMEOUT_S)."""
        return reopened(conn, self.location, REQUEST_BUSY_TIMEOUT_S)

    def _fresh(self, conn: Any) -> Any:
        """Once per cycle: a SQLite file deleted or renamed away under the writer is closed (the next write opens the
        path again), so rows go to the file a restart reads, not to the unlinked one."""
        if conn is not None and not is_postgres(self.location) and conn.broken:
            with suppress(*self._errors):
                conn.close()
            return None
        return conn

    def _request_connection(self) -> LedgerConnection:
        """The request path's connection (call under _request_lock): a broken one (a PostgreSQL connection that
        failed, a SQLite file deleted or replaced under the gateway) is dropped and the path opened again."""
        self._request_conn = self._reopened(self._request_conn)
        return self._request_conn

    def _drop_request_conn(self) -> None:
        if self._request_conn is not None:
            with suppress(*self._errors):
                self._request_conn.close()
            self._request_conn = None

    def _recover(self, conn: Any) -> None:
        """Start-up: the dead-letter file into the database, then the in-flight rows of processes that are gone
        charged at their estimate."""
        try:
            self.replay(conn)
            self._sweep(conn)
        except self._errors as exc:
            logger.warning("ledger recovery at start-up failed (%s); the writer tries again", exc)
            if getattr(conn, "in_transaction", False):
                conn.rollback()

    def _sweep(self, conn: Any) -> None:
        rows = budget.abandoned(conn)
        if rows:
            written = budget.settle_abandoned(conn, rows)
            logger.warning(
                "ledger: %d requests left in flight by stopped processes recorded at their estimate", written
            )

    def _try(self, conn: Any, records: list[RequestRecord]) -> tuple[Any, BaseException | None]:
        """Write `records` on `conn` (connecting first when it is None); returns (connection or None, error)."""
        try:
            if conn is None:
                conn = self._reopened()
            write_records(conn, records)
            return conn, None
        except self._errors as exc:
            return self._discard(conn), exc

    def _discard(self, conn: Any) -> Any:
        """After a failure: roll back, and drop a PostgreSQL connection (it may be broken)."""
        if conn is not None and getattr(conn, "in_transaction", False):
            with suppress(*self._errors):
                conn.rollback()
        if conn is not None and is_postgres(self.location):
            with suppress(*self._errors):
                conn.close()
            conn = None
        return conn

    def _write(self, conn: Any, batch: list[RequestRecord]) -> Any:
        """Write a batch; what the database does not take goes to the dead-letter file now. Returns the
        connection to reuse."""
        if self._database_down():  # it failed a moment ago: do not wait on it again for every batch
            self._dead_letter([{"error": "ledger database unavailable", "record": asdict(r)} for r in batch])
            return conn
        conn, error = self._try(conn, batch)
        for delay in self._retry_delays:  # only a lost deadlock or serialization conflict is worth a retry now
            if error is None or getattr(error, "sqlstate", None) not in _RETRYABLE_SQLSTATES:
                break
            time.sleep(delay)
            conn, error = self._try(conn, batch)
        if error is None:
            self._note_success()
            return conn
        if isinstance(error, self._transient):
            self._note_failure()
            logger.error(
                "ledger write of %d records failed (%s): kept in %s until the database takes them",
                len(batch),
                error,
                self.dead_letter_path,
            )
            self._dead_letter([{"error": str(error), "record": asdict(r)} for r in batch])
            return conn
        # a record the database refuses (a constraint, a bad value) must not take its batch with it
        for record in batch:
            conn, error = self._try(conn, [record])
            if error is not None:
                logger.error("ledger write failed for %s (%s): kept in %s", record.id, error, self.dead_letter_path)
                self._dead_letter([{"error": str(error), "record": asdict(record)}])
        return conn

    def _maintain(self, conn: Any) -> Any:
        """Between batches: replay the dead-letter file once the database may be back; sweep now and then."""
        now = time.monotonic()
        conn = self._fresh(conn)
        try:
            if self._replay_due and now >= self._next_replay and not self._database_down():
                self._replay_due = False  # a failure from here on sets it again
                if self.has_dead_letters():
                    if conn is None:
                        conn = self._reopened()
                    self.replay(conn)
                    self._note_success()
            if now >= self._next_sweep:
                self._next_sweep = now + SWEEP_INTERVAL_S
                if conn is None:
                    conn = self._reopened()
                self._sweep(conn)
        except self._errors as exc:
            if isinstance(exc, self._transient):
                self._note_failure()
            else:
                with self._state_lock:
                    self._next_replay = time.monotonic() + self._backoff[-1]
                    self._replay_due = True
            logger.warning("ledger replay or sweep failed (%s); trying again later", exc)
            conn = self._discard(conn)
        return conn

    def _write_cycle(self, conn: Any, batch: list[RequestRecord], reservations: list[Reservation]) -> Any:
        """One cycle: the reservations taken (those with limits each on its own), then their in-flight rows and the
        finished rows due (`batch`, possibly none) in one transaction, then the reservations' futures. What the
        database does not take goes to the dead-letter file first, as each kind's own path would send it. Returns
        the connection to reuse."""
        conn = self._fresh(conn)
        plain, settled = self._prepare(reservations) if reservations else ([], [])
        flights = [row for row, _ in plain]
        self._current_flights = plain
        try:
            if flights and batch:
                conn = self._write_together(conn, batch, flights)
            elif flights:
                conn = self._reserve_on(conn, flights)
            elif batch:
                conn = self._write(conn, batch)
        except BaseException as exc:  # not the database's (a bug): the requests waiting on their rows hear of it
            self._settle([*settled, *((item, exc) for _, item in plain)])
            raise
        finally:
            self._current_flights = []
        self._settle([*settled, *((item, None) for _, item in plain)])
        return conn

    def _write_together(self, conn: Any, batch: list[RequestRecord], flights: list[InFlight]) -> Any:
        """New in-flight rows and finished rows in one commit. A failure falls back to each kind's own path (the
        in-flight rows on their own transaction, the batch retried or dead-lettered by _write), so a record the
        database refuses takes no reservation with it."""
        if not self._database_down():
            try:
                if conn is None:
                    conn = self._reopened()
                write_records(conn, batch, first=lambda c: budget.insert_in_flight(c, flights))
            except self._errors as exc:
                conn = self._discard(conn)
                if isinstance(exc, self._transient) and getattr(exc, "sqlstate", None) not in _RETRYABLE_SQLSTATES:
                    self._note_failure()  # both paths below dead-letter at once, without waiting on it again
            else:
                self._note_success()
                return conn
        conn = self._reserve_on(conn, flights)
        return self._write(conn, batch)

    def _run(self) -> None:
        """Finished rows gather for the write window (WRITE_WINDOW_S) from the first one queued, without a wake-up
        per row; a reservation cuts the wait short, since its request waits on the commit: it is written at once,
        alone, or with the finished rows when they are due too (one commit)."""
        conn = None
        pending = self._current  # finished rows taken from the queue, not yet written (dead-lettered if it hangs)
        due = 0.0  # when the oldest of them is to be written
        try:
            while True:
                if not pending:
                    try:
                        item = self._queue.get(timeout=0.5)
                    except queue.Empty:
                        conn = self._maintain(conn)
                        continue
                else:
                    left = due - time.monotonic()
                    if left > 0 and not self._wake.is_set():
                        self._gathering = True
                        if not self._reservation_queued:
                            self._wake.wait(left)
                        self._gathering = False
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        item = _NOTHING
                self._wake.clear()
                self._reservation_queued = False  # those queued from here on are seen by the next cycle
                reservations: list[Reservation] = []
                markers: list[_FlushMarker] = []
                stop = False
                while item is not _NOTHING:
                    if item is None:
                        stop = True
                    elif isinstance(item, Reservation):
                        reservations.append(item)
                    elif isinstance(item, _FlushMarker):
                        markers.append(item)
                    else:
                        if not pending:
                            due = time.monotonic() + self._write_window
                        pending.append(item)
                    if len(pending) >= self._batch_size or len(reservations) >= self._batch_size:
                        break
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                batch: list[RequestRecord] = []
                if pending and (stop or markers or len(pending) >= self._batch_size or time.monotonic() >= due):
                    batch = pending[:]
                if batch or reservations:
                    conn = self._write_cycle(conn, batch, reservations)
                    if batch:
                        del pending[: len(batch)]
                for marker in markers:
                    marker.done.set()
                if stop:
                    return
                conn = self._maintain(conn)
        finally:
            if conn is not None:
                conn.close()


_NOTHING = object()  # the queue was empty when the write window ended


@dataclass
class _FlushMarker:
    done: threading.Event


# a Reservation's state, changed under Ledger._taking: waiting in the queue, being written, not to be written, done
_WAITING, _TAKEN, _SKIPPED, _SETTLED = range(4)


class Reservation:
    """One in-flight row on its way to the ledger's writer thread: `prepare` gives the row and its limits; `future` is a
    concurrent.futures.Future (reserve_soon) or, with `loop`, an asyncio future of that loop (reserve_async)."""

    __slots__ = ("prepare", "future", "loop", "state", "then")

    def __init__(
        self,
        prepare: Callable[[], tuple[InFlight, Limits | None]],
        future: Any,
        loop: asyncio.AbstractEventLoop | None = None,
    ):
        self.prepare = prepare
        self.future = future
        self.loop = loop
        self.state = _WAITING
        self.then: RequestRecord | None = None  # its request's finished row, submitted once this one is settled


def _resolve(results: list[tuple[asyncio.Future[None], BaseException | None]]) -> None:
    """On the event loop: a group's futures (one already cancelled by its request stays so)."""
    for future, exc in results:
        if future.done():
            continue
        if exc is None:
            future.set_result(None)
        else:
            future.set_exception(exc)
