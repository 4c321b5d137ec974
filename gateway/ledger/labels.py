"""Labels and recorded features in the ledger database (migration 010): feedback labels written by the API, the
learning loop's spend, and what `selfroute learn`, `whatif` and `calibrate --from-ledger` read back."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from gateway.ledger.database import INSERT_LABEL, connect, reopened
from gateway.ledger.dialect import POSTGRESQL, dialect_of, is_postgres, reachable
from gateway.ledger.records import LABEL_FEEDBACK, LabelRecord, label_row
from policies.routes import LEARNING_ROUTES

_T = TypeVar("_T")


@dataclass
class RecordedRequest:
    """One routed request as learning reads it: its ledger row's cost figures, its features, and its labels."""

    id: str
    created_at: float
    key_id: str | None
    route: str | None
    cost_usd: float
    counterfactual_cost_usd: float
    features: dict[str, Any]
    labels: list[dict[str, Any]]

    def label(self) -> bool | None:
        """The label learning uses: the latest judge or shadow verdict, else the latest feedback on a cheap answer
        that stood (feedback on a long answer says nothing about the cheap one); None when unlabelled."""
        judged = [lab for lab in self.labels if lab["source"] != "feedback"]
        if judged:
            return bool(judged[-1]["good"])
        if self.features.get("escalated") is False and self.features.get("p_good") is not None:
            fed = [lab for lab in self.labels if lab["source"] == "feedback"]
            if fed:
                return bool(fed[-1]["good"])
        return None


def recorded_requests(
    location: str | Path, since: float = 0.0, until: float | None = None, policy: str | None = None
) -> list[RecordedRequest]:
    """The routed requests with recorded features since `since` (unix seconds), oldest first, with their labels."""
    conn = connect(location)
    try:
        where: list[str] = ["f.created_at >= ?"]
        params: list[Any] = [since]
        if until is not None:
            where.append("f.created_at < ?")
            params.append(until)
        if policy is not None:
            where.append("r.policy = ?")
            params.append(policy)
        rows = conn.execute(
            "SELECT f.request_id, f.created_at, r.key_id, r.route, r.cost_usd, r.counterfactual_cost_usd, f.data"
            " FROM request_features f JOIN requests r ON r.id = f.request_id"
            f" WHERE {' AND '.join(where)} ORDER BY f.created_at, f.request_id",
            tuple(params),
        ).fetchall()
        labels: dict[str, list[dict]] = {}
        for request_id, source, verdict, good, score, cost, created in conn.execute(
            "SELECT request_id, source, verdict, good, score, cost_usd, created_at FROM labels"
            " WHERE created_at >= ? ORDER BY created_at, id",
            (since,),
        ).fetchall():
            labels.setdefault(request_id, []).append(
                {
                    "source": source,
                    "verdict": verdict,
                    "good": good,
                    "score": score,
                    "cost_usd": cost,
                    "created_at": created,
                }
            )
    finally:
        conn.close()
    return [
        RecordedRequest(r[0], r[1], r[2], r[3], r[4] or 0.0, r[5] or 0.0, json.loads(r[6]), labels.get(r[0], []))
        for r in rows
    ]


def recent_answers(
    location: str | Path, key_id: str | None, policy: str | None, limit: int
) -> list[tuple[float, bool, float, bool, float | None]]:
    """The key's last `limit` cheap answers under `policy` that a relative verifier threshold decided, oldest
    first: (P(good), refused, long tokens charged, escalated, P(cheap) or None), as request_features recorded them (what
    gateway.routing.score_window starts a key's window from)."""
    conn = connect(location)
    try:
        where = [
            "r.key_id IS NULL" if key_id is None else "r.key_id = ?",
            "r.policy IS NULL" if policy is None else "r.policy = ?",
        ]
        params: list[Any] = [v for v in (key_id, policy) if v is not None]
        rows = conn.execute(
            "SELECT f.data FROM request_features f JOIN requests r ON r.id = f.request_id"
            f" WHERE {' AND '.join(where)} ORDER BY f.created_at DESC, f.request_id DESC LIMIT ?",
            (*params, 2 * limit),  # rows that went long or were decided otherwise are skipped below
        ).fetchall()
    finally:
        conn.close()
    out = []
    for (data,) in rows:
        found = json.loads(data)
        score, tokens = found.get("p_good"), found.get("long_tokens")
        if score is None or tokens is None:
            continue
        p_cheap = found.get("p_cheap")  # the pre-route P(cheap), for a window that ranks by it too
        out.append(
            (
                float(score),
                bool(found.get("refused")),
                float(tokens),
                bool(found.get("escalated")),
                None if p_cheap is None else float(p_cheap),
            )
        )
        if len(out) == limit:
            break
    return out[::-1]


def learning_spend(location: str | Path, since: float) -> float:
    """USD spent on shadow and judge requests since `since`."""
    conn = connect(location)
    try:
        marks = ", ".join("?" * len(LEARNING_ROUTES))
        row = conn.execute(
            f"SELECT coalesce(sum(cost_usd), 0) FROM requests WHERE route IN ({marks}) AND created_at >= ?",
            (*LEARNING_ROUTES, since),
        ).fetchone()
    finally:
        conn.close()
    return float(row[0] or 0.0)


def _feedback_lock(request_id: str) -> int:
    # a stable signed 64-bit number per request for pg_advisory_xact_lock (Python's hash() differs per process)
    return int.from_bytes(hashlib.sha256(b"selfroute-feedback:" + request_id.encode()).digest()[:8], "big", signed=True)


class LabelStore:
    """Feedback labels: who sent a request, and a label written at once (not through the batching writer: the
    client is told its label is kept). A request keeps one feedback label, the latest: a client re-sending its
    judgement changes it, so no number of calls grows the table past one row per request."""

    def __init__(self, location: str | Path, busy_timeout: float | None = None):
        self.location = location
        self._busy_timeout = busy_timeout  # as KeyStore's
        self._lock = threading.Lock()
        self._conn: Any = None

    def _connection(self) -> Any:
        # a file deleted or replaced under the gateway: the labels go to a new one at the path, as at start
        self._conn = reopened(self._conn, self.location, self._busy_timeout)
        return self._conn

    def _run(self, work: Callable[[Any], _T]) -> _T:
        with self._lock:
            try:
                return work(self._connection())
            except Exception:
                if is_postgres(self.location) and self._conn is not None:  # it may be broken: a new one next time
                    try:
                        self._conn.close()
                    finally:
                        self._conn = None
                raise

    @reachable
    def request_owner(self, request_id: str) -> tuple[bool, str | None]:
        """(found, the key id that sent it) for a request of the ledger."""
        row = self._run(lambda c: c.execute("SELECT key_id FROM requests WHERE id = ?", (request_id,)).fetchone())
        return (False, None) if row is None else (True, row[0])

    @reachable
    def add(self, label: LabelRecord) -> None:
        def write(conn: Any) -> None:
            with conn:
                if label.source == LABEL_FEEDBACK:
                    if dialect_of(conn) is POSTGRESQL:  # two workers replacing one request's label: one at a time
                        conn.execute("SELECT pg_advisory_xact_lock(?)", (_feedback_lock(label.request_id),))
                    conn.execute(
                        "DELETE FROM labels WHERE request_id = ? AND source = ?", (label.request_id, LABEL_FEEDBACK)
                    )
                conn.execute(INSERT_LABEL, label_row(label))

        self._run(write)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
