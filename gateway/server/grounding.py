"""The policy's grounding check (security.grounding) applied to a routed answer: each sentence is scored against the
text that was sent to the model (pipelines.safety.grounding). `flag` reports the scores in `selfroute.grounding`;
`drop` also removes the unsupported sentences from a whole answer. A whole answer carries the x-selfroute-grounding
header; a stream (whose headers went out before its text existed) is checked once it has ended and carries the
report in a trailing chunk's `selfroute.grounding`, before its usage chunk and [DONE] (its text was sent as it
came, so `drop` only reports there: `would_drop`). Either way the ledger keeps the counts in the request's
provenance (`grounding`: checked and unsupported sentences)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio

from gateway.ledger.entry import RequestLedgerEntry
from gateway.protocol import chunk_bytes
from gateway.server import headers

if TYPE_CHECKING:
    from pipelines.safety.grounding import GroundingReport

CONTEXT_ROLES = ("system", "developer", "user", "tool")


def grounding_report(threshold: float, embed, answer: Any, sent: list[dict] | None) -> GroundingReport | None:
    """The answer's sentences scored against the context messages that were sent; None when there is nothing to
    check. CPU work: run in a thread."""
    if not sent or not isinstance(answer, str) or not answer.strip():
        return None
    from pipelines.messages import content_text
    from pipelines.safety.grounding import GroundingChecker

    passages = [content_text(m.get("content")) for m in sent if m.get("role") in CONTEXT_ROLES]
    return GroundingChecker(embed, threshold).check(answer, passages)


def ledger_summary(report: GroundingReport) -> dict[str, int]:
    return {"checked": len(report.checked), "unsupported": len(report.unsupported)}


def check_answer(
    mode: str,
    threshold: float,
    embed,
    completion: dict[str, Any],
    sent: list[dict] | None,
    entry: RequestLedgerEntry | None = None,
) -> dict[str, str]:
    """Score (and for `drop`, edit) the completion in place; returns the header to add. CPU work: run in a thread."""
    if mode == "off":
        return {}
    choices = completion.get("choices") or []
    message = (choices[0].get("message") or {}) if choices else {}
    report = grounding_report(threshold, embed, message.get("content"), sent)
    if report is None:
        return {}
    from pipelines.safety.grounding import drop

    result = report.to_dict()
    if mode == "drop" and report.unsupported:
        message["content"] = drop(message["content"], report)
        result["dropped"] = result["unsupported"]
    completion.setdefault("selfroute", {})["grounding"] = result
    if entry is not None:
        entry.grounding = ledger_summary(report)
    return {headers.GROUNDING: f"unsupported={len(report.unsupported)}/{len(report.checked)}"}


def stream_check(
    mode: str, threshold: float, embed, sent: list[dict] | None, entry: RequestLedgerEntry
) -> Callable[[bytes, str], Awaitable[bytes | None]]:
    """The check of a streamed answer, run by the relay once the upstream stream has ended whole: (the stream's
    first chunk, its whole text) -> the trailing chunk to send (None: nothing to check). The counts go into the
    ledger entry before the stream's end settles it."""

    async def check(first: bytes, text: str) -> bytes | None:
        report = await anyio.to_thread.run_sync(grounding_report, threshold, embed, text, sent)
        if report is None:
            return None
        entry.grounding = ledger_summary(report)
        result = report.to_dict()
        if mode == "drop" and report.unsupported:
            result["would_drop"] = result["unsupported"]  # already sent: reported, not removed
        return chunk_bytes(first, selfroute={"grounding": result})

    return check
