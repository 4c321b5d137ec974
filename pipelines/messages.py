"""OpenAI chat messages: their text and their token count."""

from __future__ import annotations

from typing import Any

from pipelines.tokens import count_tokens

# Chat formats add a few tokens per message for the role and separators.
TOKENS_PER_MESSAGE = 4


def content_text(content: Any) -> str:
    """Text of a message's content: a string, or a list of parts of which the text parts count."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type", "text") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
        return "\n".join(texts)
    return str(content)


def count_message_tokens(messages: list[dict]) -> int:
    return sum(count_tokens(content_text(m.get("content"))) + TOKENS_PER_MESSAGE for m in messages)


def carry_history(messages: list[dict], max_tokens: int) -> list[dict]:
    """The caller's system messages and earlier turns (all but the final user turn) worth keeping.

    Newest turns are kept first while they fit in max_tokens; a turn that does not fit whole is dropped,
    which is what removes a pasted long document from the history once its passages go in the prompt.
    System messages are kept ahead of other turns. Order is preserved.
    """
    if not messages:
        return []
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=len(messages))
    earlier = list(enumerate(messages[:last_user]))
    keep: set[int] = set()
    left = max_tokens
    ordered = [p for p in earlier if p[1].get("role") == "system"] + [
        p for p in reversed(earlier) if p[1].get("role") != "system"
    ]
    for i, m in ordered:
        cost = count_tokens(content_text(m.get("content"))) + TOKENS_PER_MESSAGE
        if cost <= left:
            keep.add(i)
            left -= cost
    return [m for i, m in earlier if i in keep]
