"""The cheap route: hybrid retrieval, neighbour expansion, budgeted selection, order-preserving prompt.

1. Hybrid search (vector + full text, reciprocal rank fusion) returns the top_k chunks.
2. Expansion: each hit brings up to `expansion_neighbours` chunks on each side, scaled by its fused
   score relative to the best hit (the best hit gets them all, a hit with half its score half as many).
   A neighbour's priority is its hit's score, lowered with distance.
3. Selection: chunks by priority while their tokens fit `context_budget_tokens` (checked exactly on
   the assembled passages).
4. Assembly (OP-RAG): selected chunks in document order, not score order; adjacent chunks are stitched
   into one passage without their overlap; each passage is labelled with document and section.
   Documents are ordered by their best hit, so the most relevant document comes first.
5. The prompt tells the model to reply exactly `unanswerable` when the passages lack the answer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from pipelines.base import INDEX_FULL, INDEX_PARTIAL, RETRIEVAL_INDEX, ContextRequest, PreparedPrompt
from pipelines.chunking import Chunk, ScoredChunk
from pipelines.documents import document_label, label_name
from pipelines.messages import carry_history, count_message_tokens
from pipelines.scope import SHARED, KeyScope
from pipelines.settings import RagSettings
from pipelines.store import DocumentStore
from pipelines.store.pending import PendingInline
from pipelines.tokens import count_tokens

log = logging.getLogger(__name__)

UNANSWERABLE_WORD = "unanswerable"
INSTRUCTIONS = (
    "Answer the question using only the numbered passages below. The passages are excerpts in document "
    "order. Be concise and cite the passage numbers you used. If the passages do not contain the answer, "
    f"reply with exactly one word: {UNANSWERABLE_WORD}"
)
HISTORY_BUDGET_TOKENS = 1024


@dataclass
class Passage:
    doc_id: str
    title: str | None
    chunks: list[ScoredChunk]
    text: str

    @property
    def sections(self) -> list[str]:
        seen: list[str] = []
        for c in self.chunks:
            if c.chunk.section and c.chunk.section not in seen:
                seen.append(c.chunk.section)
        return seen

    def label(self, number: int) -> str:
        parts = [f"[{number}] Document: {document_label(self.doc_id, self.title)}"]
        if self.sections:
            parts.append("Section: " + "; ".join(label_name(s) for s in self.sections))
        return " | ".join(parts)


@dataclass
class Retrieval:
    collection: str
    question: str
    hits: list[ScoredChunk]  # raw hybrid ranking, best first
    selected: list[ScoredChunk]  # hits and neighbours chosen within the budget, in document order
    passages: list[Passage] = field(default_factory=list)
    context_text: str = ""
    context_tokens: int = 0
    index: str = INDEX_FULL  # what was searched (pipelines.base: INDEX_FULL, or INDEX_PARTIAL for a first pass)

    @property
    def top_vector_score(self) -> float:
        return max((h.vector_score for h in self.hits), default=0.0)

    def summary(self) -> dict:
        """Numbers a router can use as features."""
        scores = sorted((h.vector_score for h in self.hits), reverse=True)
        return {
            "hits": len(self.hits),
            "top_vector_score": scores[0] if scores else 0.0,
            "second_vector_score": scores[1] if len(scores) > 1 else 0.0,
            "mean_vector_score": float(np.mean(scores)) if scores else 0.0,
            "hit_documents": len({h.chunk.doc_id for h in self.hits}),
            "selected_chunks": len(self.selected),
            "context_tokens": self.context_tokens,
        }


def stitch(chunks: list[Chunk]) -> str:
    """Text of consecutive chunks of one document, their overlaps included once."""
    text, end = "", None
    for c in chunks:
        if end is None or c.start >= end:
            text += ("\n" if text else "") + c.text
        else:
            text += c.text[end - c.start :]
        end = c.end if end is None else max(end, c.end)
    return text


class RagPipeline:
    name = "rag"

    def __init__(
        self,
        store: DocumentStore,
        settings: RagSettings | None = None,
        history_budget_tokens: int = HISTORY_BUDGET_TOKENS,
    ):
        self.store = store
        self.settings = settings or store.settings
        self.history_budget_tokens = history_budget_tokens

    # -- retrieval -------------------------------------------------------------------------------
    def retrieve(
        self, collection: str, question: str, scope: KeyScope = SHARED, pending: PendingInline | None = None
    ) -> Retrieval:
        """`pending`: the collection's first pass while its documents are embedded (pipelines.store.pending), which
        answers search, neighbours and titles in its stead."""
        reader: DocumentStore | PendingInline = self.store if pending is None else pending
        query_vector = self.store.embedder.embed_query(question, scope)
        hits = reader.search(collection, question, self.settings.top_k, query_vector=query_vector)
        candidates = self._expand(reader, collection, hits, query_vector)
        titles = {d: t for d, (t, _) in reader.titles(collection, {c.chunk.doc_id for c in candidates}).items()}
        selected, passages, text, tokens = self._select(candidates, titles)
        index = INDEX_FULL if pending is None else INDEX_PARTIAL
        return Retrieval(collection, question, hits, selected, passages, text, tokens, index)

    def _expand(self, reader, collection: str, hits: list[ScoredChunk], query_vector: np.ndarray) -> list[ScoredChunk]:
        """Hits plus their neighbours, each as a ScoredChunk whose score is its selection priority."""
        if not hits:
            return []
        best = max(h.score for h in hits)
        reach = {id(h): round(self.settings.expansion_neighbours * h.score / best) for h in hits}
        wanted: dict[str, set[int]] = {}
        for h in hits:
            n, p = reach[id(h)], h.chunk.position
            wanted.setdefault(h.chunk.doc_id, set()).update(q for q in range(p - n, p + n + 1) if q >= 0 and q != p)
        priority: dict[tuple[str, int], ScoredChunk] = {(h.chunk.doc_id, h.chunk.position): h for h in hits}
        for chunk, vector_score in reader.neighbours(collection, wanted, query_vector):
            key = (chunk.doc_id, chunk.position)
            for h in hits:
                n, distance = reach[id(h)], abs(h.chunk.position - chunk.position)
                if h.chunk.doc_id != chunk.doc_id or distance == 0 or distance > n:
                    continue
                score = h.score * (1.0 - distance / (n + 1))
                current = priority.get(key)
                if current is None or (current.rank == 0 and current.score < score):  # hits keep their own score
                    priority[key] = ScoredChunk(chunk, score, vector_score if vector_score is not None else 0.0, 0)
        return sorted(priority.values(), key=lambda c: -c.score)

    def _select(self, candidates: list[ScoredChunk], titles: dict[str, str | None]):
        budget = self.settings.context_budget_tokens
        chosen: list[ScoredChunk] = []
        used = 0
        for c in candidates:  # by priority, best first
            if used + c.chunk.tokens <= budget:
                chosen.append(c)
                used += c.chunk.tokens
        while True:
            passages = self._passages(chosen, titles)
            text = render_passages(passages)
            tokens = count_tokens(text) if text else 0  # the retrieval's count too: the text is counted once
            if not chosen or tokens <= budget:
                break
            chosen.remove(min(chosen, key=lambda c: c.score))  # labels pushed it over: drop the weakest
        selected = [c for p in passages for c in p.chunks]
        return selected, passages, text, tokens

    @staticmethod
    def _passages(chosen: list[ScoredChunk], titles: dict[str, str | None]) -> list[Passage]:
        by_doc: dict[str, list[ScoredChunk]] = {}
        for c in chosen:
            by_doc.setdefault(c.chunk.doc_id, []).append(c)
        doc_order = sorted(by_doc, key=lambda d: -max(c.score for c in by_doc[d]))
        passages: list[Passage] = []
        for doc_id in doc_order:
            run: list[ScoredChunk] = []
            for c in sorted(by_doc[doc_id], key=lambda c: c.chunk.position):
                if run and c.chunk.position != run[-1].chunk.position + 1:
                    passages.append(Passage(doc_id, titles.get(doc_id), run, stitch([r.chunk for r in run])))
                    run = []
                run.append(c)
            if run:
                passages.append(Passage(doc_id, titles.get(doc_id), run, stitch([r.chunk for r in run])))
        return passages

    # -- prompt ----------------------------------------------------------------------------------
    def build_prompt(
        self, question: str, messages: list[dict], retrieval: Retrieval, inline: bool = False
    ) -> PreparedPrompt:
        body = (
            f"{INSTRUCTIONS}\n\nPassages:\n\n{retrieval.context_text or '(no passages found)'}\n\nQuestion: {question}"
        )
        out = carry_history(messages, self.history_budget_tokens) + [{"role": "user", "content": body}]
        provenance = {
            "route": self.name,
            "collection": retrieval.collection,
            "inline_documents": inline,
            "budget_tokens": self.settings.context_budget_tokens,
            "context_tokens": retrieval.context_tokens,
            "documents": [
                {
                    "id": doc_id,
                    "title": next(p.title for p in retrieval.passages if p.doc_id == doc_id),
                    "sections": list(
                        dict.fromkeys(s for p in retrieval.passages if p.doc_id == doc_id for s in p.sections)
                    ),
                    "chunks": [c.chunk.position for c in retrieval.selected if c.chunk.doc_id == doc_id],
                }
                for doc_id in dict.fromkeys(p.doc_id for p in retrieval.passages)
            ],
            "passages": [
                {
                    "number": i,
                    "doc_id": p.doc_id,
                    "sections": p.sections,
                    "chunks": [c.chunk.position for c in p.chunks],
                }
                for i, p in enumerate(retrieval.passages, start=1)
            ],
            "chunks": [dict(c.to_dict(), expanded=c.rank == 0) for c in retrieval.selected],
            "retrieval": retrieval.summary(),
            RETRIEVAL_INDEX: retrieval.index,
        }
        return PreparedPrompt(out, provenance, count_message_tokens(out), retrieval.hits)

    def prepare(self, request: ContextRequest, retrieval: Retrieval | None = None) -> PreparedPrompt:
        """Retrieve (unless a Retrieval for this request is passed in) and build the prompt. Attached
        documents are ingested into a cached inline collection first."""
        inline = bool(request.documents)
        collection = (
            self.store.inline_name(request.documents, request.scope) if request.documents else request.collection
        )
        if retrieval is None or retrieval.collection != collection or retrieval.question != request.question:
            retrieval = self.retrieve_for(request)
        return self.build_prompt(request.question, request.messages, retrieval, inline)

    def retrieve_for(self, request: ContextRequest) -> Retrieval:
        """Retrieval from the request's collection, or from its attached documents' inline collection (ingested
        if need be, and again should it be dropped while being read); while new attached documents are embedded
        in the background, from their first pass (pipelines.store.pending)."""
        if request.documents:
            pending = self.store.inline_pending(request.documents, request.scope)
            if pending is not None:
                try:
                    return self.retrieve(pending.name, request.question, request.scope, pending)
                finally:
                    # started by its search, unless retrieval failed before it (the question's embedding): else it
                    # would hold its slot under the caps (pipelines.store.pending) until the same documents came back
                    pending.start()
            return self.store.read_inline(
                request.documents,
                lambda name: self.retrieve(name, request.question, request.scope),
                scope=request.scope,
            )
        if request.collection:
            return self.retrieve(request.collection, request.question, request.scope)
        raise ValueError("a RAG request needs a collection or attached documents")


def render_passages(passages: list[Passage]) -> str:
    return "\n\n".join(f"{p.label(i)}\n{p.text}" for i, p in enumerate(passages, start=1))
