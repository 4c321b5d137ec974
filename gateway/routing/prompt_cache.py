"""Provider prompt caching on the long route.

The long pipeline renders documents first and the question last, so consecutive questions on the same documents
share a long prompt prefix. OpenAI (and OpenAI-compatible servers with prefix caching) cache such a prefix by
themselves; Anthropic caches only what the request marks, so for Anthropic models the document block becomes its
own content part carrying `cache_control: {"type": "ephemeral"}` (litellm passes it through). Only a block that
will come back unchanged is marked: every unit of the documents sent, in reading order. A block chosen per question
(documents larger than the window, or `edges` placement) would be written to the cache at Anthropic's 1.25x input
price each time and seldom read.
"""

from __future__ import annotations

from typing import Any

from pipelines.long_context import split_question
from policies.routes import LONG
from policies.schema import ModelConfig

EPHEMERAL = {"type": "ephemeral"}
# litellm model strings whose provider caches only marked blocks (Anthropic, directly or through a cloud)
_MARKED_PREFIXES = ("anthropic/", "bedrock/", "vertex_ai/", "claude")


def needs_cache_control(config: ModelConfig) -> bool:
    """The policy's `cache_control` when set, else on for Claude models."""
    if config.cache_control is not None:
        return config.cache_control
    model = config.model.lower()
    return model.startswith(_MARKED_PREFIXES) and "claude" in model


def stable_document_block(provenance: dict[str, Any]) -> bool:
    """The long route sent every unit in reading order: the same documents give the same block next time."""
    return (
        provenance.get("route") == LONG
        and bool(provenance.get("all_fitted"))
        and provenance.get("placement") == "reading"
    )


def mark_document_block(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with the final user turn split into [documents (cache_control), question] content parts."""
    if not messages or messages[-1].get("role") != "user" or not isinstance(messages[-1].get("content"), str):
        return messages
    prefix, question = split_question(messages[-1]["content"])
    if not question:
        return messages
    parts = [{"type": "text", "text": prefix, "cache_control": EPHEMERAL}, {"type": "text", "text": question}]
    return [*messages[:-1], {**messages[-1], "content": parts}]
