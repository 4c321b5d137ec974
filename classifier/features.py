"""Routing features: what the query, the documents and a first retrieval pass say about the request.

Pure functions over plain values (no I/O, no pipelines or gateway imports), so training, replay
and the gateway compute features with the very same code. The query cues follow the failure
classes Self-Route (Li et al., 2024) reports for RAG: multi-step reasoning, general or summary
questions, long complex queries, and implicit queries that need the whole text.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from classifier.stopwords import STOPWORDS

# Missing values (no retrieval pass) are NaN: rules never match on them and the model imputes them.
MISSING = float("nan")


@dataclass(frozen=True)
class DocumentStats:
    """Size and structure of the context a request carries."""

    context_tokens: int  # all documents together, tiktoken cl100k
    max_document_tokens: int
    n_documents: int
    n_sections: int
    cross_ref_count: int

    @property
    def cross_ref_density(self) -> float:
        """Cross-references per 1,000 context tokens."""
        return 1000.0 * self.cross_ref_count / self.context_tokens if self.context_tokens > 0 else 0.0


@dataclass(frozen=True)
class RetrievalSignals:
    """The first retrieval pass, ranked best first."""

    scores: list[float] = field(default_factory=list)  # vector cosine similarity of each top chunk
    doc_ids: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)


_QUESTION_TYPES = (
    "what",
    "who",
    "when",
    "where",
    "which",
    "how",
    "why",
    "yes_no",
    "multiple_choice",
    "summary",
    "list",
)

QUERY_FEATURES = [
    "query_words",
    "query_chars",
    "query_sentences",
    "query_long_complex",
    *[f"qtype_{name}" for name in _QUESTION_TYPES],
    "n_options",
    "cue_multi_step",
    "cue_summary",
    "cue_implicit",
    "cue_ordinal",
    "cue_quantity",
    "query_numbers",
    "query_capitalized",
]
DOCUMENT_FEATURES = [
    "context_tokens",
    "log_context_tokens",
    "max_document_tokens",
    "n_documents",
    "n_sections",
    "cross_ref_count",
    "cross_ref_density",
]
RETRIEVAL_FEATURES = [
    "has_retrieval",
    "top_score",
    "top_margin",
    "score_spread",
    "score_mean",
    "n_distinct_docs",
    "distinct_doc_share",
    "term_coverage",
    "top_term_coverage",
]
FEATURE_NAMES: list[str] = QUERY_FEATURES + DOCUMENT_FEATURES + RETRIEVAL_FEATURES

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
# Options written as "A. ...", "(A) ...", "A) ..." at the start of a line.
_OPTION = re.compile(r"^\s*(?:\(([A-Ha-h])\)|([A-H])[.)])\s+\S", re.MULTILINE)
_AUX_START = re.compile(
    r"^(?:is|are|was|were|do|does|did|can|could|should|would|will|has|have|had|may|might|must|shall)\b", re.I
)
_SUMMARY = re.compile(
    r"\b(?:summari[sz]e|summary|overall|main (?:idea|point|theme|topic|argument|contribution|finding)s?|"
    r"in general|generally|gist|overview|key (?:points|takeaways|findings)|"
    r"what (?:is|was) (?:the|this) (?:paper|article|story|text|book|document|passage|lecture|report|call) about|"
    r"what (?:is|are) the (?:theme|purpose|moral|conclusion)s?|tl;?dr)\b",
    re.I,
)
_MULTI_STEP = re.compile(
    r"\b(?:compare|comparison|compared|differ(?:ence|ent|s)?|both|relationship|relate[sd]?|"
    r"in contrast|whereas|versus|vs\.?|after|before|then|led to|lead to|result(?:ed)? in|because|"
    r"cause[sd]?|reason|why|how (?:did|does|do) .{1,40} (?:affect|change|influence)|"
    r"and (?:also|then)|as well as|combined|in total|altogether|sum of|change[sd]? (?:from|over))\b",
    re.I,
)
_IMPLICIT = re.compile(
    r"\b(?:the (?:text|passage|story|author|narrator|article|paper|document|book|lecture|speaker|"
    r"conversation|dialogue|transcript|call|contract|agreement)|throughout|in this (?:text|story|paper|"
    r"document|passage|lecture|conversation|contract|agreement)|we discussed|you discussed|mentioned above)\b",
    re.I,
)
_ORDINAL = re.compile(
    r"\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|last|final|"
    r"beginning|end of|earliest|latest|\d+(?:st|nd|rd|th))\b",
    re.I,
)
_QUANTITY = re.compile(r"\b(?:how (?:many|much|often|long)|number of|count|percentage|percent|amount)\b", re.I)
_LIST = re.compile(
    r"\b(?:list|name (?:all|the)|enumerate|what are (?:all )?the|which (?:of the following )?are)\b", re.I
)
_WH = ("what", "who", "when", "where", "which", "how", "why")
_NUMBER = re.compile(r"\b\d[\d,.]*\b")

# A query this long, or with this many sentences, counts as "long complex" (Self-Route's failure class).
LONG_QUERY_WORDS = 30
LONG_QUERY_SENTENCES = 2


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


_NUMBERING = re.compile(r"^\s*(?:question|q)\s*\d+\s*[.:)]\s*", re.I)


def _stem_question(query: str) -> str:
    """The question without its numbering ("Question 3.") and multiple-choice options."""
    match = _OPTION.search(query)
    stem = query[: match.start()] if match else query
    return _NUMBERING.sub("", stem, count=1)


def content_terms(text: str) -> set[str]:
    """Lower-cased words that carry meaning: no stopwords, no one-letter tokens."""
    return {w for w in _words(text) if len(w) > 1 and w not in STOPWORDS}


def question_type(query: str) -> str:
    """One of _QUESTION_TYPES, or "other" for imperative or unusual phrasings."""
    if len(set(m.group(1) or m.group(2) for m in _OPTION.finditer(query))) >= 2:
        return "multiple_choice"
    stem = _stem_question(query).strip()
    lowered = stem.lower()
    if _SUMMARY.search(lowered):
        return "summary"
    if _LIST.search(lowered):
        return "list"
    # The first wh-word in the stem ("Question 3. Which ...", "In 1990, who ...") decides.
    words = _words(lowered)
    positions = {wh: words.index(wh) for wh in _WH if wh in words}
    if positions:
        return min(positions, key=positions.__getitem__)
    last_sentence = re.split(r"(?<=[.?!])\s+", stem)[-1] if stem else ""
    if _AUX_START.match(last_sentence.strip()) or _AUX_START.match(stem):
        return "yes_no"
    return "other"


def query_features(query: str) -> dict[str, float]:
    stem = _stem_question(query)
    words = _words(stem)
    sentences = [s for s in re.split(r"(?<=[.?!])\s+|\n+", stem.strip()) if s.strip()]
    qtype = question_type(query)
    n_options = len({m.group(1) or m.group(2) for m in _OPTION.finditer(query)})
    out: dict[str, float] = {
        "query_words": float(len(words)),
        "query_chars": float(len(stem)),
        "query_sentences": float(len(sentences)),
        "query_long_complex": float(len(words) >= LONG_QUERY_WORDS or len(sentences) > LONG_QUERY_SENTENCES),
        "n_options": float(n_options if n_options >= 2 else 0),
        "cue_multi_step": float(len(_MULTI_STEP.findall(stem))),
        "cue_summary": float(bool(_SUMMARY.search(stem))),
        "cue_implicit": float(bool(_IMPLICIT.search(stem))),
        "cue_ordinal": float(bool(_ORDINAL.search(stem))),
        "cue_quantity": float(bool(_QUANTITY.search(stem))),
        "query_numbers": float(len(_NUMBER.findall(stem))),
        # named entities (capitalised words past the first) are what retrieval finds easily
        "query_capitalized": float(sum(1 for w in re.findall(r"\b[A-Z][a-z]+", stem)[1:])),
    }
    for name in _QUESTION_TYPES:
        out[f"qtype_{name}"] = float(qtype == name)
    return out


def document_features(stats: DocumentStats) -> dict[str, float]:
    return {
        "context_tokens": float(stats.context_tokens),
        "log_context_tokens": math.log1p(max(stats.context_tokens, 0)),
        "max_document_tokens": float(stats.max_document_tokens),
        "n_documents": float(stats.n_documents),
        "n_sections": float(stats.n_sections),
        "cross_ref_count": float(stats.cross_ref_count),
        "cross_ref_density": stats.cross_ref_density,
    }


def _coverage(terms: set[str], texts: list[str]) -> float:
    if not terms:
        return MISSING
    found = set().union(*(content_terms(t) for t in texts)) if texts else set()
    return len(terms & found) / len(terms)


def retrieval_features(query: str, retrieval: RetrievalSignals | None) -> dict[str, float]:
    if retrieval is None or not retrieval.scores:
        return {name: (0.0 if name == "has_retrieval" else MISSING) for name in RETRIEVAL_FEATURES}
    scores = [float(s) for s in retrieval.scores]
    ranked = sorted(scores, reverse=True)
    doc_ids = list(retrieval.doc_ids)
    distinct = len(set(doc_ids)) if doc_ids else 1
    terms = content_terms(_stem_question(query))
    texts = list(retrieval.texts)
    return {
        "has_retrieval": 1.0,
        "top_score": ranked[0],
        "top_margin": ranked[0] - ranked[1] if len(ranked) > 1 else 0.0,
        "score_spread": ranked[0] - ranked[-1],
        "score_mean": sum(ranked) / len(ranked),
        "n_distinct_docs": float(distinct),
        "distinct_doc_share": distinct / max(len(doc_ids), 1),
        "term_coverage": _coverage(terms, texts),
        "top_term_coverage": _coverage(terms, texts[:1]),
    }


def extract_features(
    query: str, doc_stats: DocumentStats, retrieval: RetrievalSignals | None = None
) -> dict[str, float]:
    """Every feature in FEATURE_NAMES order; retrieval features are NaN without a retrieval pass."""
    values = {**query_features(query), **document_features(doc_stats), **retrieval_features(query, retrieval)}
    return {name: values[name] for name in FEATURE_NAMES}


def feature_vector(features: dict[str, float]) -> list[float]:
    """Features as a row in FEATURE_NAMES order (missing names become NaN)."""
    return [float(features.get(name, MISSING)) for name in FEATURE_NAMES]
