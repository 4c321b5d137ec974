"""Routing's own errors: a request routing refuses, and what the client must change.

Plain exceptions with the message, the request field at fault (param) and a stable code; they carry no HTTP
status. The server maps each class to its status once (gateway.server.errors.failure), as it does the ledger's
and the document store's errors.
"""

from __future__ import annotations


class RoutingError(Exception):
    """A request that cannot be routed as sent."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class InvalidRequest(RoutingError):
    """The request is malformed for routing: conflicting or duplicate context, no question, too many documents or
    inputs, a question that does not fit a route's window, an invalid collection name."""


class RequestTooLarge(RoutingError):
    """Attached documents or embedding inputs over the policy's size caps (bytes or tokens)."""


class ModelNotFound(RoutingError):
    """A model name the gateway will not serve."""
