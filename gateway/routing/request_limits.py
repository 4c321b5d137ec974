"""Bounded work per request: the policy's request_limits on attached documents and embedding inputs, checked before
anything is scanned, counted, split or embedded for them (InvalidRequest for too many, RequestTooLarge for too many
bytes: the client's 400 and 413, gateway.server.errors)."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.routing.errors import InvalidRequest, RequestTooLarge
from policies.schema import RequestLimits


def _bytes(texts: Sequence[str]) -> int:
    # a UTF-8 character is 1-4 bytes: a set of at most limit/4 characters is under the limit without encoding it
    return sum(len(t.encode("utf-8")) for t in texts)


def check_documents(limits: RequestLimits, texts: Sequence[str], param: str) -> None:
    """The texts of the documents one request attaches or posts."""
    if len(texts) > limits.attached_documents:
        raise InvalidRequest(
            f"{len(texts)} documents in one request; the limit is {limits.attached_documents} "
            "(request_limits.attached_documents): ingest them into a collection in batches and "
            "ask by name",
            param=param,
            code="too_many_documents",
        )
    if sum(len(t) for t in texts) * 4 > limits.attached_bytes and _bytes(texts) > limits.attached_bytes:
        raise RequestTooLarge(
            f"the documents of one request hold more than {limits.attached_bytes} bytes "
            "(request_limits.attached_bytes): ingest them into a collection and ask by name",
            param=param,
            code="documents_too_large",
        )


def check_embedding_inputs(limits: RequestLimits, texts: Sequence[str]) -> None:
    if len(texts) > limits.embedding_inputs:
        raise InvalidRequest(
            f"{len(texts)} inputs in one embeddings request; the limit is "
            f"{limits.embedding_inputs} (request_limits.embedding_inputs): send them in batches",
            param="input",
            code="too_many_inputs",
        )
    if sum(len(t) for t in texts) * 4 > limits.embedding_input_bytes and _bytes(texts) > limits.embedding_input_bytes:
        raise RequestTooLarge(
            f"the inputs of one embeddings request hold more than {limits.embedding_input_bytes} "
            "bytes (request_limits.embedding_input_bytes): send them in batches",
            param="input",
            code="input_too_large",
        )
