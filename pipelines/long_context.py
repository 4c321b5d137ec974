"""The long route: LongRAG-style retrieval units packed into the long model's window.

Units follow the documents' structure (headings, numbered sections, page breaks); small neighbours are
merged up to `unit_min_tokens`, oversized units split below `unit_max_tokens`. When every unit fits the
budget (window minus answer reserve, counted with tiktoken on the final prompt) all are sent; otherwise
the units most relevant to the question are chosen within the budget. Placement `reading` keeps
document order; `edges` puts the most relevant units first and last and the least in the middle.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from pipelines.base import INDEX_FULL, INDEX_PARTIAL, RETRIEVAL_INDEX, ContextRequest, PreparedPrompt
from pipelines.cache import LockedLRU
from pipelines.chunking import pack_spans
from pipelines.documents import Document, document_label, label_name
from pipelines.embedding import Embedder
from pipelines.lexical import BM25Index
from pipelines.messages import TOKENS_PER_MESSAGE, carry_history, count_message_tokens
from pipelines.scope import SHARED, KeyScope
from pipelines.settings import LongContextSettings
from pipelines.structure import page_at, page_starts, split_sections
from pipelines.tokens import count_tokens, truncate_tokens

if TYPE_CHECKING:
    from pipelines.store.pending import PendingInline

log = logging.getLogger(__name__)

INSTRUCTIONS = (
    "Answer the question using the documents below. Each excerpt is labelled with its document, section "
    "and page; cite them for the facts you use. If the documents do not contain the answer, say so."
)
HISTORY_BUDGET_TOKENS = 1024
# question-to-unit similarity is the best match among windows this long (the embedder truncates at 256)
SCORING_WINDOW_TOKENS = 200

UnitScorer = Callable[[str, list["Unit"]], list[float]]


@dataclass(frozen=True)
class Unit:
    doc_id: str
    doc_title: str | None
    index: int  # order within its document
    text: str
    tokens: int
    start: int
    end: int
    sections: tuple[str, ...]  # titles of the sections the unit covers
    page: int | None  # first page, when the document has page breaks
    last_page: int | None = None

    def label(self) -> str:
        parts = [f"Document: {document_label(self.doc_id, self.doc_title)}"]
        if self.sections:
            shown = "; ".join(label_name(s) for s in self.sections[:3])
            parts.append("Section: " + shown + (" …" if len(self.sections) > 3 else ""))
        if self.page is not None:
            pages = f"{self.page}" if self.last_page in (None, self.page) else f"{self.page}-{self.last_page}"
            parts.append(f"Page: {pages}")
        return "[" + " | ".join(parts) + "]"


@dataclass
class PackedContext:
    units: list[Unit]  # in placement order
    text: str  # the full prompt body: instructions, labelled units, question
    tokens: int  # count_tokens(text)
    all_fitted: bool  # every unit of every document was sent
    total_units: int
    scores: list[float] | None = None  # per unit of `units`, when units were scored


def _pieces(doc: Document) -> list[tuple[int, int, str | None]]:
    """Sections, further cut at page breaks: (start, end, section title)."""
    text = doc.text
    breaks = page_starts(text)
    pieces = []
    for s in split_sections(text):
        cuts = [s.start] + [b for b in breaks if s.start < b < s.end] + [s.end]
        for a, b in zip(cuts, cuts[1:]):
            if text[a:b].strip():
                pieces.append((a, b, s.title))
    return pieces


def split_units(doc: Document, settings: LongContextSettings) -> list[Unit]:
    text = doc.text
    breaks = page_starts(text)
    groups: list[list[tuple[int, int, str | None]]] = []
    size = 0
    for piece in _pieces(doc):
        tokens = count_tokens(text[piece[0] : piece[1]])
        if groups and size < settings.unit_min_tokens and size + tokens <= settings.unit_max_tokens:
            groups[-1].append(piece)
            size += tokens
        else:
            groups.append([piece])
            size = tokens
    # a small last group joins the one before it when there is room
    if len(groups) > 1 and size < settings.unit_min_tokens:
        prev = count_tokens(text[groups[-2][0][0] : groups[-2][-1][1]])
        if prev + size <= settings.unit_max_tokens:
            groups[-2].extend(groups.pop())
    units: list[Unit] = []
    for group in groups:
        start, end = group[0][0], group[-1][1]
        titles = tuple(dict.fromkeys(t for _, _, t in group if t))
        spans = [(start, end)]
        if count_tokens(text[start:end]) > settings.unit_max_tokens:
            spans = pack_spans(text, start, end, settings.unit_max_tokens, 0)
        for a, b in spans:
            body = text[a:b].strip("\f")
            first = page_at(breaks, a) if breaks else None
            last = page_at(breaks, max(a, b - 1)) if breaks else None
            span_titles = tuple(t for s_a, s_b, t in group if t and s_a < b and s_b > a) or titles[:1]
            units.append(Unit(doc.id, doc.title, len(units), body, count_tokens(body), a, b, span_titles, first, last))
    return units


# -- units kept per document -------------------------------------------------------------------
@dataclass(frozen=True)
class DocumentUnits:
    units: tuple[Unit, ...]
    block_tokens: tuple[int, ...]  # per unit, the tokens of its block in the prompt (see prompt_tokens)


def unit_blocks(doc: Document, settings: LongContextSettings) -> DocumentUnits:
    units = split_units(doc, settings)
    return DocumentUnits(tuple(units), tuple(count_tokens(_block(u) + _SEPARATOR) for u in units))


class UnitCache:
    """A document's units and their token counts, kept by content (least recently used dropped first):
    splitting and counting a 100k-token document takes longer than the rest of a request."""

    def __init__(self, size: int = 64):
        self.size = size
        self._entries: LockedLRU[tuple, DocumentUnits] = LockedLRU(size)

    def get(self, doc: Document, settings: LongContextSettings, scope: KeyScope = SHARED) -> DocumentUnits:
        # the key scope (pipelines.scope) is in the key although units do not depend on it: one key's request must
        # not reuse (or time) another's work; so is the metadata, which is the document's content too
        key = (
            scope,
            doc.id,
            doc.title,
            hashlib.sha256(doc.text.encode("utf-8")).digest(),
            json.dumps(doc.metadata, sort_keys=True, default=str),
            settings.unit_min_tokens,
            settings.unit_max_tokens,
        )
        return self._entries.get_or_make(key, lambda: unit_blocks(doc, settings))


# -- relevance ---------------------------------------------------------------------------------
def bm25_scores(question: str, units: list[Unit]) -> list[float]:
    """BM25 of the question's terms against each unit (the units are the corpus)."""
    if not units:
        return []
    return BM25Index([u.text for u in units]).scores(question).tolist()


