"""The answer verifier's inputs for paired examples, computed as the gateway computes them.

Each recorded cheap (RAG) answer is paired with the passages our retrieval places in the cheap prompt
for that question and the document's term index (gateway.evaluation.examples.RouteInputBuilder), then
turned into features by gateway.routing.escalation.CheapAnswerCheck.features, the function the live
check uses. `selfroute train --verifier`, `selfroute calibrate` and `selfroute eval replay` share this.
"""
from __future__ import annotations

from typing import Sequence

from gateway.evaluation.examples import Example, RouteInputBuilder
from gateway.routing.escalation import CheapAnswer, CheapAnswerCheck


def cheap_answers(builder: RouteInputBuilder, examples: Sequence[Example], progress: bool = False) -> list[CheapAnswer]:
    """The recorded cheap answer (`rag_pred`) of each example with what the cheap model saw."""
    from tqdm import tqdm

    out = []
    for e in tqdm(examples, desc="verifier inputs", disable=not progress, unit="q"):
        out.append(CheapAnswer(e.record.get("rag_pred"), e.query, builder.passages(e), builder.document_index(e)))
    return out


def answer_rows(answers: Sequence[CheapAnswer], probabilities: Sequence[float | None] | None = None) -> list[dict]:
    """Verifier features per answer; `probabilities`: the pre-route P(cheap) of each (out of fold), if any."""
    probabilities = probabilities if probabilities is not None else [None] * len(answers)
    return [CheapAnswerCheck.features(a, p) for a, p in zip(answers, probabilities)]
