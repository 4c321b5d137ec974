"""The document store, by concern: the LanceDB store (document_store: tables, ingestion, search; its LanceDB errors
in lance_errors, its filters in filters), the inline collections of attached documents (inline: naming secret,
usage records, idle eviction) and the in-memory chunk vectors (vectors). Callers import from here."""

from pipelines.store.document_store import (
    CollectionInfo,
    DocumentInfo,
    DocumentStore,
    IngestCancelled,
    IngestEngine,
    IngestReport,
    prepare_document,
)
from pipelines.store.locks import KeyedLocks
from pipelines.store.names import check_writable_name, content_hash, is_inline, validate_collection_name
from pipelines.store.vectors import ChunkVectors

__all__ = [
    "ChunkVectors",
    "CollectionInfo",
    "DocumentInfo",
    "DocumentStore",
    "IngestCancelled",
    "IngestEngine",
    "IngestReport",
    "KeyedLocks",
    "check_writable_name",
    "content_hash",
    "is_inline",
    "prepare_document",
    "validate_collection_name",
]
