"""The upstreams' own errors: what went wrong with a model provider, by kind, with a message a client may see (already
scrubbed: gateway.upstreams.base.client_safe), the model, and for a request an upstream cannot serve the field at
fault (param) and a stable code.

They carry no HTTP status: the server maps each class to its status once (gateway.server.errors.failure), as it does
routing's, the ledger's and the document store's errors. `provider_side` says whether another model may do better
(the long route's alternates): the provider failed, not the request.
"""

from __future__ import annotations


class UpstreamError(Exception):
    """A model provider's failure, or a request an upstream cannot serve."""

    code = "upstream_error"
    provider_side = True  # another provider may answer (timeouts, rate limits, 5xx, broken answers)

    def __init__(
        self,
        message: str,
        *,
        model: str | None = None,
        param: str | None = None,
        code: str | None = None,
        provider_status: int | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.model = model
        self.param = param
        self.code = code or type(self).code
        self.provider_status = provider_status  # the provider's HTTP status, when it answered with one
        self.retry_after: float | None = None  # the provider's Retry-After, in seconds, when it sent one


class UpstreamUnreachable(UpstreamError):
    """No connection to the provider, or it broke before an answer."""

    code = "upstream_unreachable"


class UpstreamTimeout(UpstreamError):
    """The provider took longer than the policy's timeout (or said 408/504)."""

    code = "upstream_timeout"


class UpstreamRateLimited(UpstreamError):
    """The provider said 429."""

    code = "upstream_rate_limited"


class UpstreamCredentialsRefused(UpstreamError):
    """The provider refused the gateway's credentials (401/403): not the client's fault, nor its business."""

    code = "upstream_authentication_failed"


class UpstreamFailed(UpstreamError):
    """The provider failed (5xx, a local model's crash)."""


class MalformedAnswer(UpstreamFailed):
    """The provider answered something that is not the chat completion (or stream) the gateway relies on."""


class UpstreamUnavailable(UpstreamError):
    """This gateway has no upstream for the model (a provider or the in-process model it does not hold)."""

    code = "provider_unavailable"


class UpstreamRejected(UpstreamError):
    """The provider rejected the request (400, 404, 413, 422): its status is kept (provider_status)."""

    code = "upstream_rejected_request"
    provider_side = False


class UnsupportedRequest(UpstreamError):
    """A request this upstream cannot serve as sent (a parameter the local model lacks, a remote URL litellm would
    fetch, a prompt over the local model's window): the client must change it."""

    code = "invalid_request"
    provider_side = False
