from dataclasses import replace

import numpy as np

from pipelines.store.vectors import ChunkVectorCache
from tests.support.pipelines import distractor_documents, manual_document


def test_chunk_vectors_are_read_once_per_document_version(store):
    doc = manual_document()
    store.ingest("docs", [doc])
    first = store.chunk_vectors("docs", [doc.id])[doc.id]
    assert len(first) == store.collection("docs").documents[0].chunks and first.vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(first.vectors, axis=1), 1, atol=1e-3)
    assert list(first.starts) == sorted(first.starts)  # position order
    assert store.chunk_vectors("docs", [doc.id])[doc.id] is first  # from memory
    store.ingest("docs", [replace(doc, text=doc.text + "\n\nA new closing paragraph about the pump.")])
    again = store.chunk_vectors("docs", [doc.id])[doc.id]
    assert again is not first and len(again) >= len(first)  # a replaced document is read afresh
    assert store.chunk_vectors("docs", []) == {}


def test_the_cache_holds_at_most_its_chunks_least_recently_used_dropped_first(store):
    docs = distractor_documents()[:3]
    store.ingest("docs", docs)
    sizes = {d.id: d.chunks for d in store.collection("docs").documents}
    docs_table, chunks_table = store._tables("docs")
    cache = ChunkVectorCache(max_chunks=sizes[docs[0].id] + sizes[docs[1].id])
    read = cache.read("docs", docs_table, chunks_table, [docs[0].id], store.embedder.dimension)
    cache.read("docs", docs_table, chunks_table, [docs[1].id], store.embedder.dimension)
    assert cache.read("docs", docs_table, chunks_table, [docs[0].id], 0)[docs[0].id] is read[docs[0].id]
    cache.read("docs", docs_table, chunks_table, [docs[2].id], store.embedder.dimension)  # docs[1] goes
    assert cache.read("docs", docs_table, chunks_table, [docs[0].id], 0)[docs[0].id] is read[docs[0].id]
    assert cache._vectors.currsize <= cache._vectors.maxsize