def embedding_scorer(embedder: Embedder, window_tokens: int = SCORING_WINDOW_TOKENS) -> UnitScorer:
    """Scores a unit by the best cosine similarity between the question and the unit's windows,
    all windows of all units embedded in one batched call."""

    def score(question: str, units: list[Unit]) -> list[float]:
        owners: list[int] = []
        windows: list[str] = []
        for i, u in enumerate(units):
            for a, b in pack_spans(u.text, 0, len(u.text), window_tokens, 0) or [(0, len(u.text))]:
                owners.append(i)
                windows.append(u.text[a:b])
        vectors = embedder.embed([question] + windows)
        sims = vectors[1:] @ vectors[0]
        best = np.full(len(units), -1.0, dtype=np.float32)
        np.maximum.at(best, np.asarray(owners, dtype=np.int64), sims)
        return best.tolist()

    return score


# -- packing -----------------------------------------------------------------------------------
_SEPARATOR = "\n\n"


def _place(units: list[Unit], scores: list[float] | None, placement: str) -> list[Unit]:
    if placement == "edges" and scores is not None:
        ranked = [u for _, u in sorted(zip(scores, units), key=lambda p: -p[0])]
        front, back = ranked[0::2], ranked[1::2]
        return front + back[::-1]
    return units  # reading order: documents as given, units in document order


def _block(unit: Unit) -> str:
    return f"{unit.label()}\n{unit.text}"


