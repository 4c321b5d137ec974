"""The document type every pipeline takes."""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Document:
    id: str
    text: str
    title: str | None = None
    source: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @functools.cached_property
    def content_hash(self) -> str:
        """The digest of what the document says (text, title, metadata; not its id), once per instance: a request's
        attached document is looked up by it in several caches (the planner's key, its inline collection's name,
        what is pending), and a 479 kB document took ~8 ms of CPU each time (JSON and SHA-256; py-spy, round
        eleven). A Document is frozen; its metadata is never changed once it is built."""
        payload = json.dumps([self.text, self.title, self.metadata], sort_keys=True, ensure_ascii=False, default=str)
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()


# A title, id or section heading heads every unit and passage it labels in a prompt, so a long one is sent once per
# unit while a request's reservation counts the documents' text once: a 2,000-word title made the long leg's prompt
# 7x its documents' tokens (and its cost past the key's budget by as much). Labels show at most this much of a name.
LABEL_NAME_CHARS = 120


def label_name(name: str) -> str:
    """`name` as a prompt label shows it: whole up to LABEL_NAME_CHARS characters, else cut there with an ellipsis."""
    return name if len(name) <= LABEL_NAME_CHARS else name[: LABEL_NAME_CHARS - 1] + "…"


def document_label(doc_id: str, title: str | None) -> str:
    """How a prompt label names a document (a long-context unit's, a rag passage's): its title and id, or its id alone
    when it has no other title, each as label_name shows it."""
    doc = label_name(doc_id)
    return f"{label_name(title)} ({doc})" if title and title != doc_id else doc
