"""Recognises a model's "the passages do not contain the answer" replies."""

from __future__ import annotations

import re

from pipelines.settings import DEFAULT_UNANSWERABLE_PATTERNS

# A refusal is what the reply opens with; an answer that mentions, deep inside, that some detail is
# "not mentioned in the text" still answers. Only the opening of the reply is matched.
HEAD_CHARS = 240


class UnanswerableDetector:
    def __init__(self, patterns: list[str] | None = None, head_chars: int = HEAD_CHARS):
        patterns = DEFAULT_UNANSWERABLE_PATTERNS if patterns is None else patterns
        self.patterns = [re.compile(p, re.IGNORECASE) for p in patterns]
        self.head_chars = head_chars

    def is_unanswerable(self, text: str | None) -> bool:
        if text is None or not text.strip():
            return True
        head = " ".join(text.split())[: self.head_chars]
        return any(p.search(head) for p in self.patterns)
