"""Turn pipeline objects (documents, collection info, a retrieval) into the router's plain inputs.

The gateway, `selfroute train` and the replay evaluation all go through these functions, so the
classifier sees features computed the same way everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from classifier.features import DocumentStats, RetrievalSignals
from pipelines.documents import Document
from pipelines.rag import Retrieval
from pipelines.structure import find_cross_references, split_sections
from pipelines.tokens import count_tokens


def document_stats(documents: Sequence[Document]) -> DocumentStats:
    """Tokens (tiktoken cl100k), titled sections and cross-references over the documents.
    Sections count headings only (an untitled preamble is not a section), as the store records them."""
    tokens = [count_tokens(doc.text) for doc in documents]
    return DocumentStats(
        context_tokens=sum(tokens),
        max_document_tokens=max(tokens, default=0),
        n_documents=len(documents),
        n_sections=sum(sum(1 for s in split_sections(doc.text) if s.title) for doc in documents),
        cross_ref_count=sum(len(find_cross_references(doc.text)) for doc in documents),
    )


def document_stats_from_info(documents: Iterable[Any], ids: Iterable[str] | None = None) -> DocumentStats:
    """The same statistics from an ingested collection's per-document records
    (pipelines.store.DocumentInfo: tokens, sections, cross_refs), without reading the texts.
    `documents` may be a CollectionInfo or its `.documents`; `ids` restricts to some documents."""
    infos = list(getattr(documents, "documents", documents))
    if ids is not None:
        wanted = set(ids)
        infos = [d for d in infos if d.id in wanted]
    tokens = [int(d.tokens) for d in infos]
    return DocumentStats(
        context_tokens=sum(tokens),
        max_document_tokens=max(tokens, default=0),
        n_documents=len(infos),
        n_sections=sum(len(d.sections) for d in infos),
        cross_ref_count=sum(int(d.cross_refs) for d in infos),
    )


def retrieval_signals(retrieval: Retrieval | None) -> RetrievalSignals | None:
    """Vector similarities, documents and texts of the retrieved chunks, in rank order.
    Neighbour chunks added for context (rank 0) are not retrieval evidence and are left out."""
    hits = [h for h in (retrieval.hits if retrieval is not None else []) if h.rank != 0]
    if not hits:
        return None
    return RetrievalSignals(
        scores=[float(h.vector_score) for h in hits],
        doc_ids=[h.chunk.doc_id for h in hits],
        texts=[h.chunk.text for h in hits],
    )
