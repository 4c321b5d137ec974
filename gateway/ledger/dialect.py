"""The ledger's two SQL engines: SQLite (a file, the default) and PostgreSQL (a `postgresql://` URL, psycopg 3).

Queries are written once, SQLite-style (`?` placeholders, rows read by position or by name); this module is the
thin layer that lets the same text run on PostgreSQL: a connection wrapper that rewrites placeholders and returns
rows like sqlite3.Row, and the few expressions the two spell differently (`Dialect`).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, ParamSpec, TypeVar
from urllib.parse import unquote

from gateway.ledger.errors import Unavailable

logger = logging.getLogger(__name__)

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres(location: str | Path) -> bool:
    """True for a PostgreSQL URL; anything else is a SQLite file path."""
    return isinstance(location, str) and location.startswith(POSTGRES_SCHEMES)


@dataclass(frozen=True)
class Dialect:
    name: str  # "sqlite" | "postgresql"
    migrations: str  # folder under gateway/ledger/migrations

    def bucket(self, column: str, seconds: int) -> str:
        """The whole number of `seconds` since the epoch: UTC hour or day indexes."""
        if self.name == "sqlite":
            return f"CAST({column} / {seconds} AS INTEGER)"  # truncates; created_at is never negative
        return f"floor({column} / {seconds})::bigint"  # a plain ::bigint would round

    def use_index(self, name: str) -> str:
        """A table suffix that makes SQLite read through index `name` (its planner has no statistics to pick a
        partial index by itself); PostgreSQL's planner chooses from statistics."""
        return f" INDEXED BY {name}" if self.name == "sqlite" else ""


SQLITE = Dialect("sqlite", "sqlite")
POSTGRESQL = Dialect("postgresql", "postgresql")


def dialect_of(conn: LedgerConnection) -> Dialect:
    return POSTGRESQL if isinstance(conn, PostgresConnection) else SQLITE


def database_error_types() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    """(what a failed write raises, the transient part of it: unreachable, restarting, locked, deadlocked)."""
    try:
        import psycopg
    except ImportError:
        return (sqlite3.Error,), (sqlite3.OperationalError,)
    return (sqlite3.Error, psycopg.Error), (sqlite3.OperationalError, psycopg.OperationalError)


UNAVAILABLE_MESSAGE = "the ledger database is unavailable; try again shortly"


@contextmanager
def unavailable_as_error() -> Iterator[None]:
    """An unreachable, restarting or locked database (the drivers' OperationalError) as the ledger's Unavailable;
    the driver's words go to the log only."""
    _, transient = database_error_types()
    try:
        yield
    except transient as exc:
        logger.warning("ledger database unavailable: %s", exc)
        raise Unavailable(UNAVAILABLE_MESSAGE, code="ledger_unavailable") from None


_P = ParamSpec("_P")
_T = TypeVar("_T")


def reachable(method: Callable[_P, _T]) -> Callable[_P, _T]:
    """Decorate a method that talks to the ledger database: see unavailable_as_error."""

    @functools.wraps(method)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        with unavailable_as_error():
            return method(*args, **kwargs)

    return wrapper


def integrity_error_types() -> tuple[type[BaseException], ...]:
    """A constraint refused a row (a duplicate key), whichever engine."""
    try:
        import psycopg
    except ImportError:
        return (sqlite3.IntegrityError,)
    return (sqlite3.IntegrityError, psycopg.IntegrityError)


# ---------------------------------------------------------------------------------------------- PostgreSQL


