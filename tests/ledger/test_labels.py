"""Features and labels in the ledger (migration 010) on both engines: written with their request by the writer,
read back by learning; feedback labels and their owner lookup; the learning routes' spend."""

from __future__ import annotations

import math
import time

from gateway.ledger.labels import LabelStore, learning_spend, recorded_requests
from gateway.ledger.records import LabelRecord, RequestRecord
from gateway.ledger.writer import Ledger


def _record(rid: str, route: str, cost: float, created: float, features=None, labels=(), key="k_a") -> RequestRecord:
    return RequestRecord(
        id=rid,
        created_at=created,
        key_id=key,
        policy="p",
        alias="selfroute",
        route=route,
        reason=None,
        status=200,
        cost_usd=cost,
        features=features,
        labels=list(labels),
    )


def test_features_and_labels_round_trip(ledger_location, tmp_path):
    ledger = Ledger(ledger_location, dead_letter_dir=tmp_path)
    now = time.time()
    features = {
        "version": 1,
        "features": {"top_score": math.nan, "context_tokens": 900.0},
        "p_cheap": 0.7,
        "p_good": 0.4,
        "escalated": True,
        "decision": "rag",
    }
    ledger.submit(_record("r1", "rag>long", 0.02, now, features))
    ledger.submit(_record("r1", "rag>long", 0.03, now, features))  # re-submitted: one features row, replaced
    ledger.submit(_record("r2", "rag", 0.001, now + 1, {**features, "escalated": False}))
    ledger.submit(
        _record(
            "j1",
            "judge",
            0.004,
            now + 2,
            key=None,
            labels=[LabelRecord("r1", "judge", False, "worse", "k_a", cost_usd=0.004, label_request_id="j1")],
        )
    )
    ledger.submit(_record("s1", "shadow", 0.01, now + 3, key=None))
    ledger.flush()
    store = LabelStore(ledger_location)
    assert store.request_owner("r2") == (True, "k_a") and store.request_owner("nope") == (False, None)
    store.add(LabelRecord("r2", "feedback", True, "good", "k_a", score=0.9))
    store.close()
    ledger.close()
    got = recorded_requests(ledger_location, since=now - 1)
    assert [r.id for r in got] == ["r1", "r2"]  # only routed requests have features
    r1, r2 = got
    assert r1.features["features"] == {"top_score": None, "context_tokens": 900.0}  # NaN stored as null
    assert r1.cost_usd == 0.03 and r1.label() is False and [lab["source"] for lab in r1.labels] == ["judge"]
    assert r2.label() is True and r2.labels[0]["score"] == 0.9  # feedback on a cheap answer that stood
    assert learning_spend(ledger_location, now - 1) == 0.014


def test_feedback_on_a_long_answer_is_no_label_for_the_cheap_one(tmp_path):
    location = tmp_path / "l.sqlite3"
    ledger = Ledger(location)
    now = time.time()
    ledger.submit(_record("r1", "rag>long", 0.02, now, {"version": 1, "escalated": True, "p_good": 0.1}))
    ledger.flush()
    ledger.close()
    store = LabelStore(location)
    store.add(LabelRecord("r1", "feedback", False, "bad", "k_a"))
    store.close()
    [r1] = recorded_requests(location)
    assert r1.label() is None
