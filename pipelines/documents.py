"""The document type every pipeline takes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Document:
    id: str
    text: str
    title: str | None = None
    source: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


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
