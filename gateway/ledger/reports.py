"""Queries over the cost ledger, shared by the CLI (`logs`, `costs`, `export`) and the admin endpoints.

Aggregates read the daily rollups (migration 003) for whole days, the hourly ones (002) for whole hours
and the raw rows for the partial hours at the edges of a time range, so a report costs about
O(days x groups), not O(requests).
Days and hours are UTC. The same queries run on SQLite and PostgreSQL (gateway.ledger.dialect).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from gateway.ledger.dialect import (
    POSTGRESQL,
    LedgerConnection,
    connect_postgres,
    dialect_of,
    is_postgres,
    unavailable_as_error,
)
from gateway.ledger.errors import InvalidQuery, NotFound
from gateway.ledger.records import CALL_FIELDS, CALL_MEASURES, REQUEST_FIELDS_STORED, REQUEST_MEASURES, key_id
from policies.routes import DIRECT, LONG, PASSTHROUGH, RAG, answered_by
from policies.routes import FALLBACK as FALLBACK_ROUTE  # noqa: F401 -- re-exported: the metrics use this one name

GROUPINGS = ("route", "model", "policy", "key", "day", "hour", "week", "tag")
MAX_PAGE = 1000
ANSWERING_ROUTES = (DIRECT, RAG, LONG, PASSTHROUGH)  # what --answered-by takes

_RELATIVE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_STATUS_CLASS = re.compile(r"^([1-5])xx$", re.IGNORECASE)

T = TypeVar("T")


# ---------------------------------------------------------------------------------------------- opening


def ensure_schema(location: str | Path) -> None:
    """Apply pending migrations (the rollups) once, with a writable connection; errors if there is no ledger."""
    from gateway.ledger.database import connect, migrate

    if is_postgres(location):
        try:
            conn = connect(location)
        except Exception as exc:  # psycopg.OperationalError: unreachable, unknown database, refused login
            raise NotFound(f"cannot reach the ledger database: {exc}".strip(), code="ledger_not_found") from None
        try:
            migrate(conn)  # serialised by an advisory lock: no race to retry
        finally:
            conn.close()
        return
    if not Path(location).exists():
        raise NotFound(f"no ledger at {location}", code="ledger_not_found")
    conn = connect(location)
    try:
        migrate(conn)
    except sqlite3.OperationalError:
        # another process migrated at the same moment: retry once, finding the work done
        if conn.in_transaction:
            conn.rollback()
        migrate(conn)
    finally:
        conn.close()


def connect_reader(location: str | Path) -> LedgerConnection:
    """A read-only connection. SQLite: WAL lets it read while the gateway's writer commits. PostgreSQL: an
    autocommit session, so each query sees what every replica has committed so far."""
    if is_postgres(location):
        pg = connect_postgres(str(location), autocommit=True)
        pg.execute("SET default_transaction_read_only = on")
        return pg
    conn = sqlite3.connect(f"file:{Path(location).resolve()}?mode=ro", uri=True, timeout=30, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    return conn


def query(location: str | Path, work: Callable[[LedgerConnection], T]) -> T:
    """`work(conn)` on a fresh read-only connection, closed after; an unreachable database is Unavailable."""
    with unavailable_as_error():
        conn = connect_reader(location)
        try:
            return work(conn)
        finally:
            conn.close()


# ---------------------------------------------------------------------------------------------- filters


def parse_time(value: str, *, now: float | None = None) -> float:
    """Unix seconds from ISO 8601 (date or date-time; naive means UTC), 'now', or a relative age: 30m, 1h, 7d."""
    now = time.time() if now is None else now
    text = value.strip()
    if text.lower() == "now":
        return now
    match = _RELATIVE.match(text)
    if match:
        return now - float(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()]
    try:
        moment = datetime.fromisoformat(text.replace("z", "Z"))
    except ValueError:
        raise InvalidQuery(
            f"cannot read time {value!r}: use ISO 8601 (2025-01-31, 2025-01-31T12:00:00Z) or an age like 30m, 1h, 7d",
            param="since/until",
            code="invalid_time",
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


@dataclass(frozen=True)
class Filters:
    since: float | None = None  # inclusive, unix seconds
    until: float | None = None  # exclusive
    route: str | None = None
    key: str | None = None  # a stored key id (k_...)
    policy: str | None = None
    status: tuple[int, int] | None = None  # [low, high) status codes
    answered_by: str | None = None  # the route whose model answered: long matches long and rag>long

    @classmethod
    def parse(
        cls,
        *,
        since: str | None = None,
        until: str | None = None,
        route: str | None = None,
        key: str | None = None,
        policy: str | None = None,
        status: str | None = None,
        answered_by: str | None = None,
        now: float | None = None,
    ) -> Filters:
        now = time.time() if now is None else now
        start = parse_time(since, now=now) if since else None
        end = parse_time(until, now=now) if until else None
        if start is not None and end is not None and end <= start:
            raise InvalidQuery("'until' must be after 'since'", param="until", code="invalid_time")
        if answered_by and answered_by not in ANSWERING_ROUTES:
            raise InvalidQuery(
                f"cannot read answered-by {answered_by!r}: use one of {', '.join(ANSWERING_ROUTES)}",
                param="answered_by",
                code="invalid_route",
            )
        return cls(
            start,
            end,
            route or None,
            _key_id(key) if key else None,
            policy or None,
            parse_status(status),
            answered_by or None,
        )


def _key_id(value: str) -> str:
    """A key id as stored; a raw API key is hashed the way the gateway hashes it."""
    value = value.strip()
    return value if value.startswith("k_") else key_id(value)


def parse_status(value: str | None) -> tuple[int, int] | None:
    """'200' exactly, '4xx' a class, 'ok' 100-399, 'error' 400 and above; '0' the requests left in flight by a
    stopped process (charged at their estimate)."""
    if not value:
        return None
    text = value.strip().lower()
    if text == "ok":  # answered: a row left in flight by a stopped process (status 0) never is
        return (100, 400)
    if text == "error":
        return (400, 1000)
    if text.isdigit():
        return (int(text), int(text) + 1)
    match = _STATUS_CLASS.match(text)
    if match:
        low = int(match.group(1)) * 100
        return (low, low + 100)
    raise InvalidQuery(
        f"cannot read status {value!r}: use 200, 4xx, ok or error", param="status", code="invalid_status"
    )


def _where(filters: Filters, cols: dict[str, str]) -> tuple[list[str], list]:
    """SQL conditions for the dimension filters (not time); `cols` maps route/key/policy/status to columns."""
    conds: list[str] = []
    params: list[Any] = []
    for name, value in (("route", filters.route), ("key", filters.key), ("policy", filters.policy)):
        if value is not None:
            conds.append(f"{cols[name]} = ?")
            params.append(value)
    if filters.answered_by is not None:
        routes = answered_by(filters.answered_by)
        conds.append(f"{cols['route']} IN ({', '.join('?' * len(routes))})")
        params.extend(routes)
    if filters.status is not None:
        conds.append(f"{cols['status']} >= ? AND {cols['status']} < ?")
        params.extend(filters.status)
    return conds, params


# ---------------------------------------------------------------------------------------------- aggregates

_RAW_REQUEST_DIMS = {
    "route": "coalesce(route, '')",
    "policy": "coalesce(policy, '')",
    "key": "coalesce(key_id, '')",
    "status": "status",
    "day": "{day(created_at)}",
    "hour": "{hour(created_at)}",
}
_ROLLUP_REQUEST_DIMS = {
    "route": "route",
    "policy": "policy",
    "key": "key_id",
    "status": "status",
    "day": "hour / 24",
    "hour": "hour",
}
# the sums, from the one description of the rollups' figures (gateway.ledger.records); each raw aggregate equals the
# sum of its rollup column
_RAW_REQUEST_SUMS = ", ".join(m.raw_sum() for m in REQUEST_MEASURES)
_ROLLUP_REQUEST_SUMS = ", ".join(f"sum({m.column})" for m in REQUEST_MEASURES)
REQUEST_FIELDS = tuple(m.column for m in REQUEST_MEASURES)

_RAW_CALL_DIMS = {
    "model": "c.model",
    "route": "coalesce(r.route, '')",
    "policy": "coalesce(r.policy, '')",
    "key": "coalesce(r.key_id, '')",
    "status": "r.status",
    "day": "{day(r.created_at)}",
    "hour": "{hour(r.created_at)}",
}
_RAW_CALL_SUMS = ", ".join(m.raw_sum("c.") for m in CALL_MEASURES)
_ROLLUP_CALL_SUMS = ", ".join(f"sum({m.column})" for m in CALL_MEASURES)
_CALL_FIELDS = tuple(m.column for m in CALL_MEASURES)


_INF = 2**62


def _split_range(filters: Filters, *, days: bool) -> list[tuple[str, float, float]]:
    """Cover [since, until) with whole UTC days (daily rollups), whole hours (hourly) and raw rows at the edges."""
    since = -math.inf if filters.since is None else filters.since
    until = math.inf if filters.until is None else filters.until
    h_lo = -_INF if since == -math.inf else math.ceil(since / 3600)
    h_hi = _INF if until == math.inf else math.floor(until / 3600)
    if h_lo >= h_hi:
        return [("raw", since, until)]
    pieces = []
    if h_lo != -_INF and since < h_lo * 3600:
        pieces.append(("raw", since, h_lo * 3600.0))
    if h_hi != _INF and until > h_hi * 3600:
        pieces.append(("raw", h_hi * 3600.0, until))
    d_lo = -_INF if h_lo == -_INF else -(-h_lo // 24)
    d_hi = _INF if h_hi == _INF else h_hi // 24
    if not days or d_lo >= d_hi:
        return [*pieces, ("hour", h_lo, h_hi)]
    pieces.append(("day", d_lo, d_hi))
    if h_lo < d_lo * 24:
        pieces.append(("hour", h_lo, d_lo * 24))
    if d_hi * 24 < h_hi:
        pieces.append(("hour", d_hi * 24, h_hi))
    return pieces


_TIERS: dict[str, tuple[str, str, str, Mapping[str, str | None]]] = {
    # source: (request table, call table, time column, dims over that source)
    "day": ("request_rollup_daily", "call_rollup_daily", "day", {**_ROLLUP_REQUEST_DIMS, "day": "day", "hour": None}),
    "hour": ("request_rollup_hourly", "call_rollup_hourly", "hour", _ROLLUP_REQUEST_DIMS),
}


def aggregate(conn: LedgerConnection, dims: list[str], filters: Filters, *, calls: bool = False) -> dict[tuple, dict]:
    """Sums per combination of `dims` (route, policy, key, status, day, hour; and model when `calls`)."""
    fields = _CALL_FIELDS if calls else REQUEST_FIELDS
    queries: list[tuple[str, list]] = []
    exprs: dict[str, str | None]
    for source, lo, hi in _split_range(filters, days="hour" not in dims):
        if source == "raw":
            exprs = {**(_RAW_CALL_DIMS if calls else _RAW_REQUEST_DIMS)}
            time_col = "r.created_at" if calls else "created_at"
            table = "upstream_calls c JOIN requests r ON r.id = c.request_id" if calls else "requests"
            sums = _RAW_CALL_SUMS if calls else _RAW_REQUEST_SUMS
        else:
            request_table, call_table, time_col, tier_dims = _TIERS[source]
            exprs = {**tier_dims, "model": "model"}
            table = call_table if calls else request_table
            sums = _ROLLUP_CALL_SUMS if calls else _ROLLUP_REQUEST_SUMS
        # a dim the tier lacks (None: the day tier's hour) is left out; _split_range never sends a query
        # grouped by it to that tier
        cols = {name: sql for name, expr in exprs.items() if (sql := _bucket_sql(conn, expr)) is not None}
        conds, params = _where(filters, cols)
        if lo != -math.inf and lo != -_INF:
            conds.append(f"{time_col} >= ?")
            params.append(lo)
        if hi != math.inf and hi != _INF:
            conds.append(f"{time_col} < ?")
            params.append(hi)
        queries.append((_group_sql(table, [cols[d] for d in dims], sums, conds), params))
    merged: dict[tuple, dict] = {}
    for sql, params in queries:
        for row in conn.execute(sql, params):
            key = tuple(row[: len(dims)])
            slot = merged.setdefault(key, dict.fromkeys(fields, 0))
            for name, value in zip(fields, row[len(dims) :]):
                slot[name] += value or 0
    count_field = fields[0]
    return {key: slot for key, slot in merged.items() if slot[count_field] > 0}


_BUCKET = re.compile(r"\{(day|hour)\(([\w.]+)\)\}")


def _bucket_sql(conn: LedgerConnection, expr: str | None) -> str | None:
    """Spell '{day(col)}' / '{hour(col)}' (UTC day and hour indexes) in the connection's dialect."""
    if expr is None:
        return None
    dialect = dialect_of(conn)
    return _BUCKET.sub(lambda m: dialect.bucket(m.group(2), 86400 if m.group(1) == "day" else 3600), expr)