_QUESTION_LABEL = "Question: "
QUESTION_LEAD = _SEPARATOR + _QUESTION_LABEL


def render(question: str, units: list[Unit]) -> str:
    # documents first, question last: consecutive questions on the same documents share the whole document
    # block as a prompt prefix, which providers' prompt caches bill at a fraction of the input price
    blocks = _SEPARATOR.join(_block(u) for u in units)
    return f"{INSTRUCTIONS}{_SEPARATOR}{blocks or '(no documents)'}{QUESTION_LEAD}{question}"


def split_question(text: str) -> tuple[str, str]:
    """A rendered prompt as (instructions + documents, question part): the cacheable prefix and the rest."""
    at = text.rfind(QUESTION_LEAD)
    return (text, "") if at < 0 else (text[:at], text[at:])


@lru_cache(maxsize=1)
def _head_tokens() -> int:
    return count_tokens(INSTRUCTIONS + _SEPARATOR)


def prompt_tokens(question: str, block_tokens: list[int]) -> int:
    """count_tokens(render(question, units)) from the units' block counts, without counting the text.

    Exact, not an estimate: tiktoken splits text into pieces by a regex before merging within a piece, and
    a run of newlines followed by a non-space character always ends a piece. Every block starts with '['
    and the question part with 'Q', each after the separator, so the prompt's count is the sum of its
    parts' counts: instructions + separator, each block + separator, then 'Question: ...'.
    """
    if not block_tokens:
        return count_tokens(render(question, []))
    return _head_tokens() + sum(block_tokens) + question_tokens(question)


def question_tokens(question: str) -> int:
    """The question part's tokens, counted apart from the blocks before it (see prompt_tokens): a long prompt's
    tokens less these are its document block, the prefix a provider's prompt cache can hold."""
    return count_tokens(f"{_QUESTION_LABEL}{question}")


class ContextTooLarge(ValueError):
    """Not even the instructions and the question fit the window."""


def pack_long_context(
    question: str,
    documents: list[Document],
    settings: LongContextSettings,
    budget_tokens: int,
    score_units: UnitScorer | None = None,
    cache: UnitCache | None = None,
    scope: KeyScope = SHARED,
) -> PackedContext:
    """Pack the documents' units into budget_tokens (the whole rendered prompt body, counted with
    tiktoken); never exceeds it. Raises ValueError when not even the instructions and question fit.
    Units are scored only when they must be: to choose among them, or to place them at the edges."""
    per_doc = [(cache.get(d, settings, scope) if cache is not None else unit_blocks(d, settings)) for d in documents]
    units = [u for p in per_doc for u in p.units]
    costs = [t for p in per_doc for t in p.block_tokens]
    reading = {(u.doc_id, u.index): i for i, u in enumerate(units)}
    overhead = prompt_tokens(question, [])
    if overhead > budget_tokens:
        raise ContextTooLarge(
            f"a budget of {budget_tokens} tokens cannot hold the instructions and question ({overhead})"
        )

    full_tokens = prompt_tokens(question, costs)
    if full_tokens <= budget_tokens:
        scores = (score_units or bm25_scores)(question, units) if settings.placement == "edges" and units else None
        placed = _place(units, scores, settings.placement)
        by_key = dict(zip(((u.doc_id, u.index) for u in units), scores or []))
        return PackedContext(
            placed,
            render(question, placed),
            full_tokens,
            True,
            len(units),
            [by_key[(u.doc_id, u.index)] for u in placed] if scores else None,
        )

    scores = (score_units or bm25_scores)(question, units)
    order = sorted(range(len(units)), key=lambda i: -scores[i])
    chosen: list[int] = []
    used = prompt_tokens(question, [0])  # instructions and question around at least one block
    for i in order:
        if used + costs[i] <= budget_tokens:
            chosen.append(i)
            used += costs[i]
    if not chosen and units:
        # nothing fits whole: send the beginning of the best unit
        best = units[order[0]]
        room = budget_tokens - used - count_tokens(best.label()) - 4
        if room > 0:
            cut = truncate_tokens(best.text, room)
            units[order[0]] = best = Unit(
                best.doc_id,
                best.doc_title,
                best.index,
                cut,
                count_tokens(cut),
                best.start,
                best.start + len(cut),
                best.sections,
                best.page,
                best.last_page,
            )
            costs[order[0]] = count_tokens(_block(best) + _SEPARATOR)
            if used + costs[order[0]] <= budget_tokens:
                chosen = [order[0]]

    picked = sorted(chosen, key=lambda i: reading[(units[i].doc_id, units[i].index)])
    placed = _place([units[i] for i in picked], [scores[i] for i in picked], settings.placement)
    by_unit = {id(units[i]): scores[i] for i in picked}
    tokens = prompt_tokens(question, [costs[i] for i in picked])
    return PackedContext(placed, render(question, placed), tokens, False, len(units), [by_unit[id(u)] for u in placed])


