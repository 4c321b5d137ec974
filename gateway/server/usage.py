"""What a client is told a request used and cost, from its ledger record: every leg together.

An escalated answer (`rag>long`) has two legs or more (the cheap attempt, the long answer, a failed alternate);
the upstream's `usage` covers only the last. A routed answer's `usage` is therefore the sum of its legs (prompt,
completion, total, and the prompt tokens read from the provider's cache), and its `selfroute` object has `legs`
(each leg's model, route, tokens, cost, latency, error) and `cost_usd`. A routed whole answer carries the header
`x-selfroute-cost-usd`; a stream's headers go out before its cost is known, so a stream carries `cost_usd` in the
`selfroute` object of its final usage chunk (sent when the client asks `stream_options.include_usage`).
Pass-through answers keep the upstream's usage as it came, with the cost header (whole) or the final chunk's
`selfroute.cost_usd` (streams) when the model has a price."""

from __future__ import annotations

import json
from typing import Any

from gateway.ledger.records import RequestRecord
from gateway.protocol import Usage
from gateway.server.headers import COST


def cost_text(cost: float) -> str:
    """USD to ten decimals, trailing zeros dropped: 0.0012, 0.0000001, 0."""
    text = f"{max(cost, 0.0):.10f}".rstrip("0").rstrip(".")
    return text or "0"


def priced(record: RequestRecord) -> bool:
    return bool(record.calls) and not any(call.unpriced for call in record.calls)


def total_usage(record: RequestRecord) -> Usage:
    prompt = sum(call.prompt_tokens for call in record.calls)
    completion = sum(call.completion_tokens for call in record.calls)
    usage: Usage = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    cached = sum(call.cached_tokens for call in record.calls)
    if cached:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


def legs(record: RequestRecord) -> list[dict[str, Any]]:
    out = []
    for call in record.calls:
        leg: dict[str, Any] = {
            "model": call.model,
            "route": call.route,
            "prompt_tokens": call.prompt_tokens,
            "completion_tokens": call.completion_tokens,
            "cost_usd": round(call.cost_usd, 10),
            "latency_ms": None if call.latency_ms is None else round(call.latency_ms, 1),
        }
        if call.cached_tokens:
            leg["cached_tokens"] = call.cached_tokens
        if call.unpriced:
            leg["unpriced"] = True
        if call.error:
            leg["error"] = call.error
        out.append(leg)
    return out


def _cost(record: RequestRecord) -> float:
    return round(sum(call.cost_usd for call in record.calls), 10)


def _annotate(target: dict[str, Any], record: RequestRecord, routed: bool) -> None:
    info = target.get("selfroute")
    if not isinstance(info, dict):
        info = target["selfroute"] = {}
    info["cost_usd"] = _cost(record)
    if routed:
        if len(record.calls) > 1:  # one leg: the upstream's own usage is that sum, with its details
            target["usage"] = total_usage(record)
        info["legs"] = legs(record)
        if not priced(record):
            info["unpriced"] = True  # a model without a known price: its $0 is not a price
    info.setdefault("request_id", record.id)


def whole_answer(completion: dict[str, Any], record: RequestRecord, routed: bool) -> dict[str, str]:
    """Sum the legs into a routed completion's usage and selfroute object; the cost header to send (routed
    answers always, pass-through when priced)."""
    if not routed and not priced(record):
        return {}
    if routed:
        _annotate(completion, record, routed)
    return {COST: cost_text(_cost(record))}


def final_chunk(data: bytes, record: RequestRecord, routed: bool) -> bytes:
    """A stream's usage chunk once the stream has ended (its last leg is in the record): every leg's usage and the
    cost, for a routed stream; a pass-through stream's own usage with its cost when priced."""
    if not routed and not priced(record):
        return data
    chunk = json.loads(data)
    _annotate(chunk, record, routed)
    return json.dumps(chunk).encode()