def _group_sql(source: str, group_exprs: list[str], sums: str, conds: list[str]) -> str:
    select = ", ".join([*group_exprs, sums])
    where = f" WHERE {' AND '.join(conds)}" if conds else ""
    group = f" GROUP BY {', '.join(str(i + 1) for i in range(len(group_exprs)))}" if group_exprs else ""
    return f"SELECT {select} FROM {source}{where}{group}"


def _week_start(day: int) -> int:
    """The Monday (a day index) of a UTC day's ISO week: day 0, 1970-01-01, was a Thursday."""
    return day - (day + 3) % 7


def _weeks(days: dict) -> dict:
    """Daily sums merged into ISO weeks (Monday to Sunday, UTC)."""
    weeks: dict = {}
    for (day,), slot in days.items():
        week = weeks.setdefault((_week_start(int(day)),), dict.fromkeys(slot, 0))
        for field, value in slot.items():
            week[field] += value or 0
    return weeks


def _tags(conn: LedgerConnection, filters: Filters) -> dict:
    """Sums per tag of the requests' metadata.tags (kept in their provenance): a request with two tags counts under
    both. Read from the requests themselves (no rollup holds tags), within the filters' time range."""
    conds, params = _where(
        filters,
        {
            "route": "coalesce(route, '')",
            "key": "coalesce(key_id, '')",
            "policy": "coalesce(policy, '')",
            "status": "status",
        },
    )
    for bound, op in ((filters.since, ">="), (filters.until, "<")):
        if bound is not None:
            conds.append(f"created_at {op} ?")
            params.append(bound)
    if dialect_of(conn) is POSTGRESQL:
        source = "requests, jsonb_array_elements_text(coalesce(provenance::jsonb -> 'tags', '[]'::jsonb)) AS t(value)"
        conds.append("provenance IS NOT NULL AND jsonb_typeof(provenance::jsonb -> 'tags') = 'array'")
    else:
        source = "requests, json_each(requests.provenance, '$.tags') AS t"
        conds.append("provenance IS NOT NULL AND json_type(provenance, '$.tags') = 'array'")
    sql = f"SELECT t.value, {_RAW_REQUEST_SUMS} FROM {source} WHERE {' AND '.join(conds)} GROUP BY t.value"
    return {(row[0],): dict(zip(REQUEST_FIELDS, (v or 0 for v in row[1:]))) for row in conn.execute(sql, params)}


