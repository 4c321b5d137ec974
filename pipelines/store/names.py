"""Collection names and document content hashes: what may be named, and what identifies a document's version."""

from __future__ import annotations

import re

from pipelines.documents import Document

# fullmatch, not match with "$": "$" also matches before a final newline
_COLLECTION_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
INLINE_PREFIX = "inline-"


def validate_collection_name(name: str) -> str:
    if not isinstance(name, str) or not _COLLECTION_NAME.fullmatch(name) or name.startswith("."):
        raise ValueError(
            f"invalid collection name {name!r}: use 1-128 letters, digits, '-', '_' or '.' (not starting with '.')"
        )
    return name


def check_writable_name(name: str) -> str:
    """A collection name a client or `selfroute ingest` may write to: valid, and not an inline collection's
    (`inline-*` is reserved for the documents attached to requests, which the gateway alone writes)."""
    validate_collection_name(name)
    if name.startswith(INLINE_PREFIX):
        raise ValueError(
            f"collection names starting with {INLINE_PREFIX!r} are reserved for the gateway's "
            "attached-document caches; choose another name"
        )
    return name


def is_inline(collection: str) -> bool:
    return collection.startswith(INLINE_PREFIX)


def content_hash(doc: Document) -> str:
    return doc.content_hash  # computed once per Document (pipelines.documents)
