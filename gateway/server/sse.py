"""Server-sent events in OpenAI's streaming shape."""

from __future__ import annotations

import json
from typing import Any

DONE = b"data: [DONE]\n\n"


def sse_event(data: bytes) -> bytes:
    return b"data: " + data + b"\n\n"


def sse_json(payload: dict[str, Any]) -> bytes:
    return sse_event(json.dumps(payload).encode())