def group_label(by: str, value: Any) -> str | None:
    if by == "week":  # ISO year and week, e.g. 2026-W49 (Monday 2026-11-30)
        year, week, _ = datetime.fromtimestamp(int(value) * 86400, UTC).isocalendar()
        return f"{year}-W{week:02d}"
    if by == "day":
        return datetime.fromtimestamp(int(value) * 86400, UTC).strftime("%Y-%m-%d")
    if by == "hour":
        return datetime.fromtimestamp(int(value) * 3600, UTC).strftime("%Y-%m-%dT%H:00Z")
    return value if value != "" else None


def cost_row(group: str | None, slot: dict, *, calls: bool) -> dict:
    row: dict[str, Any] = {
        "group": group,
        "requests": None if calls else slot["requests"],
        "calls": slot["calls"] if calls else None,
        "prompt_tokens": slot["prompt_tokens"],
        "completion_tokens": slot["completion_tokens"],
        "total_tokens": slot["prompt_tokens"] + slot["completion_tokens"],
        "cost_usd": round(slot["cost_usd"], 10),
        # a leg's model has no always-long counterfactual of its own; savings are per request
        "counterfactual_cost_usd": None if calls else round(slot["counterfactual_cost_usd"], 10),
        "saving_usd": None if calls else round(slot["counterfactual_cost_usd"] - slot["cost_usd"], 10),
        # prompt tokens always-long would have sent (capped at the long model's window) less those sent:
        # meaningful at any price, also $0 local models
        "always_long_tokens": None if calls else slot["context_tokens"],
        "saved_tokens": None if calls else slot["context_tokens"] - slot["prompt_tokens"],
        "mean_latency_ms": (slot["latency_ms_sum"] / slot["latency_count"]) if slot["latency_count"] else None,
        # the provider prompt cache: requests (legs, for a model) that read it, prompt tokens read, what it saved
        "cache_hits": slot["cache_hits"],
        "cached_tokens": slot["cached_tokens"],
        "cache_saving_usd": round(slot["cache_saving_usd"], 10),
    }
    if calls:
        row["errors"] = slot["errors"]
    return row


