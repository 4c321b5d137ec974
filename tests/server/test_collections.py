"""The collections API on a real gateway (uvicorn, port 0): body errors, default document ids and
listing without inline collections — real MiniLM and LanceDB, fake upstream (never called here)."""
from __future__ import annotations

import httpx
import pytest

from gateway.server.app import create_app
from gateway.settings import Settings
from pipelines.documents import Document
from pipelines.embedding import Embedder
from pipelines.store import content_hash
from tests.gateway_fixtures import make_policy
from tests.servers import serve_app


@pytest.fixture(scope="module")
def embedder():
    return Embedder()


@pytest.fixture()
def gateway(upstream, embedder, tmp_path):
    """(collections base url, app) of a gateway sharing the module's embedding model."""
    policy = make_policy(upstream[0])
    settings = Settings(data_dir=tmp_path)
    app = create_app(settings, policy=policy, embedder=embedder)
    with serve_app(app) as url:
        yield f"{url}/v1/collections", app


@pytest.mark.parametrize("body", [b"{not json", b'{"documents": [', b"", b"   "])
def test_malformed_json_is_400_invalid_json(gateway, body):
    base, _ = gateway
    response = httpx.post(f"{base}/pumps/documents", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_json"
    assert "JSON" in error["message"] and "None" not in error["message"]


def test_body_that_is_not_an_object_is_400_invalid_type(gateway):
    base, _ = gateway
    response = httpx.post(f"{base}/pumps/documents", json=[{"text": "x"}])
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_type"


def test_invalid_documents_still_name_the_parameter(gateway):
    base, _ = gateway
    response = httpx.post(f"{base}/pumps/documents", json={"documents": [{"title": "no text"}]})
    error = response.json()["error"]
    assert response.status_code == 400 and error["code"] == "invalid_value"
    assert error["param"] == "documents.0.text"


def test_documents_without_ids_are_named_by_content_and_never_replace_each_other(gateway):
    base, _ = gateway
    first = httpx.post(f"{base}/notes/documents", json={"documents": [{"text": "The canteen opens at nine."}]},
                       timeout=120)
    second = httpx.post(f"{base}/notes/documents", json={"documents": [
        {"text": "The library closes at six.", "title": "Library"}]}, timeout=120)
    assert first.status_code == 201 and second.status_code == 201
    canteen_id = "doc-" + content_hash(Document("", "The canteen opens at nine."))[:12]
    library_id = "doc-" + content_hash(Document("", "The library closes at six.", title="Library"))[:12]
    assert first.json()["added"] == [canteen_id] and second.json()["added"] == [library_id]

    again = httpx.post(f"{base}/notes/documents", json={"documents": [{"text": "The canteen opens at nine."}]})
    assert again.status_code == 200 and again.json()["unchanged"] == [canteen_id]
    info = httpx.get(f"{base}/notes").json()
    assert {d["id"] for d in info["documents"]} == {canteen_id, library_id}


def test_listing_skips_inline_collections_without_reading_them(gateway, monkeypatch):
    base, app = gateway
    store = app.state.gateway.routing.store
    assert httpx.post(f"{base}/pumps/documents", json={"documents": [{"id": "memo", "text": "Valves close clockwise."}]},
                      timeout=120).status_code == 201
    inline = store.inline_collection([Document("a", "The vault code is 4417.")])
    read = []
    real_collection = store.collection
    monkeypatch.setattr(store, "collection", lambda name: read.append(name) or real_collection(name))

    listed = httpx.get(base).json()["data"]
    assert [(c["name"], c["document_count"]) for c in listed] == [("pumps", 1)]
    assert inline not in read and read == ["pumps"]
