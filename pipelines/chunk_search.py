"""Hybrid search over a collection's chunk table: a vector (cosine) ranking and a full-text (BM25)
ranking fused by reciprocal rank, and the conversion of chunk rows back into Chunks."""

from __future__ import annotations

import logging
import re

import numpy as np

from pipelines.chunking import Chunk, ScoredChunk

log = logging.getLogger(__name__)

# the chunk table's columns besides its vector
CHUNK_COLUMNS = ["doc_id", "position", "text", "section", "tokens", "start", "end"]


def row_chunk(row: dict) -> Chunk:
    return Chunk(row["doc_id"], row["position"], row["text"], row["section"], row["tokens"], row["start"], row["end"])


def hybrid_search(
    table, query: str, query_vector: np.ndarray, k: int, *, hybrid: bool, rrf_k: int
) -> list[ScoredChunk]:
    """The k best chunks of a LanceDB chunk table for `query` (embedded as query_vector); without
    `hybrid`, the vector ranking alone."""
    depth = max(3 * k, 20)
    columns = CHUNK_COLUMNS + ["vector"]
    vector_hits = (
        table.search(query_vector, vector_column_name="vector")
        .distance_type("cosine")
        .select(columns + ["_distance"])  # naming the score column keeps lance from warning
        .limit(depth)
        .to_list()
    )
    text_hits = _text_search(table, query, depth, columns) if hybrid else []
    return fuse_rankings(vector_hits, text_hits, query_vector, k, rrf_k)


def _text_search(table, query: str, depth: int, columns: list[str]) -> list[dict]:
    # the query parser treats some punctuation as syntax; plain words are what we mean
    terms = " ".join(re.findall(r"\w+", query))
    if not terms:
        return []
    try:
        return table.search(terms, query_type="fts").select(columns + ["_score"]).limit(depth).to_list()
    except Exception as exc:  # e.g. an index not built yet: fall back to vector-only ranking
        log.warning("full-text search failed on %s: %s", table.name, exc)
        return []


def fuse_rankings(
    vector_hits: list[dict], text_hits: list[dict], query_vector: np.ndarray, k: int, rrf_k: int
) -> list[ScoredChunk]:
    """Reciprocal rank fusion: score = sum over rankings of 1 / (rrf_k + rank)."""
    entries: dict[tuple[str, int], dict] = {}
    for field_name, hits in (("vector_rank", vector_hits), ("text_rank", text_hits)):
        for rank, row in enumerate(hits, start=1):
            key = (row["doc_id"], row["position"])
            entry = entries.setdefault(key, {"row": row, "score": 0.0})
            if field_name not in entry:
                entry[field_name] = rank
                entry["score"] += 1.0 / (rrf_k + rank)
    ranked = sorted(entries.values(), key=lambda e: (-e["score"], e.get("vector_rank") or 10**9))[:k]
    return [
        ScoredChunk(
            chunk=row_chunk(e["row"]),
            score=e["score"],
            vector_score=float(np.dot(np.asarray(e["row"]["vector"], dtype=np.float32), query_vector)),
            rank=i,
            vector_rank=e.get("vector_rank"),
            text_rank=e.get("text_rank"),
        )
        for i, e in enumerate(ranked, start=1)
    ]
