"""Named API keys in the ledger database: create, list, revoke, look up. A key is shown once, at creation;
the database keeps a random salt and HMAC-SHA256(salt, key), plus the key's first characters so that a
presented key finds its row without trying every hash.

A named key's ledger id (requests.key_id) is its name, so the ledger and its reports show names and a
key's spend is what the ledger recorded under that name. Names are never reused, revoked ones included.
"""

from __future__ import annotations

import builtins  # KeyStore.list shadows the builtin in annotations after it
import hashlib
import hmac
import json
import math
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from gateway.ledger.database import connect, migrate
from gateway.ledger.dialect import (
    LedgerConnection,
    connect_postgres,
    integrity_error_types,
    is_postgres,
    reachable,
)
from gateway.ledger.errors import InvalidQuery, LedgerError, NotFound, Unavailable
from gateway.settings import private_file

KEY_PREFIX = "sr-"
PREFIX_CHARS = 12  # "sr-" and 9 random characters: ~54 bits, enough to find one row
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")  # fullmatch: "$" would let a final newline through
_COLUMNS = (
    "name",
    "prefix",
    "salt",
    "hash",
    "models",
    "collections",
    "budget_usd",
    "rpm",
    "tpm",
    "created_at",
    "expires_at",
    "revoked_at",
    "admin",
    "budget_period_s",
    "period_anchor",
)
ADMIN_NAME = "admin"  # the name `selfroute keys create --admin` gives the admin key unless told otherwise


_AGE = re.compile(r"^\s*(\d{1,6})\s*([mhdw])\s*$", re.IGNORECASE)
_AGE_SECONDS = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def expiry_time(age: str, now: float | None = None) -> float:
    """Unix seconds `age` from now: 30m, 12h, 30d, 8w."""
    match = _AGE.match(age or "")
    if not match or int(match.group(1)) == 0:
        raise InvalidQuery(
            f"cannot read expiry {str(age)[:40]!r}: use an age such as 30m, 12h, 30d or 8w",
            param="expires",
            code="invalid_expires",
        )
    return (time.time() if now is None else now) + int(match.group(1)) * _AGE_SECONDS[match.group(2).lower()]


def period_seconds(period: str) -> float:
    """A budget period (LiteLLM's budget_duration): 1h, 24h, 7d, 30d, 4w. Hours at least, since spend is counted
    from the hourly rollups."""
    match = _AGE.match(period or "")
    if not match or int(match.group(1)) == 0 or match.group(2).lower() == "m":
        raise InvalidQuery(
            f"cannot read budget period {str(period)[:40]!r}: use 1h, 24h, 7d, 30d or 4w",
            param="budget_period",
            code="invalid_budget_period",
        )
    return float(int(match.group(1)) * _AGE_SECONDS[match.group(2).lower()])


def describe_period(seconds: float) -> str:
    for unit, size in (("w", 7 * 86400), ("d", 86400), ("h", 3600)):
        if seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


class KeyConflict(LedgerError):
    """A key of that name exists (or existed: names are never reused)."""


