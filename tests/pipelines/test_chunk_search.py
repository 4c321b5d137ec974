import numpy as np

from pipelines.chunk_search import CHUNK_COLUMNS, fuse_rankings, row_chunk


def hit(doc_id: str, position: int, vector: list[float]) -> dict:
    return {
        "doc_id": doc_id,
        "position": position,
        "text": f"{doc_id} #{position}",
        "section": None,
        "tokens": 3,
        "start": 0,
        "end": 5,
        "vector": vector,
    }


def test_fuse_rankings_sums_reciprocal_ranks_of_both_lists():
    query = np.array([1.0, 0.0], dtype=np.float32)
    a, b, c, d = hit("a", 0, [1.0, 0.0]), hit("b", 1, [0.6, 0.8]), hit("c", 0, [0.0, 1.0]), hit("d", 2, [0.8, 0.6])
    fused = fuse_rankings([a, b, c], [c, d], query, k=3, rrf_k=60)
    # c is in both lists (3rd and 1st), so it beats a (1st in one); b and d tie on 1/62, b has a vector rank
    assert [(h.chunk.doc_id, h.rank) for h in fused] == [("c", 1), ("a", 2), ("b", 3)]
    assert fused[0].score == 1 / 63 + 1 / 61 and fused[1].score == 1 / 61
    assert (fused[0].vector_rank, fused[0].text_rank) == (3, 1)
    assert (fused[1].vector_rank, fused[1].text_rank) == (1, None)
    assert [round(h.vector_score, 6) for h in fused] == [0.0, 1.0, 0.6]


def test_a_chunk_found_by_keyword_only_still_carries_its_cosine_similarity():
    query = np.array([0.0, 1.0], dtype=np.float32)
    (only,) = fuse_rankings([], [hit("x", 4, [0.6, 0.8])], query, k=5, rrf_k=10)
    assert only.vector_rank is None and only.text_rank == 1 and round(only.vector_score, 6) == 0.8
    assert only.chunk == row_chunk(hit("x", 4, [0.6, 0.8]))
    assert set(CHUNK_COLUMNS) <= set(hit("x", 4, []))
