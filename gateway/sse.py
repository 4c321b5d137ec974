"""Server-sent events in OpenAI's streaming shape."""
from __future__ import annotations

import json
from typing import Any

DONE = b"data: [DONE]\n\n"


def sse_event(data: bytes) -> bytes:
    return b"data: " + data + b"\n\n"


def sse_json(payload: dict[str, Any]) -> bytes:
    return sse_event(json.dumps(payload).encode())


def chunk_usage(data: bytes) -> dict[str, Any] | None:
    """The usage object of a chunk, if it carries one; the substring test avoids parsing most chunks."""
    if b'"usage"' not in data:
        return None
    usage = json.loads(data).get("usage")
    return usage if isinstance(usage, dict) else None


def is_usage_only_chunk(data: bytes) -> bool:
    return b'"usage"' in data and not json.loads(data).get("choices")


def completion_to_chunks(completion: dict[str, Any], include_usage: bool) -> list[bytes]:
    """Replay a finished chat.completion as stream chunks (used when the answer was held back)."""
    base = {
        "id": completion.get("id"),
        "object": "chat.completion.chunk",
        "created": completion.get("created"),
        "model": completion.get("model"),
    }
    if completion.get("system_fingerprint"):
        base["system_fingerprint"] = completion["system_fingerprint"]
    chunks = []
    for choice in completion.get("choices", []):
        message = choice.get("message") or {}
        index = choice.get("index", 0)
        first_delta = {"role": message.get("role", "assistant"), "content": message.get("content") or ""}
        if message.get("tool_calls"):
            first_delta["tool_calls"] = [{**call, "index": i} for i, call in enumerate(message["tool_calls"])]
        chunks.append({**base, "choices": [{"index": index, "delta": first_delta, "finish_reason": None}]})
        chunks.append({**base, "choices": [{"index": index, "delta": {}, "finish_reason": choice.get("finish_reason")}]})
    if include_usage and completion.get("usage"):
        chunks.append({**base, "choices": [], "usage": completion["usage"]})
    return [json.dumps(c).encode() for c in chunks]