@dataclass(frozen=True)
class NamedKey:
    name: str
    prefix: str
    models: tuple[str, ...] | None  # fnmatch patterns; None: any model
    collections: tuple[str, ...]  # collections granted beyond those the key creates
    budget_usd: float | None
    rpm: int | None
    tpm: int | None
    created_at: float
    expires_at: float | None
    revoked_at: float | None
    admin: bool = False  # the admin key: the admin endpoints and dashboard, every collection, no limits
    budget_period_s: float | None = None  # None: the budget holds for the key's whole life
    period_anchor: float | None = None  # budget periods start here (when the period was set), one after another
    rotated_at: float | None = None

    def active(self, now: float | None = None) -> bool:
        now = time.time() if now is None else now
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)

    def period_start(self, now: float | None = None) -> float | None:
        """When the budget's current period began, or None for a budget without a period."""
        if self.budget_period_s is None:
            return None
        now = time.time() if now is None else now
        anchor = self.period_anchor if self.period_anchor is not None else self.created_at
        return anchor + max(0.0, (now - anchor) // self.budget_period_s) * self.budget_period_s

    def to_dict(self, spend_usd: float | None = None, now: float | None = None) -> dict:
        start = self.period_start(now)
        item = {
            "name": self.name,
            "object": "api_key",
            "prefix": self.prefix,
            "admin": self.admin,
            "models": list(self.models) if self.models is not None else None,
            "collections": list(self.collections),
            "budget_usd": self.budget_usd,
            "budget_period": describe_period(self.budget_period_s) if self.budget_period_s else None,
            "period_start": start,
            "period_end": (
                start + self.budget_period_s if start is not None and self.budget_period_s is not None else None
            ),
            "rpm": self.rpm,
            "tpm": self.tpm,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "revoked_at": self.revoked_at,
            "rotated_at": self.rotated_at,
            "active": self.active(now),
        }
        if spend_usd is not None:
            item["spend_usd"] = spend_usd  # in the current period when the budget has one
        return item


def _hash(salt: str, key: str) -> str:
    return hmac.new(bytes.fromhex(salt), key.encode("utf-8"), hashlib.sha256).hexdigest()


def _row_key(row: Any) -> NamedKey:
    models = json.loads(row["models"]) if row["models"] is not None else None
    return NamedKey(
        name=row["name"],
        prefix=row["prefix"],
        models=tuple(models) if models is not None else None,
        collections=tuple(json.loads(row["collections"] or "[]")),
        budget_usd=row["budget_usd"],
        rpm=row["rpm"],
        tpm=row["tpm"],
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        revoked_at=row["revoked_at"],
        admin=bool(row["admin"]),
        budget_period_s=row["budget_period_s"],
        period_anchor=row["period_anchor"],
        rotated_at=row["rotated_at"],
    )


def _new_secret() -> tuple[str, str]:
    return KEY_PREFIX + secrets.token_urlsafe(32), secrets.token_hex(16)


def _check_lists(models: Any, collections: Any) -> None:
    for field, values in (("models", models), ("collections", collections)):
        if values is not None and not all(isinstance(v, str) and 0 < len(v) <= 256 for v in values):
            raise InvalidQuery(f"{field} must be a list of names", param=field, code=f"invalid_{field}")


# what `edit` leaves as it is (None is a value there: no limit, any model)
KEEP = object()


def validate_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name.startswith("k_"):
        raise InvalidQuery(
            f"invalid key name {name[:80]!r}: use 1-64 letters, digits, '.', '_' or '-' (not "
            "starting with 'k_', which marks keys from the environment)",
            param="name",
            code="invalid_key_name",
        )
    return name


def _positive(value: Any, name: str, kind: type = float) -> Any:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value > 1e12:
        raise InvalidQuery(f"{name} must be a positive number", param=name, code=f"invalid_{name}")
    return kind(value)


_P = ParamSpec("_P")
_T = TypeVar("_T")


def _reconnecting(method: Callable[Concatenate[KeyStore, _P], _T]) -> Callable[Concatenate[KeyStore, _P], _T]:
    """`reachable`, and an unavailable database drops the store's connections: the next call connects afresh. SQLite
    opens a file it cannot write read-only and that connection stays so; before, every --rpm key was 503 for good
    after the ledger file had been read-only a moment (the probe: 25 s immutable under a running gateway)."""
    checked = reachable(method)

    @wraps(method)
    def wrapper(self: KeyStore, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return checked(self, *args, **kwargs)
        except Unavailable:
            self.close()
            raise

    return wrapper


class KeyStore:
    """The api_keys table of one ledger database (a SQLite file or a postgresql:// URL shared by replicas); safe to
    share between threads."""

    def __init__(self, location: str | Path, busy_timeout: float | None = None):
        """busy_timeout: how long a SQLite lock held by another process, or a PostgreSQL call, is waited for (the
        gateway's request path passes database.REQUEST_BUSY_TIMEOUT_S: past it, the database is down); None: the
        CLI's SQLite 30 s, and PostgreSQL as long as it takes."""
        self.location: str | Path = location if is_postgres(location) else Path(location)
        self._busy_timeout = busy_timeout
        self._lock = threading.Lock()
        self._conn: LedgerConnection | None = None
        # lookups run on the event loop: their own connection, so they never queue behind a write that
        # waits for the ledger writer's lock (WAL readers do not wait for writers)
        self._read_lock = threading.Lock()
        self._reader: LedgerConnection | None = None

    def _db(self) -> LedgerConnection:
        if self._conn is not None and getattr(self._conn, "broken", False):
            self._conn.close()  # PostgreSQL restarted or failed over: connect again
            self._conn = None
        if self._conn is None:
            if is_postgres(self.location):
                # autocommit: a lone SELECT does not leave a transaction open; `with conn:` blocks are transactions
                conn = connect_postgres(str(self.location), autocommit=True, stall_s=self._busy_timeout)
            else:
                path = Path(self.location)  # not PostgreSQL: __init__ made it a Path
                path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                conn = connect(private_file(path), self._busy_timeout)
            migrate(conn)
            self._conn = conn
        return self._conn

    def _read_db(self) -> LedgerConnection:
        if self._reader is not None and getattr(self._reader, "broken", False):
            self._reader.close()
            self._reader = None
        if self._reader is None:
            with self._lock:
                self._db()  # the schema exists before the first read
            self._reader = (
                connect_postgres(str(self.location), autocommit=True, stall_s=self._busy_timeout)
                if is_postgres(self.location)
                else connect(self.location, self._busy_timeout)
            )
        return self._reader

    def close(self) -> None:
        with self._read_lock, self._lock:  # the order _read_db takes them in
            for conn in (self._conn, self._reader):
                if conn is not None:
                    conn.close()
            self._conn = self._reader = None

    @_reconnecting
    def create(
        self,
        name: str,
        *,
        models: list[str] | None = None,
        collections: list[str] | None = None,
        budget_usd: float | None = None,
        rpm: int | None = None,
        tpm: int | None = None,
        expires_at: float | None = None,
        admin: bool = False,
        budget_period_s: float | None = None,
    ) -> tuple[NamedKey, str]:
        """A new key: returns its record and the key itself, which is never available again. An admin key has no
        model list, grants or limits: it may do everything."""
        validate_name(name)
        _check_lists(models, collections)
        budget_usd = _positive(budget_usd, "budget_usd")
        rpm, tpm = _positive(rpm, "rpm", int), _positive(tpm, "tpm", int)
        budget_period_s = _positive(budget_period_s, "budget_period")
        if admin and any(v is not None for v in (models, collections, budget_usd, rpm, tpm, budget_period_s)):
            raise InvalidQuery(
                "the admin key has no model list, grants or limits: it may do everything",
                param="admin",
                code="invalid_admin_key",
            )
        now = time.time()
        if expires_at is not None and expires_at <= now:
            raise InvalidQuery("expires must be in the future", param="expires", code="invalid_expires")
        secret, salt = _new_secret()
        row = (
            name,
            secret[:PREFIX_CHARS],
            salt,
            _hash(salt, secret),
            json.dumps(list(models)) if models is not None else None,
            json.dumps(list(collections or [])),
            budget_usd,
            rpm,
            tpm,
            now,
            expires_at,
            None,
            int(admin),
            budget_period_s,
            now if budget_period_s is not None else None,
        )
        with self._lock:
            try:
                with self._db() as conn:
                    conn.execute(
                        f"INSERT INTO api_keys ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(row))})", row
                    )
            except integrity_error_types():
                raise KeyConflict(
                    f"a key named {name!r} exists or existed; names are never reused", param="name", code="key_exists"
                ) from None
        return self.get(name), secret

    @_reconnecting
    def get(self, name: str) -> NamedKey:
        with self._lock:
            row = self._db().execute("SELECT * FROM api_keys WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise NotFound(f"no key named {name[:80]!r}", param="name", code="key_not_found")
        return _row_key(row)

    @_reconnecting
    def exists(self, name: str) -> bool:
        with self._lock:
            return self._db().execute("SELECT 1 FROM api_keys WHERE name = ?", (name,)).fetchone() is not None

    @_reconnecting
    def list(self) -> list[NamedKey]:
        with self._lock:
            rows = self._db().execute("SELECT * FROM api_keys ORDER BY created_at").fetchall()
        return [_row_key(r) for r in rows]

    @_reconnecting
    def revoke(self, name: str) -> NamedKey:
        with self._lock, self._db() as conn:
            cursor = conn.execute(
                "UPDATE api_keys SET revoked_at = ? WHERE name = ? AND revoked_at IS NULL", (time.time(), name)
            )
        if cursor.rowcount == 0:
            self.get(name)  # raises NotFound for a name never created; a revoked key stays revoked
        return self.get(name)

    @_reconnecting
    def edit(
        self,
        name: str,
        *,
        models: Any = KEEP,
        collections: Any = KEEP,
        budget_usd: Any = KEEP,
        budget_period_s: Any = KEEP,
        rpm: Any = KEEP,
        tpm: Any = KEEP,
        expires_at: Any = KEEP,
    ) -> NamedKey:
        """Change a key's model list, grants and limits; what is not given stays. None clears a limit (and `models`:
        any model). A new budget period starts counting now."""
        key = self.get(name)
        if key.revoked_at is not None:
            raise InvalidQuery(f"key {name[:80]!r} is revoked", param="name", code="key_revoked")
        changes: dict = {}
        if models is not KEEP or collections is not KEEP:
            _check_lists(None if models is KEEP else models, None if collections is KEEP else collections)
        if models is not KEEP:
            changes["models"] = json.dumps(list(models)) if models is not None else None
        if collections is not KEEP:
            changes["collections"] = json.dumps(list(collections or []))
        for field, value, kind in (
            ("budget_usd", budget_usd, float),
            ("rpm", rpm, int),
            ("tpm", tpm, int),
            ("budget_period_s", budget_period_s, float),
        ):
            if value is not KEEP:
                changes[field] = _positive(value, field.removesuffix("_s"), kind)
        if "budget_period_s" in changes:
            changes["period_anchor"] = time.time() if changes["budget_period_s"] is not None else None
        if expires_at is not KEEP:
            if expires_at is not None and expires_at <= time.time():
                raise InvalidQuery("expires must be in the future", param="expires", code="invalid_expires")
            changes["expires_at"] = expires_at
        if key.admin and set(changes) - {"expires_at"}:
            raise InvalidQuery(
                "the admin key has no model list, grants or limits: it may do everything",
                param="admin",
                code="invalid_admin_key",
            )
        if changes:
            assignments = ", ".join(f"{column} = ?" for column in changes)
            with self._lock, self._db() as conn:
                conn.execute(f"UPDATE api_keys SET {assignments} WHERE name = ?", (*changes.values(), name))
        return self.get(name)

    @_reconnecting
    def rotate(self, name: str) -> tuple[NamedKey, str]:
        """A new secret for a key, keeping its name, limits, grants and spend; the old secret stops working (in this
        process at once, in others within the authenticator's cache time)."""
        key = self.get(name)
        if not key.active():
            raise InvalidQuery(f"key {name[:80]!r} is revoked or expired", param="name", code="key_inactive")
        secret, salt = _new_secret()
        with self._lock, self._db() as conn:
            conn.execute(
                "UPDATE api_keys SET prefix = ?, salt = ?, hash = ?, rotated_at = ? WHERE name = ?",
                (secret[:PREFIX_CHARS], salt, _hash(salt, secret), time.time(), name),
            )
        return self.get(name), secret

    @_reconnecting
    def lookup(self, presented: str) -> NamedKey | None:
        """The active key this secret belongs to, or None (unknown, revoked or expired)."""
        if not presented.startswith(KEY_PREFIX) or len(presented) > 256:
            return None
        with self._read_lock:
            rows = (
                self._read_db()
                .execute("SELECT * FROM api_keys WHERE prefix = ?", (presented[:PREFIX_CHARS],))
                .fetchall()
            )
        for row in rows:
            if hmac.compare_digest(row["hash"], _hash(row["salt"], presented)):
                key = _row_key(row)
                return key if key.active() else None
        return None

    @_reconnecting
    def any_keys(self) -> bool:
        """Whether a key that was not revoked exists (an expired one counts: a key running out must never open
        the gateway to everyone). Revoking the last key returns the gateway to its configured mode: open when no
        key comes from the environment, a keys file or $SELFROUTE_ADMIN_KEY (`selfroute keys revoke` says so)."""
        with self._read_lock:
            row = self._read_db().execute("SELECT 1 FROM api_keys WHERE revoked_at IS NULL LIMIT 1").fetchone()
        return row is not None

    @_reconnecting
    def has_admin_key(self) -> bool:
        """Whether an admin key that was not revoked is stored."""
        with self._read_lock:
            row = (
                self._read_db()
                .execute("SELECT 1 FROM api_keys WHERE admin = 1 AND revoked_at IS NULL LIMIT 1")
                .fetchone()
            )
        return row is not None

    @_reconnecting
    def budget_spent(self, key: NamedKey, now: float | None = None) -> float:
        """What counts against the key's budget: its spend in the current period (whole hours from the hourly
        rollups, the period's first partial hour from the requests themselves), else all its spend."""
        start = key.period_start(now)
        if start is None:
            return self.spend([key.name]).get(key.name, 0.0)
        first_hour = math.ceil(start / 3600)  # the first whole hour of the period
        with self._lock:
            db = self._db()
            hours = db.execute(
                "SELECT coalesce(sum(cost_usd), 0) FROM request_rollup_hourly WHERE key_id = ? AND hour >= ?",
                (key.name, first_hour),
            ).fetchone()[0]
            partial = db.execute(
                "SELECT coalesce(sum(cost_usd), 0) FROM requests WHERE key_id = ?"
                " AND created_at >= ? AND created_at < ?",
                (key.name, start, first_hour * 3600.0),
            ).fetchone()[0]
        return float(hours or 0.0) + float(partial or 0.0)

    def listing(self, now: float | None = None) -> builtins.list[dict]:
        """Every key as a dict (NamedKey.to_dict) with `spend_usd`, what counts against its budget (the current
        period's spend for a budget with a period), and `spend_total_usd`, all it ever spent."""
        lifetime = self.spend()
        items = []
        for key in self.list():
            total = lifetime.get(key.name, 0.0)
            spent = self.budget_spent(key, now) if key.budget_period_s else total
            items.append({**key.to_dict(spend_usd=spent, now=now), "spend_total_usd": total})
        return items

    @_reconnecting
    def spend(self, names: builtins.list[str] | None = None) -> dict[str, float]:
        """USD recorded in the ledger per key name (from the daily rollups: one row per day and group)."""
        with self._lock:
            if names is None:
                rows = (
                    self._db()
                    .execute(
                        "SELECT d.key_id, sum(d.cost_usd) FROM request_rollup_daily d JOIN api_keys k ON k.name = d.key_id"
                        " GROUP BY d.key_id"
                    )
                    .fetchall()
                )
            else:
                marks = ", ".join("?" * len(names))
                rows = (
                    self._db()
                    .execute(
                        f"SELECT key_id, sum(cost_usd) FROM request_rollup_daily WHERE key_id IN ({marks})"
                        " GROUP BY key_id",
                        names,
                    )
                    .fetchall()
                    if names
                    else []
                )
        return {row[0]: float(row[1] or 0.0) for row in rows}

    @_reconnecting
    def count_request(self, key_id: str, now: float | None = None) -> tuple[int, float]:
        """Count one admitted request in the key's current minute, shared by every process on this database:
        returns the minute's count including this one, and the seconds until the next minute."""
        now = time.time() if now is None else now
        minute = int(now // 60)
        with self._lock, self._db() as conn:
            conn.execute("DELETE FROM rate_windows WHERE key_id = ? AND minute < ?", (key_id, minute))
            count = conn.execute(
                "INSERT INTO rate_windows (key_id, minute, requests) VALUES (?, ?, 1) ON CONFLICT (key_id, minute)"
                " DO UPDATE SET requests = rate_windows.requests + 1 RETURNING requests",
                (key_id, minute),
            ).fetchone()[0]
        return int(count), (minute + 1) * 60 - now

    @_reconnecting
    def uncount_request(self, key_id: str, now: float | None = None) -> None:
        """Take back a request counted by count_request that was refused after all."""
        minute = int((time.time() if now is None else now) // 60)
        with self._lock, self._db() as conn:
            conn.execute(
                "UPDATE rate_windows SET requests = requests - 1 WHERE key_id = ? AND minute = ?", (key_id, minute)
            )

    @_reconnecting
    def tokens_since(self, key_id: str, since: float) -> tuple[int, float]:
        """Tokens the ledger recorded for a key since a moment (the TPM window), and when the oldest of those
        requests started."""
        with self._lock:
            row = (
                self._db()
                .execute(
                    "SELECT coalesce(sum(prompt_tokens + completion_tokens), 0), min(created_at) FROM requests"
                    " WHERE key_id = ? AND created_at >= ?",
                    (key_id, since),
                )
                .fetchone()
            )
        return int(row[0] or 0), float(row[1] if row[1] is not None else since)

    # -- collection ownership -------------------------------------------------------------------
    @_reconnecting
    def collection_owner(self, collection: str) -> str | None:
        with self._lock:
            row = (
                self._db().execute("SELECT owner FROM collection_owners WHERE collection = ?", (collection,)).fetchone()
            )
        return row[0] if row else None

    @_reconnecting
    def claim_collection(self, collection: str, owner: str) -> str:
        """Make `owner` the owner of a collection nobody owns yet; returns the owner it has now."""
        with self._lock, self._db() as conn:
            conn.execute(
                "INSERT INTO collection_owners (collection, owner, created_at) VALUES (?, ?, ?)"
                " ON CONFLICT (collection) DO NOTHING",
                (collection, owner, time.time()),
            )
            return conn.execute("SELECT owner FROM collection_owners WHERE collection = ?", (collection,)).fetchone()[0]

    @_reconnecting
    def collection_owners(self) -> dict[str, str]:
        with self._lock:
            rows = self._db().execute("SELECT collection, owner FROM collection_owners").fetchall()
        return {row[0]: row[1] for row in rows}
