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
