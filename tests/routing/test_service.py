"""Routed requests end to end: three document sources, route rules, Self-Route fallback (plain and
streaming), provenance, explain and the collections API — real MiniLM, LanceDB and uvicorn, fake upstream."""

from __future__ import annotations

import time

import httpx
import numpy as np
import openai
import pytest

from gateway.routing.embedding_model import PACKAGED_EMBEDDING_MODEL
from gateway.server.app import create_app
from gateway.settings import Settings
from tests.support.gateway import ledger_rows
from tests.support.policies import routing_policy, rule
from tests.support.routed import QUESTION, ask, client, manual
from tests.support.servers import serve_app


@pytest.fixture()
def start(upstream, embedder, tmp_path):
    """start(cheap=..., rules=...) -> (gateway url, app); one gateway per test, sharing the model."""
    servers = []

    def _start(with_embedder=None, **kwargs):
        policy = routing_policy(upstream[0], **kwargs)
        settings = Settings(data_dir=tmp_path)
        app = create_app(settings, policy=policy, embedder=with_embedder or embedder)
        server = serve_app(app)
        url = server.__enter__()
        servers.append(server)
        return url, app

    yield _start
    for server in servers:
        server.__exit__(None, None, None)


def test_inline_documents_take_the_rag_route_with_provenance(start, upstream):
    url, app = start()
    raw = ask(
        url,
        "What is the maintenance password for the Zephyr pump?",
        documents=[{"id": "pump-manual", "text": manual(), "title": "Pump manual"}],
    )
    body = raw.http_response.json()
    assert raw.headers["x-selfroute-route"] == "rag"
    assert "default route" in raw.headers["x-selfroute-reason"]
    sent = upstream[1].state.received[-1]["body"]
    assert sent["model"] == "fake-cheap"
    prompt = sent["messages"][-1]["content"]
    assert "BLUE-HERON-42" in prompt and "unanswerable" in prompt
    assert len(prompt) < len(manual()) / 2  # passages, not the whole manual
    provenance = body["selfroute"]["provenance"]
    assert provenance["source"] == "documents"
    assert [d["id"] for d in provenance["documents"]] == ["pump-manual"]
    assert any("17" in s for d in provenance["documents"] for s in d["sections"])
    [row] = ledger_rows(app)
    assert row["route"] == "rag" and '"pump-manual"' in row["provenance"]
    # the saving: always-long would have sent the whole manual to the expensive model
    assert row["counterfactual_cost_usd"] > row["cost_usd"] > 0


def answer_legs(app) -> list[dict]:
    """The requests' upstream legs but the gateway's own embedding of new documents ($0, recorded before them)."""
    return [c for c in ledger_rows(app, "upstream_calls") if c["model"] != PACKAGED_EMBEDDING_MODEL]


def test_refusing_cheap_answer_falls_back_to_long(start, upstream):
    url, app = start(cheap="cheap-refuser")
    raw = ask(url, "What is the maintenance password for the Zephyr pump?", documents=[{"text": manual()}])
    completion = raw.parse()
    assert raw.headers["x-selfroute-route"] == "rag>long"
    assert completion.choices[0].message.content.startswith("echo:")
    assert upstream[1].state.received[-1]["body"]["model"] == "fake-long"
    [row] = ledger_rows(app)
    calls = ledger_rows(app, "upstream_calls")
    assert row["route"] == "rag>long"
    # first the new manual's embedding for the rag prompt (the gateway's own model, $0), then the two answers
    assert [(c["model"], c["route"]) for c in calls] == [
        (PACKAGED_EMBEDDING_MODEL, "passthrough"),
        ("openai/cheap-refuser", "rag"),
        ("openai/fake-long", "long"),
    ]
    assert row["cost_usd"] == pytest.approx(sum(c["cost_usd"] for c in calls))


