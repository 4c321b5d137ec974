"""The document store's own errors (light to import: the server maps them without loading LanceDB)."""
from __future__ import annotations


class StoreUnavailable(Exception):
    """The document store cannot be read or written now: the object store (S3, MinIO) is unreachable or failing,
    or the local disk refused. The detail is logged, not shown to clients: it names endpoints and buckets."""

    message = "the document store is unavailable; try again shortly"
