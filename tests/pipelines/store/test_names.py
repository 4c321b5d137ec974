import pytest

from pipelines.store import check_writable_name, validate_collection_name
from tests.support.pipelines import manual_document


def test_collection_names_are_validated(store):
    for bad in [
        "",
        "a/b",
        "../x",
        "white space",
        "semi;colon",
        ".hidden",
        "x" * 129,
        "abc\n",
        "..",
        "/etc",
        "a\\b",
        "%2e%2e",
        "\uff0e\uff0e",
        "caf\u00e9",
        "a\x00b",
    ]:
        with pytest.raises(ValueError, match="invalid collection name"):
            validate_collection_name(bad)
        with pytest.raises(ValueError):
            store.ingest(bad, [manual_document()])
    assert validate_collection_name("Contracts-2024_v1.2") == "Contracts-2024_v1.2"


def test_inline_collection_names_are_reserved_for_the_gateway(store):
    with pytest.raises(ValueError, match="reserved"):
        check_writable_name("inline-0123456789abcdef")
    assert check_writable_name("contracts") == "contracts"


def test_a_document_s_content_hash_is_stable_and_computed_once(monkeypatch):
    import json

    from pipelines.documents import Document
    from pipelines.store import content_hash

    doc = Document("a", "Ünïcode text", title="T", metadata={"b": 1, "a": [2]})
    # the digest stored with every ingested document: a change of format would re-embed every collection
    assert content_hash(doc) == "4c857e80420da9a8cccc3424c64ec2fb8b392b3424834cacd53314cc759feeb9"
    assert content_hash(Document("other id", doc.text, title="T", metadata={"a": [2], "b": 1})) == content_hash(doc)
    assert content_hash(Document("a", doc.text, title="U", metadata=doc.metadata)) != content_hash(doc)
    calls = []
    dumps = json.dumps
    monkeypatch.setattr(json, "dumps", lambda *a, **k: calls.append(1) or dumps(*a, **k))
    fresh = Document("b", "x" * 100_000)
    assert content_hash(fresh) == content_hash(fresh) == fresh.content_hash
    assert len(calls) == 1  # a request's long document is hashed once, however many caches look it up