class Row(tuple):
    """A result row read by position, slice or column name, like sqlite3.Row."""

    __slots__ = ()
    _names: dict[str, int]

    def __getitem__(self, key: Any) -> Any:  # type: ignore[override]
        if isinstance(key, str):
            return tuple.__getitem__(self, self._names[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._names)


def _row_factory(cursor: Any) -> Callable[[Sequence[Any]], Row]:
    names = {column.name: i for i, column in enumerate(cursor.description or ())}
    row_type = type("Row", (Row,), {"_names": names})
    return lambda values: tuple.__new__(row_type, values)


def _to_sql(sql: str) -> str:
    # queries carry no literal '?' or '%'; escape any '%' anyway so psycopg does not read it as a placeholder
    return sql.replace("%", "%%").replace("?", "%s")


class _StallWatch:
    """Cuts the socket of a PostgreSQL connection whose call has waited past its limit, so the thread blocked in it
    gets an OperationalError (the outage path) instead of waiting for as long as the server does.

    A server that hangs (stopped, swapped out, a network that drops packets without a reset) keeps its TCP
    connections open, so no timeout of the driver or the kernel ends a call: under a SIGSTOPped PostgreSQL every
    request waited for as long as it hung (45 s in the probe), keys without limits too, and a SIGTERM never exited
    (probe11). One thread per process looks every POLL_S at the calls being watched; a call arms and disarms with
    two dict operations under a lock."""

    POLL_S = 0.1

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._due: dict[int, tuple[float, Any]] = {}  # id(connection) -> (monotonic deadline, psycopg connection)
        self._thread: threading.Thread | None = None

    def arm(self, key: int, raw: Any, seconds: float) -> None:
        with self._lock:
            self._due[key] = (time.monotonic() + seconds, raw)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="selfroute-ledger-stalls", daemon=True)
                self._thread.start()

    def disarm(self, key: int) -> None:
        with self._lock:
            self._due.pop(key, None)

    def _run(self) -> None:
        while True:
            time.sleep(self.POLL_S)
            now = time.monotonic()
            with self._lock:
                late = [(key, raw) for key, (due, raw) in self._due.items() if due <= now]
                for key, _ in late:
                    del self._due[key]
            for _, raw in late:
                _cut(raw)


def _cut(raw: Any) -> None:
    """Shut the connection's socket down under the thread waiting on it (a duplicate of the descriptor, so the
    driver still owns and closes its own): its wait ends at once with "server closed the connection"."""
    try:
        fd = os.dup(raw.pgconn.socket)
    except Exception:  # closed meanwhile: nothing waits on it
        return
    logger.warning("ledger database did not answer in time: its connection is cut (the outage path follows)")
    try:
        with socket.socket(fileno=fd) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


_STALLS = _StallWatch()


class PostgresConnection:
    """A psycopg connection that takes SQLite-style queries; `with conn:` is one transaction, as in sqlite3.

    With `stall_s`, a call (a statement, a commit, a pipeline block) that waits past it is cut (_StallWatch): the
    gateway's connections pass database.REQUEST_BUSY_TIMEOUT_S, as a locked SQLite file is waited for; the CLI's
    (migrations, reports) wait as long as the server takes."""

    def __init__(self, raw: Any, stall_s: float | None = None) -> None:
        self.raw = raw
        self._transactions: list = []  # open `with conn:` blocks on an autocommit connection
        self._stall_s = stall_s
        self._watching = 0  # nested watched calls (a statement inside a pipeline block): the outermost arms

    @contextmanager
    def _watched(self) -> Iterator[None]:
        if self._stall_s is None:
            yield
            return
        if not self._watching:
            _STALLS.arm(id(self), self.raw, self._stall_s)
        self._watching += 1
        try:
            yield
        finally:
            self._watching -= 1
            if not self._watching:
                _STALLS.disarm(id(self))

    def execute(self, sql: str, params: Sequence | None = None) -> Any:
        with self._watched():
            return self.raw.execute(_to_sql(sql), params if params else None)

    def executemany(self, sql: str, rows: Iterable[Sequence]) -> None:
        rows = list(rows)
        if rows:
            with self._watched():
                self.raw.cursor().executemany(_to_sql(sql), rows)

    @contextmanager
    def pipeline(self) -> Iterator[Any]:
        """psycopg's pipeline mode for the block: statements are sent without waiting for each answer; reading a
        result (or the block's end) waits for what was sent before it. Errors surface there too. The whole block
        is one watched call."""
        with self._watched(), self.raw.pipeline() as pipeline:
            yield pipeline

    def script(self, sql: str) -> None:
        """Several statements, sent as one string without parameters (the simple query protocol)."""
        with self._watched():
            self.raw.execute(sql)

    @property
    def in_transaction(self) -> bool:
        from psycopg.pq import TransactionStatus

        return self.raw.info.transaction_status != TransactionStatus.IDLE

    def commit(self) -> None:
        with self._watched():
            self.raw.commit()

    def rollback(self) -> None:
        with self._watched():
            self.raw.rollback()

    def close(self) -> None:
        self.raw.close()

    @property
    def closed(self) -> bool:
        return self.raw.closed

    @property
    def broken(self) -> bool:
        """The server went away (restart, failover): this connection cannot be used again."""
        return self.raw.broken or self.raw.closed

    def __enter__(self) -> PostgresConnection:
        if self.raw.autocommit:  # otherwise the block is the transaction psycopg opens at the first statement
            transaction = self.raw.transaction()
            with self._watched():
                transaction.__enter__()
            self._transactions.append(transaction)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._transactions:
            with self._watched():
                self._transactions.pop().__exit__(kind, value, traceback)
            return
        if self.raw.closed:
            return
        with self._watched():
            if kind is None:
                self.raw.commit()
            else:
                self.raw.rollback()


