"""Stored chunk vectors kept in memory for long-context scoring: read from the store once per document version."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from pipelines.cache import LockedLRU
from pipelines.store import filters
from pipelines.store.tables import SPACE

# chunk vectors kept (384 floats each: 50,000 are about 77 MB)
VECTOR_CACHE_CHUNKS = 50_000


@dataclass(frozen=True)
class ChunkVectors:
    """One document's chunks as arrays: character spans and unit vectors, in position order."""

    starts: np.ndarray
    ends: np.ndarray
    vectors: np.ndarray

    def __len__(self) -> int:
        return len(self.starts)


class ChunkVectorCache:
    """(collection, doc id, content hash and embedding space) -> ChunkVectors, at most VECTOR_CACHE_CHUNKS chunks in
    all (least recently used dropped first); the hash and space keep a replaced or re-embedded document from being
    scored with its old vectors."""

    def __init__(self, max_chunks: int = VECTOR_CACHE_CHUNKS):
        self._vectors: LockedLRU[tuple[str, str, str], ChunkVectors] = LockedLRU(max_chunks, getsizeof=len)

    def read(
        self, collection: str, docs_table, chunks_table, doc_ids: Iterable[str], dimension: int
    ) -> dict[str, ChunkVectors]:
        """doc id -> its chunks' spans and vectors, from memory when this version of it was read before."""
        ids = sorted(set(doc_ids))
        if not ids:
            return {}
        spaced = SPACE in docs_table.schema.names
        columns = ["id", "content_hash", *([SPACE] if spaced else [])]
        rows = docs_table.search().where(filters.among("id", ids)).select(columns).limit(None).to_arrow()
        # the version read: its content and the space its vectors are in (re-embedded, the same hash has new vectors)
        spaces = rows[SPACE].to_pylist() if spaced else [None] * rows.num_rows
        current = {
            i: f"{h}@{space}"
            for i, h, space in zip(rows["id"].to_pylist(), rows["content_hash"].to_pylist(), spaces, strict=True)
        }
        found: dict[str, ChunkVectors] = {}
        for doc_id, digest in current.items():
            entry = self._vectors.get((collection, doc_id, digest))
            if entry is not None:
                found[doc_id] = entry
        missing = [d for d in current if d not in found]
        if missing:
            table = (
                chunks_table.search()
                .where(filters.among("doc_id", missing))
                .select(["doc_id", "position", "start", "end", "vector"])
                .limit(None)
                .to_arrow()
            )
            owners = np.asarray(table["doc_id"].to_pylist(), dtype=object)
            positions = table["position"].to_numpy()
            starts, ends = table["start"].to_numpy(), table["end"].to_numpy()
            vectors = (
                table["vector"].combine_chunks().flatten().to_numpy().reshape(len(table), -1)
                if len(table)
                else np.zeros((0, dimension), np.float32)
            )
            for doc_id in missing:
                mine = np.flatnonzero(owners == doc_id)
                mine = mine[np.argsort(positions[mine], kind="stable")]
                entry = ChunkVectors(starts[mine], ends[mine], np.ascontiguousarray(vectors[mine], np.float32))
                found[doc_id] = entry
                self._vectors.put((collection, doc_id, current[doc_id]), entry)
        return found
