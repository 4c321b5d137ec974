"""The drop-in proxy: official openai client against a real gateway in front of a fake upstream."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from gateway.server.auth import Authenticator
from pipelines.scope import SHARED
from tests.support.gateway import ledger_rows, running_gateway
from tests.support.policies import DROP, Whole, fake_route, make_policy


@pytest.fixture()
def gateway(upstream, tmp_path, monkeypatch):
    base, _ = upstream
    monkeypatch.setenv("OPENAI_API_BASE", f"{base}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-upstream-test")
    with running_gateway(tmp_path, make_policy(base)) as (url, app):
        yield url, app


def client(url: str, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


def test_plain_pass_through_returns_openai_shape_and_is_ledgered(gateway, upstream):
    url, app = gateway
    response = client(url).chat.completions.with_raw_response.create(
        model="gpt-test", messages=[{"role": "user", "content": "hello there"}]
    )
    completion = response.parse()
    assert completion.choices[0].message.content == "echo: hello there"
    assert completion.usage.prompt_tokens == 2
    request_id = response.headers["x-selfroute-request-id"]
    [row] = ledger_rows(app)
    assert row["id"] == request_id
    assert (row["route"], row["status"], row["alias"]) == ("passthrough", 200, "gpt-test")
    assert (row["prompt_tokens"], row["completion_tokens"]) == (2, 3)
    [call] = ledger_rows(app, "upstream_calls")
    assert call["request_id"] == request_id and call["model"] == "gpt-test"
    # the upstream saw the key from OPENAI_API_KEY, never the client's
    assert upstream[1].state.received[-1]["headers"]["authorization"] == "Bearer sk-upstream-test"


def test_policy_model_is_priced_from_the_policy(gateway):
    url, app = gateway
    client(url).chat.completions.create(model="openai/fake-long", messages=[{"role": "user", "content": "a b c"}])
    [row] = ledger_rows(app)
    # 3 prompt tokens at $10/M + 4 completion tokens ("echo: a b c") at $20/M
    assert row["cost_usd"] == pytest.approx(3 * 10e-6 + 4 * 20e-6)


def test_unknown_and_openai_fields_pass_upstream(gateway, upstream):
    url, _ = gateway
    client(url).chat.completions.create(
        model="gpt-test",
        messages=[{"role": "user", "content": "hi", "x_custom_message_field": 7}],
        temperature=0.3,
        response_format={"type": "json_object"},
        tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        extra_body={"vendor_option": {"a": 1}},
    )
    sent = upstream[1].state.received[-1]["body"]
    assert sent["vendor_option"] == {"a": 1}
    assert sent["temperature"] == 0.3
    assert sent["response_format"] == {"type": "json_object"}
    assert sent["tools"][0]["function"]["name"] == "f"
    assert sent["messages"][0]["x_custom_message_field"] == 7


def test_streaming_with_usage(gateway):
    url, app = gateway
    stream = client(url).chat.completions.create(
        model="gpt-test",
        messages=[{"role": "user", "content": "one two"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip() == "echo: one two"
    assert chunks[-1].usage.total_tokens == 2 + 3
    [row] = ledger_rows(app)
    assert row["stream"] == 1 and row["completion_tokens"] == 3 and row["error"] is None


def test_streaming_without_usage_hides_usage_chunk_but_ledgers_tokens(gateway):
    url, app = gateway
    chunks = list(
        client(url).chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": "one two"}], stream=True
        )
    )
    assert all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks)
    [row] = ledger_rows(app)
    assert row["prompt_tokens"] == 2 and row["completion_tokens"] == 3


def test_models_healthz_and_request_id(gateway):
    url, _ = gateway
    ids = [m.id for m in client(url).models.list()]
    assert ids == ["selfroute", "openai/fake-cheap", "openai/fake-long", "local/all-minilm-l6-v2"]
    health = httpx.get(f"{url}/healthz")
    assert health.json() == {"status": "ok"}
    assert health.headers["x-selfroute-request-id"].startswith("req_")


def _post(url: str, content: bytes | str, headers: dict | None = None) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions", content=content, headers={"content-type": "application/json", **(headers or {})}
    )


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        (b"{not json", None, "invalid_json"),
        (b"", None, "invalid_json"),
        (b"[1, 2]", None, "invalid_type"),
        (json.dumps({"model": "gpt-test"}), "messages", "missing_required_parameter"),
        (json.dumps({"model": "gpt-test", "messages": []}), "messages", "empty_array"),
        (
            json.dumps({"model": "gpt-test", "messages": [{"role": "wizard", "content": "x"}]}),
            "messages[0].role",
            "invalid_value",
        ),
        (
            json.dumps({"model": "gpt-test", "messages": [{"role": "user", "content": 5}]}),
            "messages[0].content",
            "invalid_type",
        ),
        (
            json.dumps({"model": "gpt-test", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}),
            "temperature",
            "invalid_type",
        ),
        (json.dumps({"messages": [{"role": "user", "content": "x"}]}), "model", "missing_required_parameter"),
        (b'{"model": "gpt-test", "messages": ' + b"[" * 5000 + b"]" * 5000 + b"}", None, "invalid_json"),
        (
            b'{"model": "gpt-test", "messages": [{"role": "user", "content": "\\ud800"}]}',
            "messages[0].content",
            "invalid_unicode",
        ),
        (json.dumps({"model": "m" * 20_000, "messages": [{"role": "user", "content": "x"}]}), "model", "invalid_value"),
        (
            json.dumps({"model": "gpt-test", "messages": [{"role": "user", "content": "x"}], "api_base": "http://x"}),
            "api_base",
            "unsupported_parameter",
        ),
    ],
)
def test_bad_input_gets_openai_400(gateway, body, param, code):
    url, app = gateway
    response = _post(url, body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert (error["param"], error["code"]) == (param, code)
    [row] = ledger_rows(app)
    assert row["status"] == 400 and row["error"] == error["message"]


def test_oversized_body_is_413(upstream, tmp_path):
    with running_gateway(tmp_path, make_policy(upstream[0]), max_body_bytes=1000) as (url, app):
        response = _post(url, json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 5000}]}))
        assert response.status_code == 413
        assert response.json()["error"]["code"] == "body_too_large"
        assert ledger_rows(app)[0]["status"] == 413


@pytest.mark.parametrize(
    ("model", "status", "code"),
    [
        ("status-500", 502, "upstream_error"),
        ("status-400", 400, "upstream_rejected_request"),
        ("status-429", 429, "upstream_rate_limited"),
        ("status-401", 502, "upstream_authentication_failed"),
    ],
)
def test_upstream_errors_are_mapped(gateway, model, status, code):
    url, app = gateway
    with pytest.raises(openai.APIStatusError) as caught:
        client(url).chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}])
    assert caught.value.status_code == status
    body = caught.value.response.json()["error"]
    # a refused credential is summarised: providers quote the key back in that message
    assert body["code"] == code and ("fake upstream says" in body["message"]) == (model != "status-401")
    [row] = ledger_rows(app)
    [call] = ledger_rows(app, "upstream_calls")
    assert row["status"] == status and call["error"]


def test_upstream_timeout_is_504(upstream, tmp_path):
    base = upstream[0]
    policy = make_policy(
        base,
        name="t",
        cheap=fake_route(base, "slow", timeout=0.3),
        long=fake_route(base, "slow2"),
        routing=Whole(classifier=None),
        passthrough=DROP,
    )
    with running_gateway(tmp_path, policy) as (url, app):
        response = _post(url, json.dumps({"model": "openai/slow", "messages": [{"role": "user", "content": "x"}]}))
        assert response.status_code == 504
        assert response.json()["error"]["type"] == "timeout_error"
        assert ledger_rows(app)[0]["status"] == 504


def test_upstream_failure_while_streaming_starts_is_a_status_not_a_broken_stream(gateway):
    url, _ = gateway
    with pytest.raises(openai.APIStatusError) as caught:
        list(
            client(url).chat.completions.create(
                model="status-503", messages=[{"role": "user", "content": "x"}], stream=True
            )
        )
    assert caught.value.status_code == 502


def test_keys_are_required_when_configured(upstream, tmp_path):
    auth = Authenticator(keys=["sk-good"], admin_key="sk-admin")
    with running_gateway(tmp_path, make_policy(upstream[0]), auth=auth) as (url, app):
        for key, status in (("", 401), ("sk-wrong", 401)):
            headers = {"authorization": f"Bearer {key}"} if key else {}
            response = _post(url, json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]}), headers)
            assert response.status_code == status
            assert response.json()["error"]["type"] == "authentication_error"
        ok = client(url, "sk-good").chat.completions.create(
            model="openai/fake-cheap", messages=[{"role": "user", "content": "x"}]
        )
        assert ok.choices[0].message.content == "echo: x"
        rows = ledger_rows(app)
        # refused keys never reach the ledger: anyone can send them; a metric counts them instead
        assert [r["status"] for r in rows] == [200]
        assert rows[-1]["key_id"].startswith("k_") and "sk-good" not in json.dumps(rows)
        metrics = httpx.get(f"{url}/metrics").text
        assert "selfroute_unauthenticated_requests_total 2.0" in metrics
        assert "sk-good" not in metrics and "sk-wrong" not in metrics


def test_unknown_path_is_openai_404(gateway):
    url, _ = gateway
    response = httpx.get(f"{url}/v1/nothing")
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found_error"


def test_metrics_count_requests_through_the_real_app(gateway):
    url, app = gateway
    client(url).chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "x"}])
    _post(url, b"{broken")
    text = httpx.get(f"{url}/metrics").text
    assert 'selfroute_requests_total{route="passthrough",status="200"} 1.0' in text
    assert 'selfroute_requests_total{route="unknown",status="400"} 1.0' in text
    assert 'selfroute_tokens_total{kind="prompt",model="gpt-test",route="passthrough"} 1.0' in text


def test_client_leaving_mid_stream_stops_the_upstream_and_is_ledgered_as_499(gateway):
    import time

    url, app = gateway
    started = time.monotonic()
    with httpx.stream(
        "POST",
        f"{url}/v1/chat/completions",
        json={"model": "dribble", "stream": True, "messages": [{"role": "user", "content": "x"}]},
    ) as response:
        first = next(response.iter_lines())
        assert first.startswith("data: ")
    # the upstream would stream for 10 s; the gateway must notice the client left long before that
    deadline = time.monotonic() + 8
    rows = []
    while not rows and time.monotonic() < deadline:
        rows = ledger_rows(app)
        time.sleep(0.05)
    assert rows, "the request never reached the ledger"
    assert rows[0]["status"] == 499 and "client disconnected" in rows[0]["error"]
    assert time.monotonic() - started < 8


def test_malformed_upstream_chunk_ends_the_stream_with_an_error_event(gateway):
    url, app = gateway
    with httpx.stream(
        "POST",
        f"{url}/v1/chat/completions",
        json={"model": "garbled", "stream": True, "messages": [{"role": "user", "content": "x"}]},
    ) as response:
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    error = json.loads(lines[-2][len("data: ") :])["error"]
    assert error["code"] == "upstream_error" and "malformed" in error["message"]
    [row] = ledger_rows(app)
    assert row["status"] == 502


def test_retries_follow_the_policy_and_only_for_retryable_statuses(upstream, tmp_path):
    base, fake = upstream
    policy = make_policy(
        base,
        name="t",
        cheap=fake_route(base, "flaky", max_retries=1),
        long=fake_route(base, "status-400", max_retries=3),
        routing=Whole(classifier=None),
        passthrough=DROP,
    )
    with running_gateway(tmp_path, policy) as (url, app):
        before = len(fake.state.received)
        answer = client(url).chat.completions.create(model="openai/flaky", messages=[{"role": "user", "content": "x"}])
        assert answer.choices[0].message.content == "echo: x"
        assert len(fake.state.received) - before == 2  # a 503, then the retry that succeeded
        before = len(fake.state.received)
        with pytest.raises(openai.BadRequestError):
            client(url).chat.completions.create(model="openai/status-400", messages=[{"role": "user", "content": "x"}])
        assert len(fake.state.received) - before == 1  # a 400 is not retried


def test_cached_work_is_never_shared_between_keys(upstream, tmp_path, monkeypatch):
    """What the gateway remembers to answer faster — a question's vector, a conversation's embedded chunks — is kept
    per key: a second key asking the same thing pays for it again, so its timing cannot reveal the first key's
    request. The same key asking again reuses its own."""
    from pipelines.documents import Document
    from pipelines.embedding import Embedder
    from tests.support.pipelines import CountingEmbedder

    base, _ = upstream
    monkeypatch.setenv("OPENAI_API_BASE", f"{base}/v1")
    embedder = CountingEmbedder(Embedder())
    with running_gateway(tmp_path, make_policy(base), auth=Authenticator(["sk-one", "sk-two"]), embedder=embedder) as (
        url,
        app,
    ):
        store = app.state.gateway.store
        store.ingest("manuals", [Document("pumps", "Pump P3 is started only after valve V2 is open. " * 20)])

        def ask(key: str, body: dict) -> dict:
            response = httpx.post(
                f"{url}/v1/chat/completions",
                headers={"authorization": f"Bearer {key}"},
                json={"model": "selfroute", **body},
                timeout=120,
            )
            assert response.status_code == 200, response.text
            return response.json()["selfroute"]["provenance"]

        question = {
            "messages": [{"role": "user", "content": "When is pump P3 started?"}],
            "selfroute": {"route": "rag", "collection": "manuals"},
        }
        asked = []
        for key in ("sk-one", "sk-one", "sk-two", "sk-two"):
            ask(key, question)
            asked.append(embedder.queries_embedded)
        assert asked[1] == asked[0] and asked[2] > asked[1] and asked[3] == asked[2]

        conversation = {
            "messages": [
                {
                    "role": "user",
                    "content": "Log: " + "valve V2 opened, pump P3 ran. " * 300 + "\n\nQuestion: what ran?",
                }
            ],
            "selfroute": {"route": "rag"},
        }

        def inline() -> set[str]:
            return {c.name for c in store.collections() if store.is_inline(c.name)}

        def work() -> int:
            return embedder.texts_embedded + embedder.queries_embedded

        # the conversation's chunks are embedded once per key: a key's first question is answered from a first pass
        # (pipelines.store.pending) while they are embedded in the background; waiting for that ingestion before
        # looking makes the count the collections themselves, not how far the background got
        done = []
        for key, expected, index in (("sk-one", 1, "partial"), ("sk-one", 1, "full"), ("sk-two", 2, "partial")):
            before = work()
            assert ask(key, conversation)["retrieval_index"] == index, key  # sk-two: not sk-one's full index
            store.wait_inline(timeout=120)
            assert len(inline()) == expected, key
            done.append(work() - before)
        assert done[0] > 0 and done[1] == 0 and done[2] > 0  # sk-two pays for the embedding again


def test_attached_documents_dropped_by_another_replica_mid_request_are_embedded_again(upstream, tmp_path, monkeypatch):
    """Two replicas on one store (here a second DocumentStore on the gateway's directory), no idle period: the other
    replica, past the cap, drops the request's inline collection between its ingestion and its retrieval. The
    request embeds the documents again and answers; it used to be a 500 (KeyError from the search). (Documents
    embedded before answering: no first pass, pipelines.store.pending.)"""
    from pipelines.documents import Document
    from pipelines.store import DocumentStore

    base, _ = upstream
    monkeypatch.setenv("OPENAI_API_BASE", f"{base}/v1")
    policy = make_policy(base)
    update = {"inline_cache_collections": 1, "inline_cache_idle_seconds": 0, "first_pass_candidates": 0}
    policy = policy.model_copy(update={"rag": policy.rag.model_copy(update=update)})
    with running_gateway(tmp_path, policy) as (url, app):
        store = app.state.gateway.store
        other = DocumentStore(store.uri, store.embedder, policy.rag)
        real = store.inline_collection
        dropped = []

        def then_dropped_by_the_other_replica(docs, should_stop=None, scope=SHARED):
            name = real(docs, should_stop, scope)
            if not dropped:
                dropped.append(name)
                other.inline_collection([Document("gate", "The harbour gate opens at six.")])
                assert other.collection(name) is None
            return name

        monkeypatch.setattr(store, "inline_collection", then_dropped_by_the_other_replica)
        response = httpx.post(
            f"{url}/v1/chat/completions",
            timeout=120,
            json={
                "model": "selfroute",
                "messages": [{"role": "user", "content": "What is the vault code?"}],
                "selfroute": {"route": "rag", "documents": [{"id": "vault", "text": "The vault code is 4417."}]},
            },
        )
        assert response.status_code == 200, response.text
        assert dropped and response.json()["selfroute"]["route"] == "rag"
        assert store.collection(dropped[0]) is not None  # embedded again


def test_a_collection_deleted_while_a_request_reads_it_is_a_404(gateway, monkeypatch):
    from pipelines.documents import Document

    url, app = gateway
    store = app.state.gateway.store
    store.ingest("notes", [Document("v2", "Valve V2 opens clockwise.")])
    real = store.collection

    def then_deleted(name):
        info = real(name)
        store.delete_collection(name)  # by another request, or another replica, right after this one found it
        return info

    monkeypatch.setattr(store, "collection", then_deleted)
    response = httpx.post(
        f"{url}/v1/chat/completions",
        timeout=120,
        json={
            "model": "selfroute",
            "messages": [{"role": "user", "content": "How does V2 open?"}],
            "selfroute": {"route": "rag", "collection": "notes"},
        },
    )
    assert response.status_code == 404, response.text
    assert response.json()["error"]["code"] == "collection_not_found"


def test_litellm_style_metadata_tags_are_recorded_and_never_sent_upstream(gateway, upstream):
    url, app = gateway
    fake = upstream[1]
    for model in ("openai/fake-cheap", "selfroute"):  # pass-through and routed
        answer = client(url).chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "tagged"}],
            metadata={"tags": ["team-a", "batch", "team-a"], "run": "7"},
        )
        assert answer.choices[0].message.content
        sent = fake.state.received[-1]["body"]
        assert sent.get("metadata") == {"run": "7"}  # OpenAI takes only string metadata values
    rows = ledger_rows(app)
    assert [json.loads(r["provenance"])["tags"] for r in rows[-2:]] == [["team-a", "batch"]] * 2
    bad = _post(
        url,
        json.dumps(
            {
                "model": "openai/fake-cheap",
                "messages": [{"role": "user", "content": "x"}],
                "metadata": {"tags": ["x" * 200]},
            }
        ),
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "metadata.tags"
    listed = _post(
        url,
        json.dumps(
            {"model": "openai/fake-cheap", "messages": [{"role": "user", "content": "x"}], "metadata": {"run": ["a"]}}
        ),
    )
    assert listed.status_code == 400 and listed.json()["error"]["param"] == "metadata.run"
