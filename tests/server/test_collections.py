"""The collections API on a real gateway (uvicorn, port 0): body errors, default document ids and
listing without inline collections — real MiniLM and LanceDB, fake upstream (never called here)."""

from __future__ import annotations

import json

import httpx
import pytest

from gateway.server.app import create_app
from gateway.settings import Settings
from pipelines.documents import Document
from pipelines.embedding import Embedder
from pipelines.store import content_hash
from tests.support.policies import make_policy
from tests.support.servers import serve_app


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
    first = httpx.post(
        f"{base}/notes/documents", json={"documents": [{"text": "The canteen opens at nine."}]}, timeout=120
    )
    second = httpx.post(
        f"{base}/notes/documents",
        json={"documents": [{"text": "The library closes at six.", "title": "Library"}]},
        timeout=120,
    )
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
    store = app.state.gateway.store
    assert (
        httpx.post(
            f"{base}/pumps/documents",
            json={"documents": [{"id": "memo", "text": "Valves close clockwise."}]},
            timeout=120,
        ).status_code
        == 201
    )
    inline = store.inline_collection([Document("a", "The vault code is 4417.")])
    read = []
    real_collection = store.collection
    monkeypatch.setattr(store, "collection", lambda name: read.append(name) or real_collection(name))

    listed = httpx.get(base).json()["data"]
    assert [(c["name"], c["document_count"]) for c in listed] == [("pumps", 1)]
    assert inline not in read and read == ["pumps"]


# -- per-key collections ----------------------------------------------------------------------------------
ADMIN = "sk-admin-collections"
CONTRACT = "The supplier shall deliver the pumps within 30 days. Governing law: the laws of Norway apply."


@pytest.fixture()
def tenants(upstream, embedder, tmp_path, monkeypatch):
    """A gateway with an admin key and named keys: alice, bob, and carol (granted alice's collection)."""
    from gateway.server.auth import Authenticator

    monkeypatch.setenv("OPENAI_API_BASE", f"{upstream[0]}/v1")
    app = create_app(
        Settings(data_dir=tmp_path),
        policy=make_policy(upstream[0]),
        embedder=embedder,
        auth=Authenticator(admin_key=ADMIN),
    )
    with serve_app(app) as url:
        keys = app.state.gateway.keys
        secrets = {
            name: keys.create(name, **extra)[1]
            for name, extra in [("alice", {}), ("bob", {}), ("carol", {"collections": ["contracts"]})]
        }
        secrets["admin"] = ADMIN
        response = httpx.post(
            f"{url}/v1/collections/contracts/documents",
            timeout=120,
            headers=_auth(secrets["alice"]),
            json={"documents": [{"id": "supply", "text": CONTRACT}]},
        )
        assert response.status_code == 201
        yield url, app, secrets


def _auth(key: str) -> dict:
    return {"authorization": f"Bearer {key}"}


def _chat(url: str, key: str, route: str, collection: str, by_header: bool = False) -> httpx.Response:
    body = {
        "model": "selfroute",
        "messages": [{"role": "user", "content": "Which law governs the contract?"}],
        "selfroute": {"route": route},
    }
    headers = _auth(key)
    if by_header:
        headers["x-selfroute-collection"] = collection
    else:
        body["selfroute"]["collection"] = collection
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=120)


def _requests(url: str, key: str, name: str) -> dict[str, httpx.Response]:
    """One request to every endpoint that names a collection."""
    headers = _auth(key)
    explain = {
        "model": "selfroute",
        "messages": [{"role": "user", "content": "Which law?"}],
        "selfroute": {"collection": name},
    }
    return {
        "get": httpx.get(f"{url}/v1/collections/{name}", headers=headers),
        "chat rag": _chat(url, key, "rag", name),
        "chat long": _chat(url, key, "long", name),
        "chat header": _chat(url, key, "rag", name, by_header=True),
        "explain": httpx.post(f"{url}/v1/route/explain", json=explain, headers=headers, timeout=120),
        "delete": httpx.delete(f"{url}/v1/collections/{name}/documents/supply", headers=headers),
        "delete collection": httpx.delete(f"{url}/v1/collections/{name}", headers=headers),
        "write": httpx.post(
            f"{url}/v1/collections/{name}/documents",
            headers=headers,
            timeout=120,
            json={"documents": [{"id": "bob-note", "text": "Bob was here."}]},
        ),
    }