class LongContextPipeline:
    name = "long"

    def __init__(
        self,
        settings: LongContextSettings | None = None,
        window_tokens: int = 128_000,
        embedder: Embedder | None = None,
        store=None,
        history_budget_tokens: int = HISTORY_BUDGET_TOKENS,
        unit_cache: UnitCache | None = None,
    ):
        """window_tokens: the long model's context window (settings.window_tokens overrides it).
        store: a DocumentStore, needed for requests that name a collection; its chunk vectors then
        score units without embedding the documents again (attached documents are scored from their
        cached inline collection the same way). unit_cache: shared by pipelines with the same documents."""
        self.settings = settings or LongContextSettings()
        self.window_tokens = self.settings.window_tokens or window_tokens
        self.embedder = embedder if embedder is not None else getattr(store, "embedder", None)
        self.store = store
        self.history_budget_tokens = history_budget_tokens
        self.unit_cache = unit_cache if unit_cache is not None else UnitCache()

    @property
    def budget_tokens(self) -> int:
        return self.window_tokens - self.settings.answer_reserve_tokens

    def _documents(self, request: ContextRequest) -> tuple[list[Document], str | None]:
        if request.documents:
            return list(request.documents), None
        if request.collection:
            if self.store is None:
                raise ValueError("the long pipeline needs a document store to read a collection")
            return self.store.documents(request.collection), request.collection
        raise ValueError("a long-context request needs a collection or attached documents")

    def _scorer(self, documents: list[Document], collection: str | None, scope: KeyScope = SHARED) -> UnitScorer | None:
        if self.store is not None:
            store = self.store
            if collection is not None:
                return StoreScorer(store, lambda ids: store.chunk_vectors(collection, ids), scope)
            # attached documents: scored from the inline collection that caches their chunk vectors, ingested
            # (once) only when scores are needed at all; while it is embedded in the background, from its first
            # pass (pipelines.store.pending)
            return StoreScorer(
                store,
                lambda ids: store.read_inline(documents, lambda name: store.chunk_vectors(name, ids), scope=scope),
                scope,
                pending=lambda: store.inline_pending(documents, scope),
            )
        if self.embedder is not None:
            return embedding_scorer(self.embedder)
        return None

    def _budget(self, history: list[dict]) -> int:
        return self.budget_tokens - count_message_tokens(history) - 8  # the new user turn's own overhead

    def estimate_tokens(self, request: ContextRequest) -> tuple[int, bool]:
        """(prompt tokens, exact): the prompt's size without scoring or rendering it. Exact when every
        unit fits; otherwise the budget, which packing fills up to."""
        documents, collection = self._documents(request)
        history = carry_history(request.messages, self.history_budget_tokens)
        budget = self._budget(history)
        scope = _units_scope(request, collection)
        costs = [t for d in documents for t in self.unit_cache.get(d, self.settings, scope).block_tokens]
        body = prompt_tokens(request.question, costs)
        exact = body <= budget
        return count_message_tokens(history) + TOKENS_PER_MESSAGE + (body if exact else budget), exact

    def prepare(self, request: ContextRequest) -> PreparedPrompt:
        documents, collection = self._documents(request)
        history = carry_history(request.messages, self.history_budget_tokens)
        budget = self._budget(history)
        scorer = self._scorer(documents, collection, request.scope)
        packed = pack_long_context(
            request.question,
            documents,
            self.settings,
            budget,
            scorer,
            self.unit_cache,
            _units_scope(request, collection),
        )
        out = history + [{"role": "user", "content": packed.text}]
        unit_scores: list[float | None] = [*packed.scores] if packed.scores else [None] * len(packed.units)
        provenance = {
            "route": self.name,
            "collection": collection,
            "window_tokens": self.window_tokens,
            "budget_tokens": budget,
            "context_tokens": packed.tokens,
            "all_fitted": packed.all_fitted,
            "placement": self.settings.placement,
            "units_sent": len(packed.units),
            "units_total": packed.total_units,
            # what the units were scored from, when they were scored from the store (pipelines.base)
            **({RETRIEVAL_INDEX: scorer.index} if isinstance(scorer, StoreScorer) and scorer.index else {}),
            "documents": [
                {
                    "id": d.id,
                    "title": d.title,
                    "sections": list(dict.fromkeys(s for u in packed.units if u.doc_id == d.id for s in u.sections)),
                    "units": [u.index for u in packed.units if u.doc_id == d.id],
                }
                for d in documents
                if any(u.doc_id == d.id for u in packed.units)
            ],
            "units": [
                {
                    "doc_id": u.doc_id,
                    "index": u.index,
                    "sections": list(u.sections),
                    "page": u.page,
                    "tokens": u.tokens,
                    "score": None if s is None else round(float(s), 6),
                }
                for u, s in zip(packed.units, unit_scores)
            ],
        }
        # packed.tokens is the exact count of its text: no need to count 100k tokens again
        return PreparedPrompt(out, provenance, count_message_tokens(history) + TOKENS_PER_MESSAGE + packed.tokens)


