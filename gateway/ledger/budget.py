"""Reservations: what a request in flight may spend, held against its key's budget and TPM in the ledger database.

A request reserves its estimated cost before its first upstream call: one row in requests_in_flight (migration
011), inserted in the same transaction as the check against the key's limits, under a per-key lock (SQLite's
write lock, a PostgreSQL advisory lock), so requests on every worker and replica sharing the database see each
other's reservations. The request's finished row replaces its reservation in one transaction of the ledger writer
(database.write_records): at every moment a key's spend is its finished requests plus its reservations, never
neither and never both.

A request is let in while the key's spend and reservations are below its budget (and the last minute's tokens and
the reserved tokens below its TPM). A burst therefore overshoots a limit by at most the reservation of the last
request let in, and a reservation bounds what its request can cost: the prompt's tokens, the completion at
`max_tokens` or the model's output limit, for every leg the request may make.

The same row is the ledger's record of spend in progress: a process killed with requests in flight leaves their
rows, and `abandoned` / `settle_abandoned` turn them into requests rows charged at the estimate (status IN_FLIGHT)
once their process is gone or their lease has ended.
"""

from __future__ import annotations

import hashlib
import math
import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from gateway.ledger.database import write_records
from gateway.ledger.dialect import POSTGRESQL, LedgerConnection, dialect_of
from gateway.ledger.errors import LedgerError
from gateway.ledger.records import IN_FLIGHT, RequestRecord

TPM_WINDOW_S = 60.0
# how long a reservation holds when nobody settles it and its process cannot be seen to have died (another host);
# longer than any request the gateway serves (upstream timeouts are a minute by default, retries and a fallback
# leg included); a request that outlives it still replaces the charged estimate with its real row when it ends
LEASE_S = 900.0
ABANDONED_ERROR = "in flight when its gateway process stopped (killed or crashed): charged at its estimate"


class BudgetExceeded(LedgerError):
    """The key's budget is spent (its recorded spend and the reservations of its requests in flight)."""


class TokenLimitExceeded(LedgerError):
    """The key's tokens per minute are used up (the last minute's requests and its reservations)."""

    def __init__(self, message: str, *, retry_after: float, code: str | None = None):
        super().__init__(message, code=code)
        self.retry_after = retry_after


@dataclass(frozen=True)
class LegEstimate:
    """An upper bound on one upstream call: the prompt's tokens, the completion's bound, their price."""

    model: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float


@dataclass(frozen=True)
class Estimate:
    """An upper bound on a request: every leg it may make (a routed request: the cheap one and the long one)."""

    legs: tuple[LegEstimate, ...] = ()
    # legs a request may make instead of one in `legs` (a long alternate): priced for a leg that ends without
    # usage, not added to the bound
    alternates: tuple[LegEstimate, ...] = ()

    @property
    def prompt_tokens(self) -> int:
        return sum(leg.prompt_tokens for leg in self.legs)

    @property
    def completion_tokens(self) -> int:
        return sum(leg.completion_tokens for leg in self.legs)

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def cost_usd(self) -> float:
        return sum(leg.cost_usd for leg in self.legs)

    def leg(self, model: str) -> LegEstimate | None:
        """The bound on a call to `model`, or None when the estimate has none for it."""
        return next((leg for leg in (*self.legs, *self.alternates) if leg.model == model), None)


@dataclass(frozen=True)
class Limits:
    """A named key's limits that reservations count against."""

    budget_usd: float | None = None
    tpm: int | None = None
    period_start: float | None = None  # a budget per period counts the spend since then; None: all of it

    @property
    def any(self) -> bool:
        return self.budget_usd is not None or self.tpm is not None


_owner: tuple[int, str] | None = None  # (pid, owner id): asked once per request, the same until a fork


def owner_id() -> str:
    """This process, as an in-flight row names it: host and pid."""
    global _owner
    pid = os.getpid()
    if _owner is None or _owner[0] != pid:
        _owner = (pid, f"{socket.gethostname()}:{pid}")
    return _owner[1]


def owner_alive(owner: str) -> bool:
    """False only for an owner on this host whose process is gone; another host's processes cannot be seen."""
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process of that pid: alive
        return True
    return True


_COLUMNS = (
    "request_id",
    "created_at",
    "expires_at",
    "owner",
    "key_id",
    "policy",
    "alias",
    "stream",
    "prompt_tokens",
    "completion_tokens",
    "cost_usd",
    "client_request_id",
)


