"""Features and labels in the ledger (migration 010) on both engines: written with their request by the writer,
read back by learning; feedback labels and their owner lookup; the learning routes' spend."""

from __future__ import annotations

import math
import time

from gateway.ledger.labels import LabelStore, learning_spend, recent_answers, recorded_requests
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


def test_recent_answers_are_the_keys_own_under_the_policy_oldest_first(ledger_location, tmp_path):
    """What a relative verifier threshold's window starts from (gateway.routing.score_window): only rows that rule
    decided (p_good and long_tokens recorded), of this key and policy, the last `limit` of them."""
    ledger = Ledger(ledger_location, dead_letter_dir=tmp_path)
    now = time.time()

    def answer(i, escalated=False, refused=False, **extra):
        return {
            "version": 1,
            "p_good": i / 10,
            "refused": refused,
            "escalated": escalated,
            "long_tokens": 100.0 + i,
            **extra,
        }

    for i in range(5):
        ledger.submit(
            _record(f"a{i}", "rag", 0.001, now + i, answer(i, escalated=i == 3, refused=i == 1, p_cheap=i / 20))
        )
    ledger.submit(_record("b0", "rag", 0.001, now + 5, answer(9), key="k_b"))  # another key
    ledger.submit(_record("n0", "rag", 0.001, now + 6, {"version": 1, "p_good": 0.5}))  # no long_tokens: fixed rule
    other = _record("o0", "rag", 0.001, now + 7, answer(8))
    other.policy = "other"
    ledger.submit(other)
    ledger.flush()
    ledger.close()
    assert recent_answers(ledger_location, "k_a", "p", 3) == [
        (0.2, False, 102.0, False, 0.1),
        (0.3, False, 103.0, True, 0.15),
        (0.4, False, 104.0, False, 0.2),
    ]
    assert recent_answers(ledger_location, "k_a", "p", 10)[1] == (0.1, True, 101.0, False, 0.05)
    assert recent_answers(ledger_location, "k_b", "p", 10) == [(0.9, False, 109.0, False, None)]
    assert recent_answers(ledger_location, None, "p", 10) == []
    assert recent_answers(ledger_location, "k_a", "other", 10) == [(0.8, False, 108.0, False, None)]