def _listed(url: str, key: str) -> list[str]:
    return [c["name"] for c in httpx.get(f"{url}/v1/collections", headers=_auth(key)).json()["data"]]


def test_another_keys_collection_is_indistinguishable_from_an_absent_one(tenants):
    url, app, keys = tenants
    assert _listed(url, keys["bob"]) == []
    forbidden = _requests(url, keys["bob"], "contracts")
    absent = _requests(url, keys["bob"], "nothing-here")
    for endpoint, response in forbidden.items():
        assert response.status_code == 404, endpoint
        missing = absent[endpoint]
        if endpoint != "write":  # writing to an absent name creates it
            assert response.json() == {
                "error": {
                    **missing.json()["error"],
                    "message": missing.json()["error"]["message"].replace("nothing-here", "contracts"),
                }
            }, endpoint
    # nothing of bob's reached alice's collection, and alice's document is still there
    info = httpx.get(f"{url}/v1/collections/contracts", headers=_auth(keys["alice"])).json()
    assert [d["id"] for d in info["documents"]] == ["supply"]


def test_the_owner_a_granted_key_and_the_admin_key_see_the_collection(tenants):
    url, app, keys = tenants
    for who in ("alice", "carol", "admin"):
        assert "contracts" in _listed(url, keys[who]), who
        assert httpx.get(f"{url}/v1/collections/contracts", headers=_auth(keys[who])).status_code == 200
        for route in ("rag", "long"):
            response = _chat(url, keys[who], route, "contracts")
            assert response.status_code == 200, (who, route, response.text)
            assert response.json()["selfroute"]["provenance"]["source"] == "collection"
    written = httpx.post(
        f"{url}/v1/collections/contracts/documents",
        headers=_auth(keys["carol"]),
        timeout=120,
        json={"documents": [{"id": "annex", "text": "Annex A lists the pump models."}]},
    )
    assert written.status_code == 201  # a grant shares the collection, writing included
    deleted = httpx.delete(f"{url}/v1/collections/contracts/documents/annex", headers=_auth(keys["alice"]))
    assert deleted.status_code == 200


def test_a_name_another_key_created_cannot_be_taken_over(tenants):
    url, app, keys = tenants
    created = httpx.post(
        f"{url}/v1/collections/bobs/documents",
        headers=_auth(keys["bob"]),
        timeout=120,
        json={"documents": [{"id": "b", "text": "Bob's private notes."}]},
    )
    assert created.status_code == 201
    assert _listed(url, keys["bob"]) == ["bobs"]
    assert sorted(_listed(url, keys["admin"])) == ["bobs", "contracts"]
    taken = httpx.post(
        f"{url}/v1/collections/bobs/documents",
        headers=_auth(keys["alice"]),
        timeout=120,
        json={"documents": [{"id": "b", "text": "Alice overwrites."}]},
    )
    assert taken.status_code == 404
    assert app.state.gateway.keys.collection_owners()["bobs"] == "bob"


def test_inline_collections_of_attached_documents_are_not_reachable_by_name(tenants):
    url, app, keys = tenants
    body = {
        "model": "selfroute",
        "messages": [{"role": "user", "content": "What is the vault code?"}],
        "selfroute": {"route": "rag", "documents": [{"id": "v", "text": "The vault code is 4417."}]},
    }
    assert (
        httpx.post(f"{url}/v1/chat/completions", json=body, headers=_auth(keys["alice"]), timeout=120).status_code
        == 200
    )
    store = app.state.gateway.store
    store.wait_inline(timeout=120)  # answered from the first pass: the collection is written in the background
    [name] = [c.name for c in store.collections() if store.is_inline(c.name)]
    for who in ("alice", "bob"):
        assert _chat(url, keys[who], "rag", name).status_code == 404
        assert httpx.get(f"{url}/v1/collections/{name}", headers=_auth(keys[who])).status_code == 404