def test_streaming_fallback_never_shows_the_refusal(start):
    url, app = start(cheap="cheap-refuser")
    with client(url).chat.completions.with_streaming_response.create(
        model="selfroute",
        messages=[{"role": "user", "content": "Where is the pump?"}],
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"selfroute": {"documents": [{"text": manual()}]}},
    ) as response:
        assert response.headers["x-selfroute-route"] == "rag>long"
        chunks = list(response.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "unanswerable" not in text and text.startswith("echo:")
    assert chunks[-1].usage is not None
    assert [c["route"] for c in answer_legs(app)] == ["rag", "long"]


def test_streaming_cheap_answer_is_relayed_when_not_a_refusal(start):
    url, app = start()
    stream = client(url).chat.completions.create(
        model="selfroute",
        messages=[{"role": "user", "content": "Where is the pump?"}],
        stream=True,
        extra_body={"selfroute": {"documents": [{"text": manual()}]}},
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text.startswith("echo:")
    [row] = ledger_rows(app)
    assert row["route"] == "rag" and row["completion_tokens"] > 0 and row["error"] is None


def test_cheap_stream_breaking_before_any_byte_is_sent_is_a_502_with_its_leg_ledgered(start):
    url, app = start(cheap="cheap-breaks")
    with pytest.raises(openai.APIStatusError) as caught:
        list(
            client(url).chat.completions.create(
                model="selfroute",
                messages=[{"role": "user", "content": "Where is the pump?"}],
                stream=True,
                extra_body={"selfroute": {"documents": [{"text": manual()}]}},
            )
        )
    assert caught.value.status_code == 502
    [row] = ledger_rows(app)
    [call] = answer_legs(app)
    assert row["status"] == 502 and call["route"] == "rag" and call["error"]


def test_rules_fire_before_the_default_route(start, upstream):
    rules = [
        rule("short", "context_tokens", "<", 300, "direct"),
        rule("refs", "cross_ref_count", ">=", 3, "long"),
    ]
    url, app = start(rules=rules)
    short = ask(url, "What colour is the pump?", documents=[{"text": "The pump is painted green."}])
    assert short.headers["x-selfroute-route"] == "direct"
    assert short.headers["x-selfroute-reason"].startswith("rule short: context_tokens=")
    sent = upstream[1].state.received[-1]["body"]
    assert sent["model"] == "fake-cheap" and "painted green" in sent["messages"][-1]["content"]
    referenced = manual() + "\n\nSee Section 4. See Section 5. As defined in Section 6, see Section 7."
    long = ask(url, "What is the password?", documents=[{"text": referenced}])
    assert long.headers["x-selfroute-route"] == "long"
    assert upstream[1].state.received[-1]["body"]["model"] == "fake-long"
    assert "BLUE-HERON-42" in upstream[1].state.received[-1]["body"]["messages"][-1]["content"]


def test_plain_long_prompt_is_routed_with_the_question_after_the_marker(start, upstream, tmp_path):
    url, app = start()
    prompt = manual() + "\n\nQuestion: What is the maintenance password for the Zephyr pump?"
    raw = client(url).chat.completions.with_raw_response.create(
        model="selfroute", messages=[{"role": "user", "content": prompt}]
    )
    assert raw.headers["x-selfroute-route"] == "rag"
    body = raw.http_response.json()
    assert body["selfroute"]["provenance"]["source"] == "prompt"
    sent = upstream[1].state.received[-1]["body"]["messages"][-1]["content"]
    assert "BLUE-HERON-42" in sent and sent.rstrip().endswith("What is the maintenance password for the Zephyr pump?")


def test_inline_documents_are_embedded_once(start, embedder, monkeypatch):
    url, app = start()
    calls, queries = [], []
    original, original_queries = embedder.embed, embedder.embed_queries

    def counting(texts):
        calls.append(len(texts))
        return original(texts)

    def counting_queries(texts):
        queries.append(len(texts))
        return original_queries(texts)

    monkeypatch.setattr(embedder, "embed", counting)
    monkeypatch.setattr(embedder, "embed_queries", counting_queries)
    documents = [{"id": "m", "text": manual(sections=12, planted_at=5)}]
    answered = ask(url, "What is the password?", documents=documents).http_response.json()
    assert answered["selfroute"]["provenance"]["retrieval_index"] == "partial"  # answered from the first pass
    app.state.gateway.store.wait_inline()  # while the chunks were embedded in the background
    first, first_queries = sum(calls), sum(queries)
    again = ask(url, "Which valves close clockwise?", documents=documents).http_response.json()
    assert first + first_queries > 2  # the chunks the first time (the first pass's candidates, then the rest)
    assert sum(calls) == first  # no document text the second time (questions have their own model copy)
    assert sum(queries) == first_queries + 1  # the new question, nothing else
    assert again["selfroute"]["provenance"]["retrieval_index"] == "full"


def test_collections_api_and_collection_requests(start, upstream):
    url, app = start()
    base = f"{url}/v1/collections"
    added = httpx.post(
        f"{base}/pumps/documents",
        json={
            "documents": [
                {"id": "manual", "text": manual(), "title": "Pump manual"},
                {"id": "memo", "text": "The canteen opens at nine."},
            ]
        },
        timeout=120,
    )
    assert added.status_code == 201 and added.json()["added"] == ["manual", "memo"]
    again = httpx.post(
        f"{base}/pumps/documents", json={"documents": [{"id": "memo", "text": "The canteen opens at nine."}]}
    )
    assert again.status_code == 200 and again.json()["unchanged"] == ["memo"]
    listed = httpx.get(base).json()["data"]
    assert [(c["name"], c["document_count"]) for c in listed] == [("pumps", 2)]
    info = httpx.get(f"{base}/pumps").json()
    assert {d["id"] for d in info["documents"]} == {"manual", "memo"}

    raw = ask(url, "What is the maintenance password for the Zephyr pump?", collection="pumps")
    assert raw.headers["x-selfroute-route"] == "rag"
    assert "BLUE-HERON-42" in upstream[1].state.received[-1]["body"]["messages"][-1]["content"]
    by_header = client(url).chat.completions.with_raw_response.create(
        model="selfroute",
        messages=[{"role": "user", "content": "When does the canteen open?"}],
        extra_headers={"X-Selfroute-Collection": "pumps"},
    )
    assert by_header.http_response.json()["selfroute"]["provenance"]["collection"] == "pumps"

    assert httpx.delete(f"{base}/pumps/documents/memo").json()["deleted"] is True
    assert httpx.delete(f"{base}/pumps/documents/memo").status_code == 404
    assert httpx.get(f"{base}/nope").status_code == 404
    bad = httpx.post(f"{base}/bad name!/documents", json={"documents": [{"text": "x"}]})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_collection"
    with pytest.raises(openai.NotFoundError):
        ask(url, "anything?", collection="missing")


def test_explain_decides_without_calling_a_model(start, upstream):
    rules = [rule("short", "context_tokens", "<", 300, "direct")]
    url, app = start(rules=rules)
    before = len(upstream[1].state.received)
    response = httpx.post(
        f"{url}/v1/route/explain",
        json={
            "model": "selfroute",
            "messages": [{"role": "user", "content": "What is the password?"}],
            "selfroute": {"documents": [{"text": manual()}]},
        },
        timeout=120,
    )
    assert response.status_code == 200
    result = response.json()
    assert result["route"] == "rag" and result["rule"] is None
    assert result["features"]["context_tokens"] > 300
    estimates = result["estimates"]
    assert set(estimates) == {"direct", "rag", "long"}
    assert estimates["rag"]["prompt_tokens"] < estimates["long"]["prompt_tokens"]
    assert estimates["long"]["cost_usd"] > estimates["rag"]["cost_usd"]
    assert len(upstream[1].state.received) == before
    # explain is metered (issue 18): one record of the request, no model leg, nothing spent
    [row] = ledger_rows(app)
    assert (row["route"], row["reason"], row["cost_usd"]) == ("passthrough", "explain", 0)
    assert ledger_rows(app, "upstream_calls") == []


def test_a_question_too_long_for_the_window_is_a_400(start):
    url, app = start(rules=[rule("all-long", "context_tokens", ">=", 0, "long")])
    with pytest.raises(openai.BadRequestError) as caught:
        ask(url, "why " * 20000, documents=[{"text": manual()}])
    assert caught.value.response.json()["error"]["code"] == "context_length_exceeded"
    assert ledger_rows(app)[0]["status"] == 400


# one shared set of cheap answers: (answer, escalated?, refusal kept?) under the toy verifier
CHEAP_ANSWERS = [
    ("The maintenance password is BLUE-HERON-42.", False, False),  # grounded in the passages
    ("It is PURPLE-GIRAFFE-99, printed on the lid.", True, False),  # words found nowhere: escalate
    ("unanswerable", False, True),  # the toy verifier trusts refusals: it stands
]


def _score(reason: str) -> float:
    return float(reason.split("P(good)=")[1][:4])


def _replay_verdict(policy, verifier_file, embedder, tmp_path, answer: str):
    """The same cheap answer through the replay: builder inputs, verifier features and the shared check."""
    from gateway.evaluation.examples import Example, RouteInputBuilder
    from gateway.evaluation.replay import ReplayItem, router_strategy
    from gateway.evaluation.verification import answer_rows, cheap_answers
    from gateway.routing.decision import Router
    from gateway.routing.escalation import CheapAnswerCheck
    from gateway.routing.model_files import load_verifier
    from pipelines.documents import Document

    example = Example(
        QUESTION,
        [Document(id="doc-1", text=manual())],
        "doc-1",
        {"rag_pred": answer, "rag_score": 1.0, "lc_score": 0.0},
    )
    builder = RouteInputBuilder(policy, tmp_path / "replay-lancedb", window_tokens=16000, embedder=embedder)
    inputs = builder.inputs(example)
    check = CheapAnswerCheck(policy, load_verifier(verifier_file))
    [score] = check.verifier.scores(answer_rows(cheap_answers(builder, [example])))
    item = ReplayItem(
        "doc-1",
        "doc-1",
        QUESTION,
        1.0,
        0.0,
        check.detector.is_unanswerable(answer),
        inputs.rag_prompt_tokens,
        inputs.long_prompt_tokens,
        inputs.direct_prompt_tokens,
        5,
        5,
        inputs.features,
        0.9,
        verifier_score=score,
    )
    return router_strategy(Router(policy), True, check)(item), score


@pytest.mark.parametrize("answer, escalated, kept", CHEAP_ANSWERS)
def test_plain_streaming_direct_and_replay_check_the_cheap_answer_alike(
    start, upstream, embedder, verifier_file, tmp_path, answer, escalated, kept
):
    upstream[1].state.scripted = answer
    documents = [{"text": manual()}]
    url, app = start(cheap="cheap-scripted", verifier=str(verifier_file))
    plain = ask(url, QUESTION, documents=documents)
    with client(url).chat.completions.with_streaming_response.create(
        model="selfroute",
        messages=[{"role": "user", "content": QUESTION}],
        stream=True,
        extra_body={"selfroute": {"documents": documents}},
    ) as response:
        streamed_headers = response.headers
        text = "".join(c.choices[0].delta.content or "" for c in response.parse() if c.choices)
    want = "rag>long" if escalated else "rag"
    assert plain.headers["x-selfroute-route"] == streamed_headers["x-selfroute-route"] == want
    score = _score(plain.headers["x-selfroute-reason"])
    assert _score(streamed_headers["x-selfroute-reason"]) == score
    assert ("refusal kept" in plain.headers["x-selfroute-reason"]) is kept
    # the client sees the cheap answer whole, or only the long one
    assert (text.strip() == answer) is (not escalated)
    assert text.startswith("echo:") is escalated
    assert [r["route"] for r in ledger_rows(app)] == [want, want]

    direct_url, _ = start(
        cheap="cheap-scripted",
        verifier=str(verifier_file),
        rules=[rule("all-direct", "context_tokens", ">=", 0, "direct")],
    )
    direct = ask(direct_url, QUESTION, documents=documents)
    assert direct.headers["x-selfroute-route"] == ("rag>long" if escalated else "direct")
    assert ("refusal kept" in direct.headers["x-selfroute-reason"]) is kept

    outcome, replay_score = _replay_verdict(app.state.gateway.routing.policy, verifier_file, embedder, tmp_path, answer)
    assert round(replay_score, 2) == pytest.approx(score)
    assert outcome.route == ("rag>long" if escalated else "kept-refusal" if kept else "rag")


def test_a_stream_the_check_cannot_escalate_is_relayed_as_it_comes(start, verifier_file):
    """Threshold 0 and refusals left to the verifier: nothing can escalate, so the cheap stream is not held."""

    def content_spread(url: str) -> tuple[float, str]:
        arrivals = []
        with client(url).chat.completions.with_streaming_response.create(
            model="selfroute",
            messages=[{"role": "user", "content": QUESTION}],
            stream=True,
            extra_body={"selfroute": {"documents": [{"text": manual()}]}},
        ) as response:
            reason = response.headers["x-selfroute-reason"]
            for chunk in response.parse():
                if chunk.choices and chunk.choices[0].delta.content:
                    arrivals.append(time.monotonic())
        return arrivals[-1] - arrivals[0], reason

    never_url, _ = start(cheap="cheap-dribble", verifier=str(verifier_file), verifier_threshold=0.0)
    spread, reason = content_spread(never_url)
    assert spread > 5  # 40 words 0.25 s apart reach the client as they come
    assert "verifier" not in reason  # no check held the answer back
    held_url, _ = start(cheap="cheap-dribble", verifier=str(verifier_file), refusal_threshold=1.0)
    spread, reason = content_spread(held_url)
    assert spread < 2 and "verifier: P(good)=" in reason  # the whole answer was held for the check


def test_without_a_verifier_a_direct_refusal_escalates(start, upstream):
    url, app = start(cheap="cheap-refuser", rules=[rule("all-direct", "context_tokens", ">=", 0, "direct")])
    raw = ask(url, QUESTION, documents=[{"text": manual()}])
    assert raw.headers["x-selfroute-route"] == "rag>long"
    assert raw.parse().choices[0].message.content.startswith("echo:")
    assert [c["route"] for c in answer_legs(app)] == ["direct", "long"]


def test_conflicting_context_is_400(start):
    url, _ = start()
    with pytest.raises(openai.BadRequestError) as caught:
        ask(url, "q?", collection="pumps", documents=[{"text": "x"}])
    assert caught.value.response.json()["error"]["code"] == "conflicting_context"


def test_long_failure_after_a_refusal_returns_the_cheap_answer_with_a_header(start):
    url, app = start(cheap="cheap-refuser", long="status-503")
    raw = ask(url, "What is the maintenance password?", documents=[{"text": manual()}])
    assert raw.http_response.status_code == 200
    assert raw.headers["x-selfroute-fallback-error"] == "502 upstream_error"
    assert raw.headers["x-selfroute-route"] == "rag"
    assert raw.parse().choices[0].message.content == "unanswerable"
    assert raw.http_response.json()["selfroute"]["fallback_error"]["code"] == "upstream_error"
    [row] = ledger_rows(app)
    calls = answer_legs(app)
    assert (row["status"], row["route"]) == (200, "rag") and "long route failed" in row["reason"]
    assert [(c["route"], bool(c["error"])) for c in calls] == [("rag", False), ("long", True)]


def test_long_failure_after_a_refusal_is_an_error_when_the_policy_says_so(start):
    url, app = start(cheap="cheap-refuser", long="status-503", on_long_error="error")
    with pytest.raises(openai.APIStatusError) as caught:
        ask(url, "What is the maintenance password?", documents=[{"text": manual()}])
    assert caught.value.status_code == 502
    assert "x-selfroute-fallback-error" not in caught.value.response.headers
    [row] = ledger_rows(app)
    assert (row["status"], row["route"]) == (502, "rag>long")


def test_long_alternates_are_tried_in_order(start, upstream):
    url, app = start(cheap="cheap-refuser", long="status-503", alternates=("status-429", "fake-long"))
    raw = ask(url, "What is the maintenance password?", documents=[{"text": manual()}])
    assert raw.headers["x-selfroute-route"] == "rag>long"
    assert "x-selfroute-fallback-error" not in raw.headers
    assert raw.parse().choices[0].message.content.startswith("echo:")
    calls = answer_legs(app)
    assert [(c["model"], bool(c["error"])) for c in calls] == [
        ("openai/cheap-refuser", False),
        ("openai/status-503", True),
        ("openai/status-429", True),
        ("openai/fake-long", False),
    ]


def test_long_alternates_serve_the_long_route_and_its_streams(start):
    rules = [rule("all-long", "context_tokens", ">=", 0, "long")]
    url, app = start(long="status-500", alternates=("fake-long",), rules=rules)
    raw = ask(url, "Where is the pump?", documents=[{"text": manual()}])
    assert raw.headers["x-selfroute-route"] == "long" and raw.parse().choices[0].message.content.startswith("echo:")
    stream = client(url).chat.completions.create(
        model="selfroute",
        messages=[{"role": "user", "content": "Where is the pump?"}],
        stream=True,
        extra_body={"selfroute": {"documents": [{"text": manual()}]}},
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices).startswith("echo:")
    assert [c["model"] for c in answer_legs(app)] == ["openai/status-500", "openai/fake-long"] * 2


def test_streaming_long_failure_after_a_refusal_streams_the_cheap_answer(start):
    url, app = start(cheap="cheap-refuser", long="status-503")
    with client(url).chat.completions.with_streaming_response.create(
        model="selfroute",
        messages=[{"role": "user", "content": "Where is the pump?"}],
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"selfroute": {"documents": [{"text": manual()}]}},
    ) as response:
        assert response.headers["x-selfroute-fallback-error"] == "502 upstream_error"
        assert response.headers["x-selfroute-route"] == "rag"
        chunks = list(response.parse())
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip() == "unanswerable"
    assert chunks[-1].usage is not None
    [row] = ledger_rows(app)
    assert (row["status"], row["route"]) == (200, "rag")
    assert [(c["route"], bool(c["error"])) for c in answer_legs(app)] == [
        ("rag", False),
        ("long", True),
    ]


@pytest.mark.parametrize("with_usage", [True, False])
def test_a_kept_cheap_stream_cut_after_its_opening_ends_as_truncated(start, upstream, with_usage):
    """The literal rule decides on the opening: a refusal whose opening is settled is cut there; when the long
    route then fails, the held opening is sent after all and closed with finish_reason "length" and the usage
    counted so far (the usage chunk only when asked for)."""
    words = " ".join(f"word{n}" for n in range(120))
    upstream[1].state.scripted = f"The passages do not contain the answer. {words}"
    url, app = start(cheap="cheap-scripted", long="status-503")
    options = {"stream_options": {"include_usage": True}} if with_usage else {}
    chunks = list(
        client(url).chat.completions.create(
            model="selfroute",
            messages=[{"role": "user", "content": "Where is the pump?"}],
            stream=True,
            extra_body={"selfroute": {"documents": [{"text": manual()}]}},
            **options,
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("The passages do not contain the answer.") and "word119" not in text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    usage = [c.usage for c in chunks if c.usage is not None]
    assert len(usage) == (1 if with_usage else 0)
    if with_usage:
        assert usage[0].completion_tokens > 0 and chunks[-1].usage is not None
    [row] = ledger_rows(app)
    assert (row["status"], row["route"]) == (200, "rag")
    assert [(c["route"], bool(c["error"])) for c in answer_legs(app)] == [
        ("rag", False),
        ("long", True),
    ]


def test_default_policy_answers_with_the_cheap_reply_when_the_long_call_times_out(upstream, embedder, tmp_path):
    """The shipped policy, its models pointed at the fake upstream: a refused cheap answer whose long call
    times out gives the client the cheap answer within the long timeout, not a 504."""
    from policies.loader import load_policy

    base = upstream[0]
    policy, _ = load_policy(None)
    policy = policy.model_copy(
        update={
            "cheap": policy.cheap.model_copy(update={"model": "openai/cheap-refuser", "api_base": f"{base}/v1"}),
            "long": policy.long.model_copy(update={"model": "openai/slow", "api_base": f"{base}/v1", "timeout": 1.0}),
            # the literal refusal rule: the shipped verifier judges real answers, not the fake upstream's
            "routing": policy.routing.model_copy(
                update={"rules": [], "classifier": None, "default_route": "rag", "verifier": None}
            ),
        }
    )
    app = create_app(Settings(data_dir=tmp_path), policy=policy, embedder=embedder)
    with serve_app(app) as url:
        raw = ask(url, "Question: What is the maintenance password?", documents=[{"text": manual()}])
    assert raw.http_response.status_code == 200
    assert raw.headers["x-selfroute-fallback-error"] == "504 upstream_timeout"
    assert raw.parse().choices[0].message.content == "unanswerable"


def test_a_collection_answer_is_checked_against_the_collection_index_built_once_per_version(
    start, upstream, verifier_file
):
    upstream[1].state.scripted = "The maintenance password is BLUE-HERON-42."
    url, app = start(cheap="cheap-scripted", verifier=str(verifier_file))
    base = f"{url}/v1/collections/pumps/documents"
    assert httpx.post(base, json={"documents": [{"id": "manual", "text": manual()}]}, timeout=120).status_code == 201
    first = ask(url, QUESTION, collection="pumps")
    assert first.headers["x-selfroute-route"] == "rag" and "verifier: P(good)=" in first.headers["x-selfroute-reason"]
    cache = app.state.gateway.routing.planner._index_cache
    [version] = [k for k in cache if k[0] == "collection"]
    terms, _, _ = cache[version]
    assert {"zephyr", "heron"} <= terms  # the whole stored document, not only the passages sent
    ask(url, "Which valves close clockwise?", collection="pumps")
    assert [k for k in cache if k[0] == "collection"] == [version]  # reused
    httpx.post(base, json={"documents": [{"id": "memo", "text": "The canteen opens at nine."}]}, timeout=120)
    ask(url, QUESTION, collection="pumps")
    versions = [k for k in cache if k[0] == "collection"]
    assert len(versions) == 2 and "canteen" in cache[versions[-1]][0]


def test_the_long_route_never_shows_a_saving_and_the_counterfactual_fits_the_long_window(start):
    rules = [rule("all-long", "context_tokens", ">=", 0, "long")]
    url, app = start(rules=rules, long_window=1024)
    ask(url, "Where is the pump?", documents=[{"text": manual()}])
    [row] = ledger_rows(app)
    [leg] = answer_legs(app)
    assert row["route"] == "long"
    assert row["counterfactual_cost_usd"] == pytest.approx(row["cost_usd"])  # the long leg is always-long
    assert row["context_tokens"] == leg["prompt_tokens"]


def test_the_cheap_routes_saving_counts_only_what_the_long_model_could_receive(start, upstream):
    url, app = start(long_window=1024)
    raw = ask(url, "What is the maintenance password for the Zephyr pump?", documents=[{"text": manual()}])
    assert raw.headers["x-selfroute-route"] == "rag"
    [row] = ledger_rows(app)
    [leg] = answer_legs(app)
    budget = 1024 - 512  # the window less the answer reserve
    assert raw.http_response.json()["selfroute"]["provenance"]  # sanity: a real routed answer
    assert row["context_tokens"] == budget  # the manual is ~2,500 tokens: always-long could send 512 of them
    assert row["counterfactual_cost_usd"] == pytest.approx(budget * 10e-6 + leg["completion_tokens"] * 20e-6)


def test_cheap_leg_logprobs_behind_the_policy_switch_reach_the_verifier(start, upstream, embedder, tmp_path):
    """routing.verifier.logprobs: the cheap leg asks for token log-probabilities, the verifier reads them (the fake
    upstream gives a word in capitals -3.0), and the client, which did not ask, gets none back."""
    from classifier.verifier import train_verifier
    from gateway.routing.model_files import save_verifier

    rows = [{"ans_logprob_min": -3.0 if i % 2 else -0.1} for i in range(60)]
    labels = [0 if i % 2 else 1 for i in range(60)]
    toy = train_verifier(
        rows,
        labels,
        [f"d{i % 6}" for i in range(60)],
        estimator="logistic",
        feature_names=["ans_logprob_min"],
        n_splits=3,
    ).model
    path = tmp_path / "logprob-verifier.skops"
    save_verifier(toy, path)
    documents = [{"text": manual()}]
    for switch in (False, True):
        url, app = start(cheap="cheap-scripted", verifier=str(path))
        app.state.gateway.routing.policy.routing.verifier.logprobs = switch
        upstream[1].state.scripted = "It is BLUE-HERON-42."
        raw = ask(url, QUESTION, documents=documents)
        cheap_leg = [r["body"] for r in upstream[1].state.received if r["body"].get("model") == "cheap-scripted"][-1]
        assert bool(cheap_leg.get("logprobs")) is switch
        assert raw.http_response.json()["choices"][0].get("logprobs") is None
    # with them the unsure answer (a word in capitals) is escalated, a sure one stands
    assert raw.headers["x-selfroute-route"] == "rag>long"
    upstream[1].state.scripted = "It is blue heron forty two."
    kept = ask(url, QUESTION, documents=documents)
    assert kept.headers["x-selfroute-route"] == "rag"
    assert kept.http_response.json()["choices"][0].get("logprobs") is None  # the client did not ask


def test_a_verifier_reading_the_support_gets_the_values_the_replay_computes(start, upstream, embedder, tmp_path):
    """The answer's support in embedding space (SUPPORT_FEATURES) as the live check read it (the ledger's learning
    record) equals the replay's, whose chunks sent are read from its own store and whose answer embeddings are cached
    (gateway.evaluation.verification.CachedEmbed), under the shipped onnx-int8 vectors. The replay retrieves from the
    whole index, so the live answer compared is one made on the whole index: the first question on new documents is
    answered from the first pass (pipelines.store.pending: BM25 candidates, only those ranked by vector), which sends
    other passages (round eight's unexplained 3.7e-3 was that: other chunks sent, not other vectors)."""
    import json
    import sqlite3

    from classifier.answer_features import SUPPORT_FEATURES
    from classifier.verifier import train_verifier
    from gateway.evaluation.examples import Example, RouteInputBuilder
    from gateway.evaluation.verification import CachedEmbed, answer_rows, cheap_answers
    from gateway.routing.model_files import save_verifier
    from gateway.server.headers import REQUEST_ID
    from pipelines.documents import Document
    from pipelines.embedding import DEFAULT_BACKEND

    assert embedder.backend == DEFAULT_BACKEND == "onnx-int8"
    rng = np.random.default_rng(0)
    rows = [{n: float(v) for n, v in zip(SUPPORT_FEATURES, rng.random(4))} for _ in range(60)]
    toy = train_verifier(
        rows,
        [int(r["ans_passage_similarity"] > 0.5) for r in rows],
        [f"d{i % 6}" for i in range(60)],
        estimator="logistic",
        feature_names=list(SUPPORT_FEATURES),
        n_splits=3,
    ).model
    path = tmp_path / "support-verifier.skops"
    save_verifier(toy, path)
    answer = "The maintenance password is BLUE-HERON-42. It is printed on the pump's lid."
    upstream[1].state.scripted = answer
    url, app = start(cheap="cheap-scripted", verifier=str(path))
    ask(url, QUESTION, documents=[{"text": manual()}])  # answered from the first pass; starts the whole index
    app.state.gateway.store.wait_inline()  # the documents' whole index, as the replay's store holds it
    later = ask(url, QUESTION, documents=[{"text": manual()}])
    live = None
    deadline = time.monotonic() + 30
    while live is None:  # the learning record is written off the request path
        app.state.gateway.ledger.flush()
        with sqlite3.connect(app.state.gateway.ledger.path) as conn:
            found = conn.execute(
                "SELECT data FROM request_features WHERE request_id = ?", (later.headers[REQUEST_ID],)
            ).fetchall()
        live = json.loads(found[0][0])["verifier_features"] if found else None
        assert live is not None or time.monotonic() < deadline
        time.sleep(0.1)
    example = Example(
        QUESTION, [Document(id="doc-1", text=manual())], "doc-1", {"rag_pred": answer, "rag_score": 1, "lc_score": 0}
    )
    policy = app.state.gateway.routing.policy
    builder = RouteInputBuilder(policy, tmp_path / "replay-lancedb", window_tokens=16000, embedder=embedder)
    embed = CachedEmbed(embedder, tmp_path / "vectors")
    [offline] = answer_rows(cheap_answers(builder, [example], embed=embed))
    for name in SUPPORT_FEATURES:
        # one text per int8 run: a text's vector is its own whatever was embedded with it, so the same chunks and
        # answer give the same vectors; the tolerance is float32's rounding in the sums
        assert live[name] == pytest.approx(offline[name], abs=1e-5), name
    assert 0.0 < live["ans_sentence_support_min"] <= live["ans_sentence_support_mean"] <= 1.0


def _sent_then_left(port: int, body: dict, leave_when) -> float:
    """POST `body` on a raw connection, close it once leave_when() is true; returns when it closed (monotonic)."""
    import json
    import socket

    payload = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            + f"content-length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        deadline = time.monotonic() + 120
        while not leave_when():
            assert time.monotonic() < deadline, "the phase was never reached"
            time.sleep(0.02)
    return time.monotonic()


@pytest.mark.parametrize("phase", ["holding the cheap answer", "during the check", "before the long answer"])
def test_a_held_stream_whose_client_leaves_in_any_phase_is_499_at_once(
    upstream, embedder, tmp_path, verifier_file, phase
):
    """A checked stream: the cheap answer held while the check decides, then relayed or escalated. Under serve's
    protocol the client leaving in each phase (the cheap stream still coming; the verifier running in its thread;
    escalated, the long stream not yet begun) is ledgered 499 at once, never 200 after the answer's end."""
    import threading

    from gateway.commands._http_deadline import HeaderDeadlineProtocol

    models = {
        "holding the cheap answer": dict(cheap="cheap-dribble", verifier=str(verifier_file), refusal_threshold=1.0),
        "during the check": dict(cheap="cheap-scripted", verifier=str(verifier_file), refusal_threshold=1.0),
        "before the long answer": dict(cheap="cheap-refuser", long="sleep-30"),
    }[phase]
    upstream[1].state.scripted = "The maintenance password is BLUE-HERON-42."
    received = upstream[1].state.received
    received.clear()
    app = create_app(Settings(data_dir=tmp_path), policy=routing_policy(upstream[0], **models), embedder=embedder)
    checking, release = threading.Event(), threading.Event()
    with serve_app(app, http=HeaderDeadlineProtocol) as url:
        check = app.state.gateway.routing.check
        real = check.check

        def slow_check(*args, **kwargs):
            checking.set()
            release.wait(60)
            return real(*args, **kwargs)

        if phase == "during the check":
            check.check = slow_check

        def asked(model: str) -> bool:
            return any(model in r["body"]["model"] for r in received)

        leave_when = {
            "holding the cheap answer": lambda: asked("cheap-dribble") and time.sleep(1.0) is None,
            "during the check": checking.is_set,
            "before the long answer": lambda: asked("sleep-30"),
        }[phase]
        body = {
            "model": "selfroute",
            "stream": True,
            "messages": [{"role": "user", "content": QUESTION}],
            "selfroute": {"documents": [{"text": manual()}]},
        }
        try:
            left = _sent_then_left(int(url.rsplit(":", 1)[1]), body, leave_when)
            found = []
            while time.monotonic() - left < 15 and not found:
                time.sleep(0.1)
                found = ledger_rows(app)
            heard_after = time.monotonic() - left
        finally:
            release.set()
    assert found and found[0]["status"] == 499, found
    assert heard_after < 10  # not after the cheap stream's 10 s, the check, or the long model's 30 s
    if phase == "during the check":  # the cheap answer was read whole: its leg is what it reported, not the estimate
        [cheap] = answer_legs(app)
        assert cheap["error"] is None, cheap
        assert cheap["completion_tokens"] == len(upstream[1].state.scripted.split())


def test_a_pass_through_name_keeps_its_policy_settings_and_other_names_get_one_default_config_each():
    """passthrough_config builds a name's default config once (it ran twice a request: the call and its estimate);
    the policy's own models keep their settings and an unpackaged local model is still refused."""
    from gateway.routing.errors import ModelNotFound
    from gateway.routing.service import passthrough_config
    from policies.schema import ModelConfig

    policy = routing_policy("http://127.0.0.1:9")
    assert passthrough_config(policy, policy.cheap.model) is policy.cheap
    first = passthrough_config(policy, "openai/some-model")
    assert first == ModelConfig(model="openai/some-model")
    assert passthrough_config(policy, "openai/some-model") is first
    assert passthrough_config(policy, "openai/other-model").model == "openai/other-model"
    with pytest.raises(ModelNotFound):
        passthrough_config(policy, "local//etc/passwd")
