"""Bounded work per request (issue 21): the policy's request_limits on attached documents (count, bytes) and on
embedding inputs, refused before anything is scanned or embedded; non-finite numbers refused instead of forwarded
as Infinity; a non-string metadata.source on POST /v1/collections/x/documents a 400 instead of pyarrow's 500."""

from __future__ import annotations

import httpx
import pytest

from gateway.server.app import create_app
from gateway.settings import Settings
from pipelines.embedding import Embedder
from tests.support.gateway import ledger_rows
from tests.support.policies import make_policy
from tests.support.servers import serve_app

LIMITS = {"attached_documents": 3, "attached_bytes": 2000, "embedding_inputs": 4, "embedding_input_bytes": 1000}


@pytest.fixture(scope="module")
def embedder():
    return Embedder()


@pytest.fixture()
def gateway(upstream, embedder, tmp_path):
    app = create_app(
        Settings(data_dir=tmp_path), policy=make_policy(upstream[0], request_limits=LIMITS), embedder=embedder
    )
    with serve_app(app) as url:
        yield url, app


def _docs(n: int, size: int = 20) -> list[dict]:
    return [{"id": f"d{i}", "text": "x" * size} for i in range(n)]


def _post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=120)


def _chat(documents: list[dict]) -> dict:
    return {
        "model": "selfroute",
        "messages": [{"role": "user", "content": "What?"}],
        "selfroute": {"documents": documents},
    }


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/route/explain"])
def test_attached_documents_are_bounded_in_count_and_bytes(gateway, upstream, path):
    url, app = gateway
    calls = len(upstream[1].state.received)
    many = _post(url, path, _chat(_docs(4)))
    assert many.status_code == 400 and many.json()["error"]["code"] == "too_many_documents", many.text
    assert "request_limits.attached_documents" in many.json()["error"]["message"]
    large = _post(url, path, _chat(_docs(2, 1500)))
    assert large.status_code == 413 and large.json()["error"]["code"] == "documents_too_large", large.text
    # multi-byte text is counted in bytes: 700 characters of 3 bytes each are over 2,000 bytes
    wide = _post(url, path, _chat([{"id": "w", "text": "文" * 700}]))
    assert wide.status_code == 413, wide.text
    assert _post(url, path, _chat(_docs(3, 500))).status_code == 200
    assert store_inline_count(app) <= 1 and len(upstream[1].state.received) <= calls + 1


def store_inline_count(app) -> int:
    store = app.state.gateway.store
    return len([c for c in store.collections() if store.is_inline(c.name)])


def test_collection_posts_are_bounded_and_a_non_string_source_is_a_400(gateway):
    url, app = gateway
    many = _post(url, "/v1/collections/c/documents", {"documents": _docs(4)})
    assert many.status_code == 400 and many.json()["error"]["code"] == "too_many_documents"
    for source in (5, {"a": 1}, ["x"], True):
        bad = _post(
            url,
            "/v1/collections/c/documents",
            {"documents": [{"id": "a", "text": "Some text.", "metadata": {"source": source}}]},
        )
        assert bad.status_code == 400, bad.text
        assert bad.json()["error"]["param"] == "documents.0.metadata.source"
    fine = _post(
        url,
        "/v1/collections/c/documents",
        {
            "documents": [
                {"id": "a", "text": "Some text.", "metadata": {"source": "a.txt", "n": 5, "tags": ["x", {"y": 1}]}}
            ]
        },
    )
    assert fine.status_code == 201, fine.text
    assert {r["status"] for r in ledger_rows(app)} == {400, 201}


def test_embedding_inputs_are_bounded(gateway):
    url, app = gateway
    body = {"model": "local/all-minilm-l6-v2"}
    many = _post(url, "/v1/embeddings", {**body, "input": ["a"] * 5})
    assert many.status_code == 400 and many.json()["error"]["code"] == "too_many_inputs", many.text
    large = _post(url, "/v1/embeddings", {**body, "input": ["x" * 600, "y" * 600]})
    assert large.status_code == 413 and large.json()["error"]["code"] == "input_too_large", large.text
    assert _post(url, "/v1/embeddings", {**body, "input": ["a"] * 4}).status_code == 200


@pytest.mark.parametrize("number", ["1e400", "-1e400", "NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("model", ["selfroute", "openai/fake-cheap"])
def test_non_finite_numbers_are_refused_not_forwarded(gateway, upstream, number, model):
    url, _ = gateway
    calls = len(upstream[1].state.received)
    raw = (
        '{"model": "%s", "temperature": %s, "messages": [{"role": "user", "content": "hi"}]}' % (model, number)
    ).encode()
    response = httpx.post(
        f"{url}/v1/chat/completions", content=raw, timeout=30, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_value", response.text
    assert len(upstream[1].state.received) == calls  # nothing forwarded
