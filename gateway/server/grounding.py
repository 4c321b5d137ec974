"""The policy's grounding check (security.grounding) applied to a routed, non-streamed answer: each sentence is
scored against the text that was sent to the model (pipelines.safety.grounding); `flag` reports the scores in
`selfroute.grounding` and the x-selfroute-grounding header, `drop` also removes the unsupported sentences.
Streamed answers are sent as they come and are not checked."""

from __future__ import annotations

from typing import Any

from gateway.server import headers

CONTEXT_ROLES = ("system", "developer", "user", "tool")


def check_answer(
    mode: str, threshold: float, embed, completion: dict[str, Any], sent: list[dict] | None
) -> dict[str, str]:
    """Score (and for `drop`, edit) the completion in place; returns the header to add. CPU work: run in a thread."""
    if mode == "off" or not sent:
        return {}
    choices = completion.get("choices") or []
    message = (choices[0].get("message") or {}) if choices else {}
    answer = message.get("content")
    if not isinstance(answer, str) or not answer.strip():
        return {}
    from pipelines.messages import content_text
    from pipelines.safety.grounding import GroundingChecker, drop

    passages = [content_text(m.get("content")) for m in sent if m.get("role") in CONTEXT_ROLES]
    report = GroundingChecker(embed, threshold).check(answer, passages)
    result = report.to_dict()
    if mode == "drop" and report.unsupported:
        message["content"] = drop(answer, report)
        result["dropped"] = result["unsupported"]
    completion.setdefault("selfroute", {})["grounding"] = result
    return {headers.GROUNDING: f"unsupported={len(report.unsupported)}/{len(report.checked)}"}
