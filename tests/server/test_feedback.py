"""POST /v1/feedback: a key labels its own requests only; the label is in the ledger at once."""

from __future__ import annotations

import httpx
import pytest

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
    labels = ledger_rows(app, "labels")
    assert [(lab["request_id"], lab["source"], lab["good"], lab["score"], lab["verdict"]) for lab in labels] == [
        (alices, "feedback", 0, None, "bad"),
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
