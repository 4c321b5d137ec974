import lancedb
import pyarrow as pa

from pipelines.store import filters

IDS = ["plain", "a' OR '1'='1", "x\\' OR 1=1 --", "it's", "100%_", '"quoted"']


def test_values_are_literals_never_query_text(tmp_path):
    table = lancedb.connect(str(tmp_path / "db")).create_table(
        "t", pa.table({"doc_id": IDS, "position": list(range(len(IDS)))})
    )
    for value in IDS:
        assert table.search().where(filters.equals("doc_id", value)).limit(None).to_list()[0]["doc_id"] == value
    assert {r["doc_id"] for r in table.search().where(filters.among("doc_id", IDS[1:3])).limit(None).to_list()} == set(
        IDS[1:3]
    )
    assert table.search().where(filters.positions("it's", [2, 3, 9])).limit(None).to_list()[0]["position"] == 3
    assert [r["doc_id"] for r in table.search().where(filters.positions_from('"quoted"', 5)).limit(None).to_list()] == [
        '"quoted"'
    ]
    table.delete(filters.among("doc_id", IDS[1:]))
    assert table.search().limit(None).to_arrow()["doc_id"].to_pylist() == ["plain"]


def test_many_terms_are_ored_in_batches():
    terms = [filters.equals("position", i) for i in range(filters.BATCH * 2 + 1)]
    assert [len(b.to_sql().split(" OR ")) for b in filters.batches(terms)] == [filters.BATCH, filters.BATCH, 1]