def costs(conn: LedgerConnection, by: str, filters: Filters = Filters()) -> dict:
    """Requests, tokens, cost, always-long counterfactual and saving per group, plus the total; and per group the
    provider prompt cache's hits, cached prompt tokens and saving."""
    if by not in GROUPINGS:
        raise InvalidQuery(
            f"cannot group by {by!r}: use one of {', '.join(GROUPINGS)}", param="by", code="invalid_grouping"
        )
    calls = by == "model"
    if by == "week":
        groups = _weeks(aggregate(conn, ["day"], filters))
    elif by == "tag":
        groups = _tags(conn, filters)
    else:
        groups = aggregate(conn, [by], filters, calls=calls)
    rows = [cost_row(group_label(by, key[0]), slot, calls=calls) for key, slot in groups.items()]
    if by in ("day", "hour", "week"):
        rows.sort(key=lambda r: r["group"])
    else:
        rows.sort(key=lambda r: (-r["cost_usd"], r["group"] or ""))
    total = aggregate(conn, [], filters).get((), dict.fromkeys(REQUEST_FIELDS, 0))
    total_row = cost_row(None, total, calls=False)
    unpriced = unpriced_models(conn, filters)
    if calls:
        names = {u["model"] for u in unpriced}
        for row in rows:
            row["unpriced"] = row["group"] in names
    return {"by": by, "groups": rows, "total": total_row, "unpriced_models": unpriced}


