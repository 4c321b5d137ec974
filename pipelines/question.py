"""The question and its context in a plain long prompt (no collection, no attached documents)."""

from __future__ import annotations

import re

from pipelines.messages import content_text

_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")
# a trailing "Answer:" cue after the question is prompt scaffolding, not part of the question
_ANSWER_CUE = re.compile(r"\n\s*(?:answer|a|回答|答案)\s*[:：]\s*$", re.IGNORECASE)


def _split_last_paragraph(text: str) -> tuple[str, str]:
    stripped = text.rstrip()
    breaks = list(_PARAGRAPH_BREAK.finditer(stripped))
    if not breaks:
        return stripped.strip(), ""
    cut = breaks[-1]
    return stripped[cut.end() :].strip(), stripped[: cut.start()]


def extract_question(messages: list[dict], marker: str | None = None) -> tuple[str, str]:
    """(question, context_text) from a conversation whose last user turn asks about pasted text.

    The question is the text after the last occurrence of `marker` (case-insensitive) in the last user
    turn, or, without a marker or when it is absent, the turn's final paragraph. The context is the
    text of every message in order (system and earlier turns included), with the question removed
    from the last user turn.
    """
    texts = [(m.get("role"), content_text(m.get("content"))) for m in messages]
    last_user = max((i for i, (role, _) in enumerate(texts) if role == "user"), default=None)
    if last_user is None:
        raise ValueError("the conversation has no user message to take a question from")
    turn = _ANSWER_CUE.sub("", texts[last_user][1].rstrip())
    question, rest = "", turn
    if marker:
        at = turn.lower().rfind(marker.lower())
        if at >= 0:
            question, rest = turn[at + len(marker) :].strip(), turn[:at]
    if not question:
        question, rest = _split_last_paragraph(turn)
    parts = [text for i, (_, text) in enumerate(texts) if i != last_user and text.strip()]
    parts.insert(sum(1 for i, (_, t) in enumerate(texts[:last_user]) if t.strip()), rest.strip())
    context = "\n\n".join(p for p in parts if p)
    return question, context