@dataclass
class InFlight:
    """One row of requests_in_flight: a request being served and its reservation."""

    request_id: str
    created_at: float
    key_id: str | None
    policy: str | None
    alias: str | None
    stream: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    owner: str = field(default_factory=owner_id)
    expires_at: float = 0.0
    client_request_id: str | None = None  # the client's X-Request-Id, kept by the row settled from this one

    def __post_init__(self) -> None:
        if not self.expires_at:
            self.expires_at = self.created_at + LEASE_S

    @classmethod
    def of(cls, record: RequestRecord, estimate: Estimate) -> InFlight:
        return cls(
            record.id,
            record.created_at,
            record.key_id,
            record.policy,
            record.alias,
            record.stream,
            estimate.prompt_tokens,
            estimate.completion_tokens,
            estimate.cost_usd,
            client_request_id=record.client_request_id,
        )

    def row(self) -> tuple:
        return tuple(int(v) if isinstance(v, bool) else v for v in (getattr(self, c) for c in _COLUMNS))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InFlight:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    def abandoned_record(self, error: str = ABANDONED_ERROR) -> RequestRecord:
        """The requests row of a request nobody finished: its estimate charged, status IN_FLIGHT."""
        return RequestRecord(
            id=self.request_id,
            created_at=self.created_at,
            key_id=self.key_id,
            policy=self.policy,
            alias=self.alias,
            route=None,
            reason=None,
            status=IN_FLIGHT,
            error=error,
            stream=bool(self.stream),
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            cost_usd=self.cost_usd,
            context_tokens=self.prompt_tokens,
            counterfactual_cost_usd=self.cost_usd,
            provenance={"in_flight": {"charged": "estimate", "owner": self.owner}},
            client_request_id=self.client_request_id,
        )


_INSERT = (
    f"INSERT INTO requests_in_flight ({', '.join(_COLUMNS)}) SELECT {', '.join('?' * len(_COLUMNS))}"
    # a reservation replayed from the dead-letter file after its request's row was written is stale
    " WHERE NOT EXISTS (SELECT 1 FROM requests WHERE id = ?) ON CONFLICT (request_id) DO NOTHING"
)
_SPENT = (
    "SELECT (SELECT coalesce(sum(cost_usd), 0) FROM request_rollup_daily WHERE key_id = ?)"
    " + (SELECT coalesce(sum(cost_usd), 0) FROM requests_in_flight WHERE key_id = ?)"
)
# a budget per period: whole hours from the hourly rollups, the period's first partial hour from the requests
# (as KeyStore.budget_spent counts it), and every reservation in flight
_SPENT_SINCE = (
    "SELECT (SELECT coalesce(sum(cost_usd), 0) FROM request_rollup_hourly WHERE key_id = ? AND hour >= ?)"
    " + (SELECT coalesce(sum(cost_usd), 0) FROM requests WHERE key_id = ? AND created_at >= ?"
    " AND created_at < ?)"
    " + (SELECT coalesce(sum(cost_usd), 0) FROM requests_in_flight WHERE key_id = ?)"
)
# one statement, one snapshot: the writer moving a request from reserved to recorded is seen before or after
_TOKENS = (
    "SELECT (SELECT coalesce(sum(prompt_tokens + completion_tokens), 0) FROM requests"
    " WHERE key_id = ? AND created_at >= ?)"
    " + (SELECT coalesce(sum(prompt_tokens + completion_tokens), 0) FROM requests_in_flight WHERE key_id = ?),"
    " (SELECT min(created_at) FROM requests WHERE key_id = ? AND created_at >= ?)"
)


def _lock_number(key_id: str) -> int:
    # a stable signed 64-bit number per key for pg_advisory_xact_lock (Python's hash() differs per process)
    return int.from_bytes(hashlib.sha256(b"selfroute-budget:" + key_id.encode()).digest()[:8], "big", signed=True)


def _check(
    conn: LedgerConnection, key_id: str, limits: Limits, estimate_tokens: int, estimate_usd: float, now: float
) -> None:
    """Let the request in only if its reservation fits in what the key has left: its recorded spend (this period)
    and reservations plus this request's bound within the budget, and the last minute's tokens and reservations plus
    its tokens within the TPM. Before round eleven only what was already spent or reserved was compared, so the
    last request let in could be of any size: one request with a 200 kB document spent $0.37 of a $0.01 budget, and
    a TPM of 50 let a 2,000-token request through (probe11)."""
    if limits.budget_usd is not None:
        if limits.period_start is None:
            found = conn.execute(_SPENT, (key_id, key_id)).fetchone()
        else:
            first_hour = math.ceil(limits.period_start / 3600)
            found = conn.execute(
                _SPENT_SINCE, (key_id, first_hour, key_id, limits.period_start, first_hour * 3600.0, key_id)
            ).fetchone()
        spent = float(found[0] or 0.0)
        if spent + estimate_usd > limits.budget_usd or spent >= limits.budget_usd:
            raise _over_budget(limits, spent, estimate_usd)
    if limits.tpm is not None:
        if estimate_tokens > limits.tpm:  # OpenAI's "Request too large": waiting does not help
            raise TokenLimitExceeded(
                f"this request's {estimate_tokens} tokens (its prompt and completion bound) are more than this key's"
                f" limit of {limits.tpm} tokens per minute; set a lower max_tokens or send less",
                retry_after=TPM_WINDOW_S,
                code="rate_limit_exceeded",
            )
        since = now - TPM_WINDOW_S
        used, oldest = conn.execute(_TOKENS, (key_id, since, key_id, key_id, since)).fetchone()
        if int(used or 0) + estimate_tokens > limits.tpm:
            retry = (float(oldest) + TPM_WINDOW_S - now) if oldest is not None else 1.0
            raise TokenLimitExceeded(
                f"this key's limit of {limits.tpm} tokens per minute is reached ({int(used or 0)} used or reserved in"
                f" the last minute, {estimate_tokens} asked for)",
                retry_after=retry,
                code="rate_limit_exceeded",
            )


