from classifier.features import extract_features
from gateway.routing.inputs import document_stats, document_stats_from_info, retrieval_signals
from pipelines.chunking import Chunk, ScoredChunk
from pipelines.documents import Document
from pipelines.rag import Retrieval
from pipelines.store import CollectionInfo, DocumentInfo
from pipelines.tokens import count_tokens

CONTRACT = """MASTER AGREEMENT

1. Definitions

Terms defined in Section 4.2 apply throughout. The Supplier, as defined below, delivers the Goods.

2. Payment

Payment is due as set forth herein. See Section 3 and Appendix A for the schedule.

3. Termination

Either party may terminate under Clause 7 with notice.
"""
NOTE = "A short note with no headings and no references at all."


def test_document_stats_counts_tokens_sections_and_cross_references():
    docs = [Document("contract", CONTRACT), Document("note", NOTE)]
    stats = document_stats(docs)
    assert stats.context_tokens == count_tokens(CONTRACT) + count_tokens(NOTE)
    assert stats.max_document_tokens == count_tokens(CONTRACT)
    assert stats.n_documents == 2
    # headings: MASTER AGREEMENT, 1. Definitions, 2. Payment, 3. Termination
    assert stats.n_sections == 4
    # Section 4.2, "as defined below", "set forth herein", Section 3, Appendix A, Clause 7
    assert stats.cross_ref_count == 6
    assert extract_features("q", stats)["cross_ref_density"] == stats.cross_ref_density > 0


def test_stats_from_collection_info_match_stats_from_texts():
    def info(doc_id, text):
        from pipelines.structure import find_cross_references, split_sections

        return DocumentInfo(
            doc_id,
            None,
            None,
            count_tokens(text),
            [s.title for s in split_sections(text) if s.title],
            len(find_cross_references(text)),
            3,
            "h",
            {},
        )

    collection = CollectionInfo("c", [info("contract", CONTRACT), info("note", NOTE)])
    from_texts = document_stats([Document("contract", CONTRACT), Document("note", NOTE)])
    assert document_stats_from_info(collection) == from_texts
    only_note = document_stats_from_info(collection.documents, ids=["note"])
    assert only_note.n_documents == 1 and only_note.context_tokens == count_tokens(NOTE) and only_note.n_sections == 0


def _hit(doc_id, position, score, rank, text="t"):
    return ScoredChunk(
        Chunk(doc_id, position, text, None, 1, 0, 1), score=1.0 / (60 + max(rank, 1)), vector_score=score, rank=rank
    )


def test_retrieval_signals_keep_rank_order_and_drop_neighbours():
    hits = [_hit("a", 3, 0.61, 1, "first"), _hit("b", 0, 0.72, 2, "second"), _hit("a", 4, 0.2, 0, "neighbour")]
    signals = retrieval_signals(Retrieval("c", "q", hits, hits))
    assert signals.scores == [0.61, 0.72]
    assert signals.doc_ids == ["a", "b"] and signals.texts == ["first", "second"]
    assert retrieval_signals(Retrieval("c", "q", [], [])) is None and retrieval_signals(None) is None
