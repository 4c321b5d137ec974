"""Token-aware chunking on sentence and section boundaries.

A chunk never spans two sections, except that sections too small to stand alone (a bare heading, a
one-line clause) are merged into the section that follows. Inside a section, sentences are packed up
to `chunk_tokens` (tiktoken), and the next chunk starts with the last sentences that fit in
`chunk_overlap` tokens. A sentence longer than a chunk is cut on token boundaries. Chunk text is always
the exact slice doc.text[start:end], so overlapping neighbours can be stitched back without duplication.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pipelines.documents import Document
from pipelines.settings import ChunkingSettings
from pipelines.structure import Section, split_sections
from pipelines.tokens import count_tokens, encoding

# Sentence ends: ., !, ? (and CJK 。！？；) followed by space, or a paragraph/page break.
_SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"'”’)\]]))\s+|(?<=[。！？；])|\n\s*\n|\f")
_MAX_TITLES_IN_LABEL = 3


@dataclass(frozen=True)
class Chunk:
    doc_id: str
    position: int  # 0-based order of the chunk within its document
    text: str
    section: str | None  # heading(s) of the section the chunk belongs to
    tokens: int
    start: int  # character offsets into the document text
    end: int


def sentence_spans(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """Non-empty (start, end) spans of sentences within text[start:end], whitespace trimmed."""
    spans = []
    cursor = start
    for m in _SENTENCE_END.finditer(text, start, end):
        spans.append((cursor, m.start() if m.start() > cursor else m.end()))
        cursor = m.end()
    spans.append((cursor, end))
    out = []
    for a, b in spans:
        piece = text[a:b]
        stripped = piece.strip()
        if stripped:
            a += len(piece) - len(piece.lstrip())
            out.append((a, a + len(stripped)))
    return out


def _cut_by_tokens(text: str, start: int, end: int, max_tokens: int) -> list[tuple[int, int, int]]:
    """Split an over-long span into pieces of at most max_tokens tokens: (start, end, tokens)."""
    ids = encoding().encode(text[start:end], disallowed_special=())
    _, offsets = encoding().decode_with_offsets(ids)
    bounds = [start + offsets[i] for i in range(0, len(ids), max_tokens)] + [end]
    return [
        (a, b, min(max_tokens, len(ids) - i * max_tokens)) for i, (a, b) in enumerate(zip(bounds, bounds[1:])) if b > a
    ]


def pack_spans(text: str, start: int, end: int, max_tokens: int, overlap: int = 0) -> list[tuple[int, int]]:
    """Group the sentences of text[start:end] into spans of at most max_tokens tokens, with overlap."""
    units: list[tuple[int, int, int]] = []
    for a, b in sentence_spans(text, start, end):
        n = count_tokens(text[a:b])
        # the cut leaves one token of room for the separator a sentence is joined with
        units.extend(_cut_by_tokens(text, a, b, max_tokens - 1) if n >= max_tokens else [(a, b, n)])
    spans: list[tuple[int, int]] = []
    current: list[tuple[int, int, int]] = []
    size = 0
    for unit in units:
        # joining sentences costs about one token for the whitespace between them
        if current and size + 1 + unit[2] > max_tokens:
            spans.append((current[0][0], current[-1][1]))
            carried: list[tuple[int, int, int]] = []
            kept = 0
            for prev in reversed(current):
                if kept + prev[2] + 1 > overlap or kept + prev[2] + 2 + unit[2] > max_tokens:
                    break
                carried.insert(0, prev)
                kept += prev[2] + 1
            current, size = carried, kept
        size += unit[2] + (1 if current else 0)
        current.append(unit)
    if current:
        spans.append((current[0][0], current[-1][1]))
    return [piece for a, b in spans for piece in _fit(text, a, b, max_tokens)]


def _fit(text: str, start: int, end: int, max_tokens: int) -> list[tuple[int, int]]:
    """Tokenisation is not quite additive across joins; a span that came out too long is cut on tokens
    (rare), so no text is lost and no span exceeds max_tokens."""
    if count_tokens(text[start:end]) <= max_tokens:
        return [(start, end)]
    return [(a, b) for a, b, _ in _cut_by_tokens(text, start, end, max_tokens)]


def _section_groups(text: str, sections: list[Section], min_tokens: int) -> list[tuple[int, int, str | None]]:
    """Sections as (start, end, label), small ones merged forward so a bare heading joins its body."""
    groups: list[tuple[int, int, str | None]] = []
    pending: tuple[int, list[str]] | None = None
    for section in sections:
        titles = [section.title] if section.title else []
        start = section.start
        if pending is not None:
            start, titles = pending[0], pending[1] + titles
        if count_tokens(text[start : section.end]) < min_tokens and section is not sections[-1]:
            pending = (start, titles)
            continue
        pending = None
        label = " / ".join(titles[-_MAX_TITLES_IN_LABEL:]) if titles else None
        groups.append((start, section.end, label))
    return groups


def chunk_document(doc: Document, settings: ChunkingSettings) -> list[Chunk]:
    overlap = min(settings.chunk_overlap, settings.chunk_tokens // 2)
    groups = _section_groups(doc.text, split_sections(doc.text), max(1, settings.chunk_tokens // 4))
    chunks: list[Chunk] = []
    for g_start, g_end, label in groups:
        for start, end in pack_spans(doc.text, g_start, g_end, settings.chunk_tokens, overlap):
            piece = doc.text[start:end]
            chunks.append(Chunk(doc.id, len(chunks), piece, label, count_tokens(piece), start, end))
    return chunks


@dataclass(frozen=True)
class ScoredChunk:
    """A retrieved chunk. score: fused reciprocal-rank score (higher is better); vector_score: cosine
    similarity of chunk and query in [-1, 1]; rank: 1-based rank in the fused list (0 for a chunk that
    was not retrieved but added as a neighbour); vector_rank/text_rank: 1-based ranks in each list."""

    chunk: Chunk
    score: float
    vector_score: float
    rank: int
    vector_rank: int | None = None
    text_rank: int | None = None

    def to_dict(self) -> dict:
        c = self.chunk
        return {
            "doc_id": c.doc_id,
            "position": c.position,
            "section": c.section,
            "tokens": c.tokens,
            "start": c.start,
            "end": c.end,
            "score": round(self.score, 6),
            "vector_score": round(self.vector_score, 6),
            "rank": self.rank,
            "vector_rank": self.vector_rank,
            "text_rank": self.text_rank,
        }