def unpriced_models(conn: LedgerConnection, filters: Filters = Filters()) -> list[dict]:
    """Models whose calls in the range had no known price (recorded at $0, flagged by migration 006), with
    how many calls and tokens that $0 stands for. Reads only flagged calls (a partial index)."""
    conds, params = _where(filters, {"route": "r.route", "key": "r.key_id", "policy": "r.policy", "status": "r.status"})
    conds.insert(0, "c.unpriced = 1")
    if filters.since is not None:  # the request's time, as every other report counts a leg
        conds.append("r.created_at >= ?")
        params.append(filters.since)
    if filters.until is not None:
        conds.append("r.created_at < ?")
        params.append(filters.until)
    use = dialect_of(conn).use_index
    sql = (
        "SELECT c.model, count(*), sum(c.prompt_tokens), sum(c.completion_tokens)"
        f" FROM upstream_calls c{use('upstream_calls_unpriced')} JOIN requests r ON r.id = c.request_id"
        f" WHERE {' AND '.join(conds)} GROUP BY c.model ORDER BY c.model"
    )
    return [
        {"model": model, "calls": n, "prompt_tokens": prompt or 0, "completion_tokens": completion or 0}
        for model, n, prompt, completion in conn.execute(sql, params)
    ]


# ---------------------------------------------------------------------------------------------- requests


def _request_conditions(filters: Filters) -> tuple[list[str], list]:
    cols = {"route": "route", "key": "key_id", "policy": "policy", "status": "status"}
    conds, params = _where(filters, cols)
    if filters.since is not None:
        conds.append("created_at >= ?")
        params.append(filters.since)
    if filters.until is not None:
        conds.append("created_at < ?")
        params.append(filters.until)
    return conds, params


