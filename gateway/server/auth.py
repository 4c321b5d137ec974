"""API keys: named keys from the ledger database (gateway.ledger.keys), keys from an environment variable
or a keys file, and the admin key ($SELFROUTE_ADMIN_KEY, or a stored one made by `selfroute keys create --admin`).
Keys are kept and logged only as hashes.

A named key is looked up in the database at most every CACHE_S seconds per process, so a key revoked by
`selfroute keys revoke` in another process stops working within that time (at once in this process).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from starlette.requests import Request

from gateway.errors import GatewayError
from gateway.ledger.keys import KEY_PREFIX, KeyStore, NamedKey
from gateway.ledger.records import key_id

logger = logging.getLogger(__name__)

KEYS_ENV = "SELFROUTE_API_KEYS"  # comma-separated
ADMIN_KEY_ENV = "SELFROUTE_ADMIN_KEY"
CACHE_S = 2.0
MAX_KEY_CHARS = 512


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


@dataclass(frozen=True)
class Caller:
    key_id: str | None  # None when the gateway is open; a named key's name; else k_<sha256 prefix>
    admin: bool
    key: NamedKey | None = None  # the named key, with its limits and grants
    open: bool = False  # the gateway has no keys at all: every caller may do everything


def read_keys_file(path: str | Path) -> list[str]:
    """One key a line; blank lines and lines starting with # are ignored."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


class Authenticator:
    def __init__(self, keys: list[str] | None = None, admin_key: str | None = None, store: KeyStore | None = None):
        self._digests = {_digest(k): key_id(k) for k in (keys or [])}
        self._admin = _digest(admin_key) if admin_key else None
        if self._admin is not None:
            self._digests.setdefault(self._admin, key_id(admin_key or ""))
        self.store = store
        self._lock = threading.Lock()
        self._named: dict[bytes, tuple[float, NamedKey | None]] = {}
        self._any_named: tuple[float, bool] = (0.0, False)
        self._stored_admin: tuple[float, bool] = (0.0, False)

    @classmethod
    def from_environment(cls, keys_file: str | Path | None = None, store: KeyStore | None = None) -> Authenticator:
        keys = [k.strip() for k in os.environ.get(KEYS_ENV, "").split(",") if k.strip()]
        if keys_file:
            keys += read_keys_file(keys_file)
        return cls(keys, os.environ.get(ADMIN_KEY_ENV) or None, store)

    def forget(self) -> None:
        """Drop cached lookups (after a key was created or revoked in this process)."""
        with self._lock:
            self._named.clear()
            self._any_named = (0.0, False)
            self._stored_admin = (0.0, False)

    def _has_named_keys(self) -> bool:
        if self.store is None:
            return False
        checked, found = self._any_named
        if time.monotonic() - checked > CACHE_S:
            found = self.store.any_keys()
            self._any_named = (time.monotonic(), found)
        return found

    def _has_stored_admin(self) -> bool:
        """An admin key created by `selfroute keys create --admin` (kept hashed in the key store)."""
        if self.store is None:
            return False
        checked, found = self._stored_admin
        if time.monotonic() - checked > CACHE_S:
            found = self.store.has_admin_key()
            self._stored_admin = (time.monotonic(), found)
        return found

    @property
    def admin_configured(self) -> bool:
        return self._admin is not None or self._has_stored_admin()

    @property
    def open_before_keys(self) -> bool:
        """Whether the gateway is open when the key store holds no key (nothing from the environment)."""
        return not self._digests

    @property
    def open(self) -> bool:
        return not self._digests and not self._has_named_keys()

    def _presented(self, request: Request) -> str | None:
        header = request.headers.get("authorization", "")
        if header.lower().startswith("bearer "):
            return header[7:].strip() or None
        return request.headers.get("x-api-key") or None

    def _match(self, presented: str) -> str | None:
        digest = _digest(presented)
        for known, kid in self._digests.items():
            if hmac.compare_digest(known, digest):
                return kid
        return None

    def _named_key(self, presented: str) -> NamedKey | None:
        if self.store is None or not presented.startswith(KEY_PREFIX):
            return None
        digest = _digest(presented)
        cached = self._named.get(digest)
        now = time.monotonic()
        if cached is not None and now - cached[0] <= CACHE_S:
            named = cached[1]
        else:
            named = self.store.lookup(presented)
            with self._lock:
                if len(self._named) > 10_000:  # a flood of random keys must not grow this without bound
                    self._named.clear()
                self._named[digest] = (now, named)
        return named if named is not None and named.active() else None

    def check(self, request: Request) -> Caller:
        """The caller of an API endpoint; raises 401 for a missing or unknown key."""
        presented = self._presented(request)
        if presented is not None and len(presented) > MAX_KEY_CHARS:
            raise GatewayError(401, "incorrect API key provided", code="invalid_api_key")
        if self.open:
            return Caller(key_id(presented) if presented else None, admin=False, open=True)
        if not presented:
            raise GatewayError(401, "missing API key: send 'Authorization: Bearer <key>'", code="missing_api_key")
        named = self._named_key(presented)
        if named is not None:
            if named.admin:  # the stored admin key: no limits, every collection
                return Caller(named.name, admin=True)
            return Caller(named.name, admin=False, key=named)
        kid = self._match(presented)
        if kid is None:
            raise GatewayError(401, "incorrect API key provided", code="invalid_api_key")
        admin = self._admin is not None and hmac.compare_digest(self._admin, _digest(presented))
        return Caller(kid, admin=admin)

    def presents_admin_key(self, request: Request) -> bool:
        """True only when an admin key is configured and this request presents it; never raises (for open endpoints
        that show the admin more)."""
        presented = self._presented(request)
        if presented is None or len(presented) > MAX_KEY_CHARS:
            return False
        if self._admin is not None and hmac.compare_digest(self._admin, _digest(presented)):
            return True
        named = self._named_key(presented)
        return named is not None and named.admin

    def check_admin(self, request: Request) -> Caller:
        """Admin endpoints need the admin key ($SELFROUTE_ADMIN_KEY or one made by `selfroute keys create --admin`);
        with none configured they are open only if the gateway is."""
        if not self.admin_configured:
            if self.open:
                return Caller(None, admin=True, open=True)
            raise GatewayError(
                403,
                "admin endpoints need the admin key, and none is configured: create one with "
                f"`selfroute keys create --admin` (or set {ADMIN_KEY_ENV})",
                code="admin_disabled",
            )
        caller = self.check(request)
        if not caller.admin:
            raise GatewayError(403, "this endpoint needs the admin key", code="admin_key_required")
        return caller