def test_attached_documents_are_cached_per_key(tenants):
    url, app, keys = tenants
    body = {
        "model": "selfroute",
        "messages": [{"role": "user", "content": "What is the vault code?"}],
        "selfroute": {"route": "rag", "documents": [{"id": "v", "text": "The vault code is 4417."}]},
    }
    store = app.state.gateway.store

    def inline() -> set[str]:
        return {c.name for c in store.collections() if store.is_inline(c.name)}

    for who, expected in (("alice", 1), ("alice", 1), ("bob", 2)):
        response = httpx.post(f"{url}/v1/chat/completions", json=body, headers=_auth(keys[who]), timeout=120)
        assert response.status_code == 200
        store.wait_inline(timeout=120)  # a first question's collection is written in the background
        assert len(inline()) == expected, who  # alice's second request reuses hers; bob gets his own


def test_delete_a_whole_collection(gateway):
    base, _ = gateway
    assert (
        httpx.post(
            f"{base}/drop-me/documents",
            json={
                "documents": [
                    {"id": "a", "text": "Valves close clockwise."},
                    {"id": "b", "text": "Pumps start slowly."},
                ]
            },
            timeout=120,
        ).status_code
        == 201
    )
    deleted = httpx.delete(f"{base}/drop-me")
    assert deleted.status_code == 200
    assert deleted.json() == {
        "id": "drop-me",
        "object": "collection",
        "deleted": True,
        "name_kept": False,
        "document_count": 2,
        "chunk_count": 2,
    }  # nobody owned it: nothing to keep
    assert httpx.get(f"{base}/drop-me").status_code == 404
    again = httpx.delete(f"{base}/drop-me")
    assert again.status_code == 404 and again.json()["error"]["code"] == "collection_not_found"
    assert httpx.delete(f"{base}/bad name!").json()["error"]["code"] == "invalid_collection"


def test_only_those_who_see_a_collection_can_delete_it(tenants):
    url, app, keys = tenants
    refused = httpx.delete(f"{url}/v1/collections/contracts", headers=_auth(keys["bob"]))
    absent = httpx.delete(f"{url}/v1/collections/nothing-here", headers=_auth(keys["bob"]))
    assert refused.status_code == absent.status_code == 404
    assert refused.json()["error"]["code"] == absent.json()["error"]["code"] == "collection_not_found"
    assert httpx.get(f"{url}/v1/collections/contracts", headers=_auth(keys["alice"])).status_code == 200
    deleted = httpx.delete(f"{url}/v1/collections/contracts", headers=_auth(keys["alice"]))
    assert deleted.status_code == 200 and deleted.json()["document_count"] == 1
    assert _listed(url, keys["admin"]) == []


def test_a_name_that_is_no_collection_name_is_a_400_and_claims_nothing(tenants):
    url, app, keys = tenants
    for raw in ("bobs%0A", "%2e%2e", "caf%C3%A9", "a%5Cb", "%00"):
        response = httpx.post(
            f"{url}/v1/collections/{raw}/documents",
            headers=_auth(keys["bob"]),
            timeout=120,
            json={"documents": [{"id": "b", "text": "Bob's notes."}]},
        )
        assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_collection", raw
    # a decoded '/' is no longer one path segment: no route, no store access
    escaped = httpx.post(
        f"{url}/v1/collections/..%2F..%2Foutside/documents",
        headers=_auth(keys["bob"]),
        json={"documents": [{"id": "b", "text": "x"}]},
    )
    assert escaped.status_code == 404
    assert set(app.state.gateway.keys.collection_owners()) == {"contracts"}