def encode_cursor(created_at: float, request_id: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([created_at, request_id]).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        created_at, request_id = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        return float(created_at), str(request_id)
    except (ValueError, TypeError, binascii.Error):
        raise InvalidQuery(
            "cannot read this cursor: pass back next_cursor unchanged", param="cursor", code="invalid_cursor"
        ) from None


def row_dict(row: Any) -> dict:
    item = {name: row[name] for name in REQUEST_FIELDS_STORED}
    item["stream"] = bool(item["stream"])
    return item


def attach_models(conn: LedgerConnection, items: list[dict]) -> None:
    by_id = {item["id"]: item for item in items}
    for item in items:
        item["models"] = []
    ids = list(by_id)
    for start in range(0, len(ids), 500):  # stay under SQLite's bound-parameter limit
        chunk = ids[start : start + 500]
        sql = (
            f"SELECT request_id, model FROM upstream_calls WHERE request_id IN ({', '.join('?' * len(chunk))})"
            " ORDER BY id"
        )
        for row in conn.execute(sql, chunk):
            by_id[row[0]]["models"].append(row[1])


def list_requests(
    conn: LedgerConnection, filters: Filters = Filters(), *, limit: int = 50, cursor: str | None = None
) -> dict:
    """Newest first, `limit` a page; `next_cursor` continues after the last one (stable under inserts)."""
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidQuery(f"limit must be between 1 and {MAX_PAGE}", param="limit", code="invalid_limit")
    conds, params = _request_conditions(filters)
    if cursor:
        created_at, request_id = decode_cursor(cursor)
        conds.append("(created_at < ? OR (created_at = ? AND id < ?))")
        params.extend([created_at, created_at, request_id])
    where = f" WHERE {' AND '.join(conds)}" if conds else ""
    sql = f"SELECT {', '.join(REQUEST_FIELDS_STORED)} FROM requests{where} ORDER BY created_at DESC, id DESC LIMIT ?"
    rows = conn.execute(sql, [*params, limit + 1]).fetchall()
    items = [row_dict(row) for row in rows[:limit]]
    attach_models(conn, items)
    more = len(rows) > limit
    last = items[-1] if items else None
    next_cursor = encode_cursor(last["created_at"], last["id"]) if more and last else None
    return {"object": "list", "data": items, "has_more": more, "next_cursor": next_cursor}


def _detail(conn: LedgerConnection, row: Any) -> dict:
    item = row_dict(row)
    item["saving_usd"] = item["counterfactual_cost_usd"] - item["cost_usd"]
    item["provenance"] = json.loads(row["provenance"]) if row["provenance"] else None
    item["calls"] = [
        dict(zip(CALL_FIELDS, call))
        for call in conn.execute(
            f"SELECT {', '.join(CALL_FIELDS)} FROM upstream_calls WHERE request_id = ? ORDER BY id", (item["id"],)
        )
    ]
    item["models"] = [call["model"] for call in item["calls"]]
    return item


def get_request(conn: LedgerConnection, request_id: str) -> dict:
    """One request with its upstream legs and provenance; 404 if unknown."""
    row = conn.execute(
        f"SELECT {', '.join(REQUEST_FIELDS_STORED)}, provenance FROM requests WHERE id = ?", (request_id,)
    ).fetchone()
    if row is None:
        raise NotFound(f"no request with id {request_id!r} in the ledger", param="id", code="request_not_found")
    return _detail(conn, row)


def find_requests(conn: LedgerConnection, request_id: str, *, limit: int = 20) -> list[dict]:
    """The request with this gateway id, else those the client sent with this X-Request-Id (a client may reuse
    one), newest first, each with its legs and provenance; 404 if none."""
    row = conn.execute(
        f"SELECT {', '.join(REQUEST_FIELDS_STORED)}, provenance FROM requests WHERE id = ?", (request_id,)
    ).fetchone()
    rows = (
        [row]
        if row is not None
        else conn.execute(
            f"SELECT {', '.join(REQUEST_FIELDS_STORED)}, provenance FROM requests WHERE client_request_id = ?"
            " ORDER BY created_at DESC, id DESC LIMIT ?",
            (request_id, limit),
        ).fetchall()
    )
    if not rows:
        raise NotFound(
            f"no request with id {request_id!r} in the ledger (neither the gateway's id nor a client's X-Request-Id)",
            param="id",
            code="request_not_found",
        )
    return [_detail(conn, r) for r in rows]


# --follow on PostgreSQL: there is no rowid in write order, so it re-reads the rows created in the last
# FOLLOW_LAG seconds and prints those not yet seen (a request's row lands when it ends, after its created_at)
FOLLOW_LAG = 600.0


@dataclass
class FollowPosition:
    """Where --follow stands: SQLite, the last rowid; PostgreSQL, a created_at watermark and the ids seen near it."""

    rowid: int = 0
    since: float = -math.inf
    seen: dict[str, float] | None = None


def follow_position(conn: LedgerConnection) -> FollowPosition:
    """The end of the ledger now: what `requests_after` should start after."""
    if dialect_of(conn) is not POSTGRESQL:
        return FollowPosition(rowid=conn.execute("SELECT coalesce(max(rowid), 0) FROM requests").fetchone()[0])
    newest = conn.execute("SELECT max(created_at) FROM requests").fetchone()[0]
    if newest is None:
        return FollowPosition(seen={})
    rows = conn.execute("SELECT id, created_at FROM requests WHERE created_at >= ?", (newest - FOLLOW_LAG,))
    return FollowPosition(since=newest, seen={row[0]: row[1] for row in rows})


def requests_after(
    conn: LedgerConnection, position: FollowPosition | None, filters: Filters = Filters(), *, limit: int = 1000
) -> tuple[list[dict], FollowPosition]:
    """Rows written after `position` (None: from the start), in write order as near as the engine tells."""
    position = position or FollowPosition(seen={})
    conds, params = _request_conditions(filters)
    if dialect_of(conn) is not POSTGRESQL:
        conds.insert(0, "rowid > ?")
        sql = (
            f"SELECT rowid, {', '.join(REQUEST_FIELDS_STORED)} FROM requests WHERE {' AND '.join(conds)}"
            " ORDER BY rowid LIMIT ?"
        )
        rows = conn.execute(sql, [position.rowid, *params, limit]).fetchall()
        items = [row_dict(row) for row in rows]
        attach_models(conn, items)
        return items, FollowPosition(rowid=rows[-1]["rowid"] if rows else position.rowid)
    seen = dict(position.seen or {})
    if position.since != -math.inf:
        conds.insert(0, "created_at >= ?")
        params.insert(0, position.since - FOLLOW_LAG)
    where = f" WHERE {' AND '.join(conds)}" if conds else ""
    rows = conn.execute(
        f"SELECT {', '.join(REQUEST_FIELDS_STORED)} FROM requests{where} ORDER BY created_at, id", params
    ).fetchall()
    items = [row_dict(row) for row in rows if row["id"] not in seen][:limit]
    attach_models(conn, items)
    since = max([position.since, *(item["created_at"] for item in items)])
    seen.update((item["id"], item["created_at"]) for item in items)
    seen = {rid: at for rid, at in seen.items() if at >= since - FOLLOW_LAG}
    return items, FollowPosition(since=since, seen=seen)


def iter_export(conn: LedgerConnection, filters: Filters = Filters(), *, batch: int = 2000) -> Iterator[dict]:
    """Every matching request, oldest first, with its legs and provenance; streams in batches."""
    conds, params = _request_conditions(filters)
    after: tuple[float, str] | None = None
    while True:
        page_conds, page_params = list(conds), list(params)
        if after is not None:
            page_conds.append("(created_at > ? OR (created_at = ? AND id > ?))")
            page_params.extend([after[0], after[0], after[1]])
        where = f" WHERE {' AND '.join(page_conds)}" if page_conds else ""
        rows = conn.execute(
            f"SELECT {', '.join(REQUEST_FIELDS_STORED)}, provenance FROM requests{where} ORDER BY created_at, id LIMIT ?",
            [*page_params, batch],
        ).fetchall()
        if not rows:
            return
        items = {}
        for row in rows:
            item = row_dict(row)
            item["provenance"] = json.loads(row["provenance"]) if row["provenance"] else None
            item["calls"] = []
            items[item["id"]] = item
        ids = list(items)
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            for call in conn.execute(
                f"SELECT request_id, {', '.join(CALL_FIELDS)} FROM upstream_calls"
                f" WHERE request_id IN ({', '.join('?' * len(chunk))}) ORDER BY id",
                chunk,
            ):
                items[call[0]]["calls"].append(dict(zip(CALL_FIELDS, call[1:])))
        yield from items.values()
        after = (rows[-1]["created_at"], rows[-1]["id"])
