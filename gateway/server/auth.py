"""API keys: from an environment variable or a keys file; kept and logged only as hashes."""
from __future__ import annotations

import hashlib
import hmac
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from starlette.requests import Request

from gateway.errors import GatewayError
from gateway.ledger.records import key_id

logger = logging.getLogger(__name__)

KEYS_ENV = "SELFROUTE_API_KEYS"  # comma-separated
ADMIN_KEY_ENV = "SELFROUTE_ADMIN_KEY"


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


@dataclass(frozen=True)
class Caller:
    key_id: str | None  # None when the gateway is open
    admin: bool


def read_keys_file(path: str | Path) -> list[str]:
    """One key a line; blank lines and lines starting with # are ignored."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


class Authenticator:
    def __init__(self, keys: list[str] | None = None, admin_key: str | None = None):
        self._digests = {_digest(k): key_id(k) for k in (keys or [])}
        self._admin = _digest(admin_key) if admin_key else None
        if self._admin is not None:
            self._digests.setdefault(self._admin, key_id(admin_key or ""))

    @classmethod
    def from_environment(cls, keys_file: str | Path | None = None) -> "Authenticator":
        keys = [k.strip() for k in os.environ.get(KEYS_ENV, "").split(",") if k.strip()]
        if keys_file:
            keys += read_keys_file(keys_file)
        return cls(keys, os.environ.get(ADMIN_KEY_ENV) or None)

    @property
    def open(self) -> bool:
        return not self._digests

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

    def check(self, request: Request) -> Caller:
        """The caller of an API endpoint; raises 401 for a missing or unknown key."""
        presented = self._presented(request)
        if self.open:
            return Caller(key_id(presented) if presented else None, admin=False)
        if not presented:
            raise GatewayError(401, "missing API key: send 'Authorization: Bearer <key>'", code="missing_api_key")
        kid = self._match(presented)
        if kid is None:
            raise GatewayError(401, "incorrect API key provided", code="invalid_api_key")
        admin = self._admin is not None and hmac.compare_digest(self._admin, _digest(presented))
        return Caller(kid, admin=admin)

    def check_admin(self, request: Request) -> Caller:
        """Admin endpoints need the admin key; with no admin key configured they are open only if the gateway is."""
        if self._admin is None:
            if self.open:
                return Caller(None, admin=True)
            raise GatewayError(403, f"admin endpoints are disabled: set {ADMIN_KEY_ENV}", code="admin_disabled")
        caller = self.check(request)
        if not caller.admin:
            raise GatewayError(403, "this endpoint needs the admin key", code="admin_key_required")
        return caller