def test_a_deleted_collections_name_stays_its_owners(tenants):
    """Deleting removes the documents, not the owner's claim: alice can create the name again, bob still cannot
    take it (and so never inherits carol's grant or requests that still name it)."""
    url, app, keys = tenants
    deleted = httpx.delete(f"{url}/v1/collections/contracts", headers=_auth(keys["alice"]))
    assert deleted.status_code == 200 and deleted.json()["name_kept"] is True
    assert httpx.get(f"{url}/v1/collections/contracts", headers=_auth(keys["alice"])).status_code == 404
    body = {"documents": [{"id": "new", "text": "A new supply contract: delivery within 10 days."}]}
    taken = httpx.post(f"{url}/v1/collections/contracts/documents", headers=_auth(keys["bob"]), json=body, timeout=120)
    assert taken.status_code == 404 and taken.json()["error"]["code"] == "collection_not_found"
    again = httpx.post(
        f"{url}/v1/collections/contracts/documents", headers=_auth(keys["alice"]), json=body, timeout=120
    )
    assert again.status_code == 201
    assert app.state.gateway.keys.collection_owners()["contracts"] == "alice"
    granted = httpx.get(f"{url}/v1/collections/contracts", headers=_auth(keys["carol"])).json()
    assert [d["id"] for d in granted["documents"]] == ["new"]  # carol's grant still means alice's collection


def _old_inline_name(docs: list[Document]) -> str:
    """How inline collections were named before they were keyed by the store's secret: anyone could compute it."""
    import hashlib

    digest = hashlib.sha256()
    for doc in sorted(docs, key=lambda d: d.id):
        digest.update(doc.id.encode("utf-8") + b"\0" + content_hash(doc).encode() + b"\0")
    return "inline-" + digest.hexdigest()[:24]


def test_a_key_cannot_plant_documents_in_another_keys_inline_collection(tenants, upstream):
    """The attack of issue 21: alice computes the inline collection name of the contract bob is about to attach,
    posts a forged text under it, and bob's request answers from alice's text. The name is no longer computable
    (an HMAC under the store's secret), `inline-*` names are refused to every writer (even with the real name in
    hand), and a cached inline collection is used only when it holds exactly the request's content hashes."""
    from pipelines.scope import KeyScope

    url, app, keys = tenants
    genuine = "The vault code is 4417."
    # the old formula saw bob's key in the documents' metadata; the key scope is now passed to the name itself
    old_name = _old_inline_name([Document("v", genuine, metadata={"selfroute_key": "bob"})])
    store = app.state.gateway.store
    real_name = store.inline_name([Document("v", genuine)], KeyScope("bob"))
    assert real_name != old_name
    for name in (old_name, real_name):
        for who in ("alice", "admin"):
            planted = httpx.post(
                f"{url}/v1/collections/{name}/documents",
                headers=_auth(keys[who]),
                timeout=120,
                json={"documents": [{"id": "v", "text": "The vault code is 0000."}]},
            )
            assert planted.status_code == 400, planted.text
            assert planted.json()["error"]["code"] == "invalid_collection"
            assert "reserved" in planted.json()["error"]["message"]
    assert not [c.name for c in store.collections() if store.is_inline(c.name)]  # nothing was created
    body = {
        "model": "selfroute",
        "messages": [{"role": "user", "content": "What is the vault code?"}],
        "selfroute": {"route": "rag", "documents": [{"id": "v", "text": genuine}]},
    }
    response = httpx.post(f"{url}/v1/chat/completions", json=body, headers=_auth(keys["bob"]), timeout=120)
    assert response.status_code == 200, response.text
    sent = json.dumps(upstream[1].state.received[-1])  # what the model was given to answer from
    assert "4417" in sent and "0000" not in sent


def test_a_forged_inline_collection_with_the_right_count_is_not_answered_from(embedder, tmp_path):
    """Even where something other than the gateway wrote an inline collection's tables (same name, same number of
    documents, other content), the gateway compares content hashes, embeds its own documents and removes the
    stranger."""
    from pipelines.store import DocumentStore

    store = DocumentStore(str(tmp_path / "db"), embedder)
    docs = [Document("v", "The vault code is 4417.")]
    name = store.inline_name(docs)
    store.ingest(name, [Document("v", "The vault code is 0000.")])  # the store's own writer: no name check
    assert store.inline_collection(docs) == name
    assert [d.text for d in store.documents(name)] == ["The vault code is 4417."]
    store.ingest(name, [Document("x", "Planted beside it.")])
    assert store.inline_collection(docs) == name
    assert [d.id for d in store.documents(name)] == ["v"]