def _units_scope(request: ContextRequest, collection: str | None) -> KeyScope:
    """A named collection's units are shared (who may read it is checked before); attached documents' are the key's."""
    return SHARED if collection is not None else request.scope


class StoreScorer:
    """Scores a unit by the best cosine similarity of the question to the stored chunks it overlaps: the documents
    were embedded at ingestion, so only the question is embedded here. `vectors(doc ids)` reads their chunk vectors
    (DocumentStore.chunk_vectors) when called: attached documents are ingested only then. `pending()`, for attached
    documents, is their first pass while they are embedded in the background (DocumentStore.inline_pending, None
    once they are stored): units are then scored from the chunks embedded so far (the question's BM25 candidates
    among them), and a unit holding none of those ranks after every unit that does, by its BM25 score.
    `index` says afterwards which it was (pipelines.base)."""

    def __init__(
        self,
        store,
        vectors: Callable[[set[str]], dict],
        scope: KeyScope = SHARED,
        pending: Callable[[], PendingInline | None] | None = None,
    ):
        self.store, self.vectors, self.scope, self.pending = store, vectors, scope, pending
        self.index: str | None = None  # set when scoring

    def __call__(self, question: str, units: list[Unit]) -> list[float]:
        query = self.store.embedder.embed_query(question, self.scope)
        doc_ids = {u.doc_id for u in units}
        first_pass = self.pending() if self.pending is not None else None
        if first_pass is None:
            stored = self.vectors(doc_ids)
            self.index = INDEX_FULL
        else:
            stored = first_pass.chunk_vectors(question, doc_ids)
            self.index = INDEX_PARTIAL
        sims = {doc_id: v.vectors @ query for doc_id, v in stored.items()}
        scores: list[float | None] = []
        for u in units:
            found = stored.get(u.doc_id)
            overlap = (found.starts < u.end) & (found.ends > u.start) if found is not None else None
            scores.append(float(sims[u.doc_id][overlap].max()) if overlap is not None and overlap.any() else None)
        if first_pass is None:
            return [-1.0 if s is None else s for s in scores]
        lexical = bm25_scores(question, units)
        top = max(lexical, default=0.0) or 1.0
        # units with no embedded chunk: below every cosine (>= -1), in BM25 order among themselves
        return [-3.0 + lexical[i] / top if s is None else s for i, s in enumerate(scores)]
