"""The ledger's own errors. The server maps them to HTTP statuses (gateway.server.errors); the CLI prints them."""

from __future__ import annotations


class LedgerError(Exception):
    """Something about the ledger the caller must be told. `param` names the offending input, if any."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class InvalidQuery(LedgerError):
    """A filter, cursor, grouping or limit that cannot be read."""


class NotFound(LedgerError):
    """No ledger, or no such request in it."""


class Unavailable(LedgerError):
    """The ledger database cannot be reached or answer now (PostgreSQL down, restarting, failing over; SQLite
    locked past its timeout). The detail is logged, not shown: it names hosts and ports."""
