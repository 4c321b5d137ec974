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
