"""What every route's pipeline takes and returns."""

from __future__ import annotations

from dataclasses import dataclass

from pipelines.chunking import ScoredChunk
from pipelines.documents import Document
from pipelines.scope import SHARED, KeyScope

# What a request's retrieval (rag) or unit scoring (long) read, under the provenance key RETRIEVAL_INDEX (and so in
# the ledger's provenance): INDEX_FULL, the documents' whole index (every chunk embedded and full-text indexed);
# INDEX_PARTIAL, attached documents still being embedded in the background (pipelines.store.pending): candidates
# chosen by BM25 over all their chunks, and only those (and the chunks embedded so far) ranked by vector.
RETRIEVAL_INDEX = "retrieval_index"
INDEX_FULL = "full"
INDEX_PARTIAL = "partial"


@dataclass
class ContextRequest:
    question: str
    messages: list[dict]  # the caller's OpenAI chat messages
    collection: str | None = None  # an ingested collection to answer from
    documents: list[Document] | None = None  # documents attached to the request (or the conversation's text)
    scope: KeyScope = SHARED  # whose request: its question vector and attached documents are cached under it


@dataclass
class PreparedPrompt:
    """messages: what goes to the model. The caller's system messages and earlier turns are kept while
    they fit a small history allowance (a pasted long document does not), and the final user turn is
    replaced by one user message holding the instructions, the labelled passages and the question.
    provenance: JSON-able account of which documents, sections and chunks/units were used."""

    messages: list[dict]
    provenance: dict
    prompt_tokens: int
    retrieval: list[ScoredChunk] | None = None
