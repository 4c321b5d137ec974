"""The ledger record of the learning loop's requests (shadow long answers, judges): what each came to, recorded by
the server as it records a client request's routing outcome (gateway.server.chat.record_outcome)."""

from __future__ import annotations

from gateway.ledger.entry import RequestLedgerEntry
from gateway.routing.learning.loop import LearningOutcome
from gateway.server.errors import failure


def record_learning(entry: RequestLedgerEntry, outcome: LearningOutcome) -> None:
    """Into the learning request's record: its reason's note, its provenance and its label; then finish it."""
    record = entry.record
    if outcome.note is not None:
        record.reason = f"{record.reason}: {outcome.note}"
    if outcome.provenance:
        record.provenance = {**(record.provenance or {}), **outcome.provenance}
    if outcome.label is not None:
        record.labels.append(outcome.label)
    status = outcome.status
    if status is None:  # it failed: the status a client would be told (the one exception table)
        status = failure(outcome.failure or RuntimeError(outcome.error)).error.status
    entry.finish(status, outcome.error)
