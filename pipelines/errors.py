"""The document store's own errors (light to import: the server maps them without loading LanceDB)."""

from __future__ import annotations


class StoreUnavailable(Exception):
    """The document store cannot be read or written now: the object store (S3, MinIO) is unreachable or failing,
    or the local disk refused. The detail is logged, not shown to clients: it names endpoints and buckets."""

    message = "the document store is unavailable; try again shortly"


class CollectionNotFound(KeyError):
    """A collection that was to be read does not exist (any more): deleted, or an inline collection dropped by the
    cache of attached documents, perhaps by another replica sharing the store."""

    def __init__(self, collection: str):
        super().__init__(collection)
        self.collection = collection
        self.message = f"no collection named {collection!r}"

    def __str__(self) -> str:
        return self.message