def _numeric_loader() -> type:
    from psycopg.adapt import Loader

    class NumericLoader(Loader):
        """sum() of a bigint is a numeric: read whole numbers as int and the rest as float, as SQLite returns."""

        def load(self, data: Any) -> int | float:
            text = bytes(data).decode("ascii")
            try:
                return int(text)
            except ValueError:
                return float(text)

    return NumericLoader


_URL_USERINFO = re.compile(r"(\w+://[^:/@\s\"']*:)[^\s\"']*@")
_PASSWORD_OPTION = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def url_secrets(url: str) -> list[str]:
    """The password of a postgresql:// URL (as written and percent-decoded, and the parts of it a parser that stops
    at an '@' inside it would quote back), and any password= option."""
    rest = url.split("://", 1)[-1]
    userinfo = rest.split("/", 1)[0].rpartition("@")[0]
    password = userinfo.partition(":")[2]
    found = {password, unquote(password), *(p for p in password.split("@") if len(p) >= 4)}
    found |= {m.group(2).strip("'") for m in _PASSWORD_OPTION.finditer(rest.replace("&", " "))}
    return sorted((s for s in found if s), key=len, reverse=True)


def redact(message: str, url: str) -> str:
    """`message` without the URL's password: libpq quotes parts of a malformed URL, the password included, back in
    its errors, and those errors reach logs, the CLI's output and the dead-letter file."""
    for secret in url_secrets(url):
        message = message.replace(secret, "***")
    message = _URL_USERINFO.sub(r"\1***@", message)
    return _PASSWORD_OPTION.sub(r"\1***", message)


def connect_postgres(
    url: str, *, autocommit: bool = False, connect_timeout: float = 10, stall_s: float | None = None
) -> PostgresConnection:
    """`stall_s`: no call waits longer (PostgresConnection), and connecting not longer either."""
    try:
        import psycopg
    except ImportError as exc:  # the dependency is declared; this only helps a broken install
        raise RuntimeError("a postgresql:// ledger needs psycopg: pip install 'psycopg[binary]'") from exc
    try:
        timeout = connect_timeout if stall_s is None else min(connect_timeout, stall_s)
        raw = psycopg.connect(
            url, autocommit=autocommit, connect_timeout=int(max(1, timeout)), row_factory=_row_factory
        )
    except psycopg.Error as exc:
        # the same type (callers tell transient failures by it), its message without the password, and no chained
        # original that a traceback would print in full
        raise type(exc)(redact(str(exc), url)) from None
    raw.adapters.register_loader("numeric", _numeric_loader())
    return PostgresConnection(raw, stall_s)


LedgerConnection = sqlite3.Connection | PostgresConnection
