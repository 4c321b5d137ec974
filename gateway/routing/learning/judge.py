"""The judge: a model (the policy's routing.learning.judge_model, default the long model) compares the cheap
answer with the long answer for one question and returns a structured verdict, a label for the router.

The grading prompt is fixed (JUDGE_PROMPT): changing it changes what every label means. The verdict is a JSON
object {"verdict": "as_good" | "worse" | "both_wrong"}; anything else is malformed and makes no label.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

AS_GOOD, WORSE, BOTH_WRONG = "as_good", "worse", "both_wrong"
VERDICTS = (AS_GOOD, WORSE, BOTH_WRONG)
PASSAGE_CHARS = 6000  # of the passages shown to the judge: enough to see what the cheap answer had, bounded cost
ANSWER_CHARS = 4000

JUDGE_PROMPT = """You grade two answers to the same question about some documents.
Answer A was written from a few retrieved passages (shown below); answer B was written from the whole documents.
Decide whether answer A is as good as answer B.

Reply with one JSON object and nothing else: {"verdict": "as_good"} when A is as correct and complete as B
(also when both say the documents do not contain the answer and that is plausible), {"verdict": "worse"} when A is
wrong, refuses or misses what B gets right, {"verdict": "both_wrong"} when neither answers the question."""


def judge_messages(question: str, passages: Sequence[str], cheap_answer: str, long_answer: str) -> list[dict]:
    shown = "\n\n".join(passages)[:PASSAGE_CHARS]
    user = (
        f"Question:\n{question}\n\nPassages answer A was based on:\n{shown or '(none)'}\n\n"
        f"Answer A:\n{(cheap_answer or '')[:ANSWER_CHARS]}\n\nAnswer B:\n{(long_answer or '')[:ANSWER_CHARS]}\n\n"
        'Your verdict as JSON ({"verdict": "as_good" | "worse" | "both_wrong"}):'
    )
    return [{"role": "system", "content": JUDGE_PROMPT}, {"role": "user", "content": user}]


def judge_body(
    model: str, question: str, passages: Sequence[str], cheap_answer: str, long_answer: str
) -> dict[str, Any]:
    return {
        "model": model,
        "messages": judge_messages(question, passages, cheap_answer, long_answer),
        "temperature": 0,
        "max_tokens": 40,
    }


_OBJECT = re.compile(r"\{[^{}]*\}", re.DOTALL)


def parse_verdict(text: str | None) -> str | None:
    """The verdict of a judge's reply, or None when the reply is malformed (no JSON object with a known verdict):
    a malformed verdict is no label, never a guess."""
    if not text:
        return None
    for match in _OBJECT.finditer(text):
        try:
            value = json.loads(match.group(0))
        except ValueError:
            continue
        verdict = value.get("verdict") if isinstance(value, dict) else None
        if isinstance(verdict, str):
            normal = re.sub(r"[\s\-]+", "_", verdict.strip().lower())
            return normal if normal in VERDICTS else None
        return None
    return None


def verdict_good(verdict: str) -> bool:
    """The label: the cheap answer was good enough unless it was worse than the long one (when both were wrong the
    long route gained nothing, so trusting the cheap answer cost no quality)."""
    return verdict != WORSE
