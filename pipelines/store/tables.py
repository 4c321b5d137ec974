"""The LanceDB tables behind a collection, and the writes every table of the store shares."""

from __future__ import annotations

import logging
from datetime import timedelta

import pyarrow as pa

log = logging.getLogger(__name__)

DOCS, CHUNKS = "__docs", "__chunks"  # a collection is <name>__docs and <name>__chunks
# Lance's (unenforced) primary key: concurrent upserts of the same new key then conflict and retry
# instead of both inserting it
PRIMARY_KEY = {"lance-schema:unenforced-primary-key": "true"}
KEEP_OLD_VERSIONS = timedelta(minutes=5)
SPACE = "embedding_space"  # the docs table's column: the vector space of the document's chunks


def upsert(table, keys: list[str], data: pa.Table) -> None:
    if data.num_rows:
        table.merge_insert(keys).when_matched_update_all().when_not_matched_insert_all().execute(data)


def compact(table) -> None:
    # compaction keeps reads fast after many small writes and folds new rows into the indexes;
    # versions older than a few minutes go, so in-flight reads of an older version still finish
    try:
        table.optimize(cleanup_older_than=KEEP_OLD_VERSIONS)
    except Exception as exc:  # optimisation is an optimisation: a failure must not lose the write
        log.warning("could not optimise %s: %s", table.name, exc)


def docs_schema() -> pa.Schema:
    return pa.schema(
        [
            pa.field("id", pa.string(), nullable=False, metadata=PRIMARY_KEY),
            ("title", pa.string()),
            ("source", pa.string()),
            ("text", pa.large_string()),
            ("content_hash", pa.string()),
            ("tokens", pa.int64()),
            ("sections", pa.list_(pa.string())),
            ("cross_refs", pa.int64()),
            ("chunks", pa.int64()),
            ("metadata", pa.string()),
            # the vector space its chunks were embedded in (pipelines.embedding.embedding_space); null in a row
            # written before it was recorded (taken to be pipelines.embedding.legacy_space)
            (SPACE, pa.string()),
        ]
    )


def with_space_column(docs_table):
    """A docs table written before the embedding space was recorded gets the column (null: legacy_space)."""
    if SPACE in docs_table.schema.names:
        return docs_table
    try:
        docs_table.add_columns({SPACE: "CAST(NULL AS STRING)"})
    except Exception:  # another process added it at the same moment: a commit conflict
        docs_table.checkout_latest()
        if SPACE not in docs_table.schema.names:
            raise
    return docs_table


def chunks_schema(dimension: int) -> pa.Schema:
    return pa.schema(
        [
            pa.field("doc_id", pa.string(), nullable=False, metadata=PRIMARY_KEY),
            pa.field("position", pa.int64(), nullable=False, metadata=PRIMARY_KEY),
            ("text", pa.string()),
            ("section", pa.string()),
            ("tokens", pa.int64()),
            ("start", pa.int64()),
            ("end", pa.int64()),
            ("vector", pa.list_(pa.float32(), dimension)),
        ]
    )
