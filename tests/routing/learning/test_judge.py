"""The judge's verdicts: parsing (malformed is no label), and through a gateway on every escalation, ledgered as
its own request, never touching the client's answer."""

from __future__ import annotations

import hashlib
import json

import pytest

from gateway.routing.learning.judge import JUDGE_PROMPT, judge_messages, parse_verdict, verdict_good
from tests.support.policies import learning_policy
from tests.support.routed import DOUBTED, QUESTION, ask, manual, rows, settle


@pytest.mark.parametrize(
    "reply, verdict",
    [
        ('{"verdict": "as_good"}', "as_good"),
        ('Sure. {"verdict": "worse"} because A misses the date.', "worse"),
        ('```json\n{"verdict": "Both wrong"}\n```', "both_wrong"),
        ('{"verdict": "as-good", "why": "same"}', "as_good"),
        ('{"verdict": "better"}', None),  # not one of the three
        ('{"score": 1}', None),
        ("A is as good as B.", None),  # no JSON: no label, never a guess
        ('{"verdict": worse}', None),
        ("", None),
        (None, None),
    ],
)
def test_parse_verdict(reply, verdict):
    assert parse_verdict(reply) == verdict


def test_labels_and_the_fixed_prompt():
    assert [verdict_good(v) for v in ("as_good", "worse", "both_wrong")] == [True, False, True]
    messages = judge_messages("Q?", ["p1", "p2"], "cheap", "long")
    assert messages[0] == {"role": "system", "content": JUDGE_PROMPT}
    assert "Answer A:\ncheap" in messages[1]["content"] and "Answer B:\nlong" in messages[1]["content"]


# through the gateway ---------------------------------------------------------------------------------------------
def test_every_escalation_is_judged_and_ledgered_as_its_own_request(upstream, verifier_file, gateway):
    upstream[1].state.scripted = DOUBTED
    upstream[1].state.judge_reply = 'Looking at both: {"verdict": "worse"}'
    url, app, server = gateway(learning_policy(upstream[0], verifier_file))
    raw = ask(url, QUESTION, documents=[{"text": manual()}])
    assert raw.headers["x-selfroute-route"] == "rag>long"
    assert raw.parse().choices[0].message.content.startswith("echo:")  # the long answer, as without a judge
    request_id = raw.headers["x-selfroute-request-id"]
    settle(app, server)
    requests = {r["route"]: r for r in rows(app, "requests")}
    assert set(requests) == {"rag>long", "judge"}
    judge = requests["judge"]
    assert judge["key_id"] is None and json.loads(judge["provenance"]) == {"of": request_id}
    assert judge["cost_usd"] > 0 and judge["counterfactual_cost_usd"] == 0  # learning's cost counts against savings
    assert judge["reason"].endswith(": worse")
    [label] = rows(app, "labels")
    assert (label["request_id"], label["source"], label["verdict"], label["good"]) == (request_id, "judge", "worse", 0)
    assert label["label_request_id"] == judge["id"] and label["cost_usd"] == pytest.approx(judge["cost_usd"])
    graded = next(r["body"] for r in upstream[1].state.received if r["body"]["model"] == "judge")
    assert DOUBTED in graded["messages"][1]["content"] and "echo:" in graded["messages"][1]["content"]
    # what the ledger keeps for learning: features and scores, never the texts unless the policy opts in
    [features] = rows(app, "request_features")
    data = json.loads(features["data"])
    assert features["request_id"] == request_id and features["version"] == data["version"] == 1
    assert data["escalated"] is True and data["outcome"] == "rag>long" and data["decision"] == "rag"
    assert data["p_good"] < data["verifier_threshold"] == 0.5
    # the model version that decided: the verifier file's sha256 (16 hex); this policy routes without a classifier
    assert data["verifier_model"] == hashlib.sha256(verifier_file.read_bytes()).hexdigest()[:16]
    assert data["classifier_model"] is None and data["threshold"] is None
    assert set(data["verifier_features"]) >= {"ans_support_passages", "ans_refusal"}
    assert "context_tokens" in data["features"] and "texts" not in data
    assert "PURPLE" not in features["data"] and "Zephyr" not in features["data"]


def test_texts_are_kept_only_when_the_policy_says_so(upstream, verifier_file, gateway):
    upstream[1].state.scripted = DOUBTED
    url, app, server = gateway(learning_policy(upstream[0], verifier_file, store_texts=True))
    ask(url, QUESTION, documents=[{"text": manual()}])
    settle(app, server)
    [features] = rows(app, "request_features")
    texts = json.loads(features["data"])["texts"]
    assert texts["cheap_answer"] == DOUBTED and texts["question"] == QUESTION
    assert texts["long_answer"].startswith("echo:") and any("BLUE-HERON-42" in p for p in texts["passages"])


@pytest.mark.parametrize(
    "judge, reply, status",
    [
        ("judge", "I think A is fine.", 200),  # malformed: no label
        ("status-500", None, 502),  # the judge's upstream fails (a bad gateway, as for a client)
    ],
)
def test_a_bad_verdict_or_a_failed_judge_is_no_label_and_never_the_clients_problem(
    upstream, verifier_file, gateway, judge, reply, status
):
    upstream[1].state.scripted = DOUBTED
    if reply is not None:
        upstream[1].state.judge_reply = reply
    url, app, server = gateway(learning_policy(upstream[0], verifier_file, judge=judge))
    raw = ask(url, QUESTION, documents=[{"text": manual()}])
    assert raw.http_response.status_code == 200 and raw.headers["x-selfroute-route"] == "rag>long"
    assert raw.parse().choices[0].message.content.startswith("echo:")
    settle(app, server)
    judged = [r for r in rows(app, "requests") if r["route"] == "judge"]
    assert [r["status"] for r in judged] == [status]
    assert rows(app, "labels") == []
    client_row = next(r for r in rows(app, "requests") if r["route"] == "rag>long")
    assert client_row["status"] == 200


def test_a_streamed_escalation_is_judged_on_the_text_the_client_got(upstream, verifier_file, gateway):
    from tests.support.routed import client

    upstream[1].state.scripted = DOUBTED
    upstream[1].state.judge_reply = '{"verdict": "as_good"}'
    url, app, server = gateway(learning_policy(upstream[0], verifier_file))
    with client(url).chat.completions.with_streaming_response.create(
        model="selfroute",
        messages=[{"role": "user", "content": QUESTION}],
        stream=True,
        extra_body={"selfroute": {"documents": [{"text": manual()}]}},
    ) as response:
        text = "".join(c.choices[0].delta.content or "" for c in response.parse() if c.choices)
    settle(app, server)
    graded = next(r["body"] for r in upstream[1].state.received if r["body"]["model"] == "judge")
    assert f"Answer B:\n{text}" in graded["messages"][1]["content"]
    [label] = rows(app, "labels")
    assert (label["source"], label["verdict"], label["good"]) == ("judge", "as_good", 1)
