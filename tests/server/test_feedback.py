"""POST /v1/feedback: a key labels its own requests only; the label is in the ledger at once."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from gateway.ledger.keys import KeyStore
from gateway.server.auth import Authenticator
from tests.support.gateway import ledger_rows, running_gateway
from tests.support.policies import make_policy

ALICE, BOB, ADMIN = "sk-alice-test", "sk-bob-test", "sk-admin-test"


def _post(url: str, key: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}{path}", headers={"authorization": f"Bearer {key}"}, json=body, timeout=30)


@pytest.fixture()
def gateway(upstream, tmp_path):
    with running_gateway(tmp_path, make_policy(upstream[0]), auth=Authenticator([ALICE, BOB], ADMIN)) as (url, app):
        yield url, app


def _request_of(url: str, key: str) -> str:
    answer = _post(
        url,
        key,
        "/v1/chat/completions",
        {"model": "openai/fake-cheap", "messages": [{"role": "user", "content": "hello"}]},
    )
    assert answer.status_code == 200
    return answer.headers["x-selfroute-request-id"]


def test_a_key_labels_its_own_requests_and_no_other_keys(gateway):
    url, app = gateway
    alices = _request_of(url, ALICE)  # labelled at once: the record may still be in the writer's queue
    mine = _post(url, ALICE, "/v1/feedback", {"request_id": alices, "good": False})
    assert mine.status_code == 201 and mine.json()["good"] is False
    theirs = _post(url, BOB, "/v1/feedback", {"request_id": alices, "good": True})
    unknown = _post(url, BOB, "/v1/feedback", {"request_id": "req_nothing", "good": True})
    # another key's request answers like an unknown one: nothing tells Bob it exists
    assert theirs.status_code == unknown.status_code == 404
    assert theirs.json()["error"]["code"] == "request_not_found"
    assert theirs.json()["error"]["message"].replace(alices, "X") == unknown.json()["error"]["message"].replace(
        "req_nothing", "X"
    )
    graded = _post(url, ADMIN, "/v1/feedback", {"request_id": alices, "score": 0.8})  # the admin may label any
    assert graded.status_code == 201 and graded.json()["good"] is True
    labels = ledger_rows(app, "labels")  # the latest judgement of a request replaces the earlier one
    assert [(lab["request_id"], lab["source"], lab["good"], lab["score"], lab["verdict"]) for lab in labels] == [
        (alices, "feedback", 1, 0.8, "good"),
    ]
    assert {lab["key_id"] for lab in labels} == {ledger_rows(app)[0]["key_id"]}


@pytest.mark.parametrize(
    "body, param",
    [
        ({"request_id": "r"}, None),  # neither good nor score
        ({"request_id": "r", "good": True, "score": 1.0}, None),  # both
        ({"request_id": "r", "score": 1.5}, "score"),
        ({"good": True}, "request_id"),
        ({"request_id": "r", "good": True, "extra": 1}, "extra"),
        ({"request_id": "r", "good": "yes"}, "good"),  # were taken for true
        ({"request_id": "r", "good": 1}, "good"),
        ({"request_id": "r", "score": "0.5"}, "score"),
        ({"request_id": "r", "score": True}, "score"),
    ],
)
def test_bad_feedback_is_a_400(gateway, body, param):
    url, _ = gateway
    answer = _post(url, ALICE, "/v1/feedback", body)
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_value"
    if param:
        assert answer.json()["error"]["param"] == param


def test_feedback_needs_a_key(gateway):
    url, _ = gateway
    assert _post(url, "sk-wrong", "/v1/feedback", {"request_id": "r", "good": True}).status_code == 401


def test_a_request_id_with_a_nul_is_a_400_on_postgresql(upstream, postgres_url, tmp_path):
    """PostgreSQL refuses a NUL in the owner lookup's text: it was a 500."""
    policy = make_policy(upstream[0])
    with running_gateway(tmp_path, policy, ledger_url=postgres_url, auth=Authenticator([ALICE], ADMIN)) as (url, _):
        answer = _post(url, ALICE, "/v1/feedback", {"request_id": "req_\x00x", "good": True})
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "request_id", answer.text
        assert _post(url, ALICE, "/v1/feedback", {"request_id": "req_none", "good": True}).status_code == 404


def _label_rows(location) -> list[tuple]:
    from gateway.ledger.database import connect

    conn = connect(location)
    try:
        return [tuple(r) for r in conn.execute("SELECT request_id, good, score FROM labels ORDER BY id").fetchall()]
    finally:
        conn.close()


def _feedback_burst(url: str, key: str, request_id: str, calls: int) -> list[int]:
    bodies = [{"request_id": request_id, "score": round(i / calls, 3)} for i in range(calls)]
    with ThreadPoolExecutor(10) as pool:
        return [r.status_code for r in pool.map(lambda b: _post(url, key, "/v1/feedback", b), bodies)]


def test_feedback_keeps_one_label_per_request_however_often_it_is_sent(gateway):
    """Each call added a label row: a key could grow the ledger without bound on one request (round six's probe)."""
    url, app = gateway
    alices = _request_of(url, ALICE)
    assert _feedback_burst(url, ALICE, alices, 40) == [201] * 40
    labels = _label_rows(app.state.gateway.ledger.path)
    assert len(labels) == 1 and labels[0][0] == alices
    last = _post(url, ALICE, "/v1/feedback", {"request_id": alices, "good": False})
    assert last.status_code == 201
    assert _label_rows(app.state.gateway.ledger.path) == [(alices, 0, None)]  # the latest judgement stands


def test_feedback_keeps_one_label_per_request_on_postgresql(upstream, postgres_url, tmp_path):
    """Concurrent calls from two apps on one PostgreSQL ledger (two workers or replicas) still leave one row."""
    policy = make_policy(upstream[0])
    auth = Authenticator([ALICE], ADMIN)
    with running_gateway(tmp_path / "a", policy, ledger_url=postgres_url, auth=auth) as (url, _):
        with running_gateway(tmp_path / "b", policy, ledger_url=postgres_url, auth=auth) as (url2, _):
            alices = _request_of(url, ALICE)
            with ThreadPoolExecutor(2) as pool:
                done = list(pool.map(lambda u: _feedback_burst(u, ALICE, alices, 20), [url, url2]))
            assert done == [[201] * 20] * 2
            assert [row[0] for row in _label_rows(postgres_url) if row[0] == alices] == [alices]


def test_feedback_counts_against_the_keys_requests_per_minute(upstream, tmp_path):
    keys = KeyStore(tmp_path / "ledger.sqlite3")
    try:
        _, limited = keys.create("limited", rpm=3)
        with running_gateway(tmp_path, make_policy(upstream[0]), auth=Authenticator(admin_key=ADMIN)) as (url, app):
            mine = _request_of(url, limited)  # 1 of 3
            first = _post(url, limited, "/v1/feedback", {"request_id": mine, "good": True})  # 2 of 3
            assert first.status_code == 201 and first.headers["x-ratelimit-remaining-requests"] == "1"
            statuses = [_post(url, limited, "/v1/feedback", {"request_id": mine, "good": True}) for _ in range(3)]
            assert [r.status_code for r in statuses] == [201, 429, 429]
            assert statuses[1].json()["error"]["code"] == "rate_limit_exceeded" and "retry-after" in statuses[1].headers
            assert len(_label_rows(app.state.gateway.ledger.path)) == 1
    finally:
        keys.close()