def _over_budget(limits: Limits, spent: float, estimate_usd: float) -> BudgetExceeded:
    """The refusal of a request whose reservation does not fit in what is left of the key's budget."""
    assert limits.budget_usd is not None
    budget = f"this key's budget of ${limits.budget_usd:g}" + (
        " for this period" if limits.period_start is not None else ""
    )
    if spent >= limits.budget_usd:
        return BudgetExceeded(
            f"{budget} is spent (${spent:.4f} recorded or reserved by requests in flight)", code="budget_exceeded"
        )
    return BudgetExceeded(
        f"this request could cost up to ${estimate_usd:.4f} (its prompt and completion bound), more than the"
        f" ${limits.budget_usd - spent:.4f} left of {budget}; set a lower max_tokens or send less",
        code="budget_exceeded",
    )


def reserve(conn: LedgerConnection, row: InFlight, limits: Limits | None = None, now: float | None = None) -> None:
    """Record `row` as in flight; with `limits`, first check the key's budget and TPM against what is recorded and
    reserved, atomically with the insert (BudgetExceeded / TokenLimitExceeded, nothing inserted)."""
    now = time.time() if now is None else now
    params = (*row.row(), row.request_id)
    if limits is None or not limits.any or row.key_id is None:
        with conn:
            conn.execute(_INSERT, params)
        return
    if dialect_of(conn) is POSTGRESQL:
        with conn:
            conn.execute("SELECT pg_advisory_xact_lock(?)", (_lock_number(row.key_id),))
            _check(conn, row.key_id, limits, row.prompt_tokens + row.completion_tokens, row.cost_usd, now)
            conn.execute(_INSERT, params)
        return
    # SQLite: BEGIN IMMEDIATE takes the database's write lock before reading, so no two reservers (or a reserver and
    # the writer) interleave between the check and the insert
    conn.execute("BEGIN IMMEDIATE")
    try:
        _check(conn, row.key_id, limits, row.prompt_tokens + row.completion_tokens, row.cost_usd, now)
        conn.execute(_INSERT, params)
    except BaseException:
        conn.rollback()
        raise
    conn.commit()


def reserve_many(conn: LedgerConnection, rows: list[InFlight]) -> None:
    """Record rows without limits as in flight, in one transaction (the ledger's group commit of reservations)."""
    with conn:
        insert_in_flight(conn, rows)


def insert_in_flight(conn: LedgerConnection, rows: list[InFlight]) -> None:
    """The inserts of reserve_many in the caller's transaction: the ledger's writer commits a cycle's new in-flight
    rows together with the finished rows it writes (database.write_records)."""
    conn.executemany(_INSERT, [(*row.row(), row.request_id) for row in rows])


def release(conn: LedgerConnection, request_id: str) -> None:
    """Drop a reservation without a requests row (the writer drops it with the row; this is for tests and tools)."""
    with conn:
        conn.execute("DELETE FROM requests_in_flight WHERE request_id = ?", (request_id,))


def in_flight(conn: LedgerConnection, key_id: str | None = None) -> list[InFlight]:
    """The rows in flight (of one key)."""
    sql = f"SELECT {', '.join(_COLUMNS)} FROM requests_in_flight"
    rows = (
        conn.execute(sql + " WHERE key_id = ? ORDER BY created_at", (key_id,))
        if key_id is not None
        else conn.execute(sql + " ORDER BY created_at")
    )
    return [InFlight(**dict(zip(_COLUMNS, r, strict=True))) for r in rows.fetchall()]


def abandoned(
    conn: LedgerConnection, now: float | None = None, alive: Callable[[str], bool] = owner_alive
) -> list[InFlight]:
    """In-flight rows nobody will finish: their lease ended, or their process (on this host) is gone."""
    now = time.time() if now is None else now
    return [row for row in in_flight(conn) if row.expires_at <= now or not alive(row.owner)]


def settle_abandoned(conn: LedgerConnection, rows: list[InFlight]) -> int:
    """Turn abandoned in-flight rows into requests rows charged at their estimate, in one transaction with their
    rollups (the ledger writer's write_records); a request whose real row exists keeps it. Returns how many rows
    were written."""
    return write_records(conn, [row.abandoned_record() for row in rows], keep_existing=True)
