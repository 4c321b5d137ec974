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
