"""pipelines.lexical: BM25 counted without scikit-learn scores exactly as the CountVectorizer version did."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from pipelines.lexical import BM25_B, BM25_K1, BM25Index
from pipelines.samples import sample_path


def reference_scores(texts: list[str], query: str) -> np.ndarray:
    """The BM25 of before (scikit-learn's CountVectorizer counts, a CSC matrix), kept here as the reference."""
    from sklearn.feature_extraction.text import CountVectorizer

    out = np.zeros(len(texts), dtype=np.float64)
    vectorizer = CountVectorizer(lowercase=True)
    try:
        counts = vectorizer.fit_transform(texts).tocsc()
    except ValueError:  # no terms at all
        return out
    lengths = np.asarray(counts.sum(axis=1)).ravel().astype(np.float64)
    average = lengths.mean() if len(lengths) and lengths.mean() > 0 else 1.0
    norm = BM25_K1 * (1 - BM25_B + BM25_B * lengths / average)
    df = np.diff(counts.indptr).astype(np.float64)
    idf = np.log(1 + (len(texts) - df + 0.5) / (df + 0.5))
    for term in set(vectorizer.build_analyzer()(query)):
        column = vectorizer.vocabulary_.get(term)
        if column is None:
            continue
        rows = counts.indices[counts.indptr[column] : counts.indptr[column + 1]]
        tf = counts.data[counts.indptr[column] : counts.indptr[column + 1]].astype(np.float64)
        out[rows] += idf[column] * tf * (BM25_K1 + 1) / (tf + norm[rows])
    return out


def sample_paragraphs() -> list[str]:
    texts = [p.read_text() for p in sorted((sample_path()).glob("*.md"))]
    return [para for text in texts for para in text.split("\n\n") if para.strip()]


QUERIES = [
    "Who maintains the fenders at Berth 7, and how fast is damage reported?",
    "What is the fine for late rent? Section 4.2 of the LEASE",
    "Open valve V2 first; pump-station P-1 manual",
    "governing law court disputes",
    "a I x",  # only one-character words: no terms
    "Ünïcode naïve café ÉTÉ 2024 2,5 m³",
    "",
]


def test_scores_equal_the_countvectorizer_version():
    texts = sample_paragraphs()
    assert len(texts) > 30
    texts += ["", "a b c", "Ünïcode café naïve ÉTÉ été", "berth berth berth BERTH", "don't can't 3.14 x_y __init__"]
    index = BM25Index(texts)
    for query in QUERIES + [t[:200] for t in texts[::7]]:
        assert np.array_equal(index.scores(query), reference_scores(texts, query)), query


def test_no_terms_anywhere_scores_zero():
    for texts in ([], ["", "a", "! ?"]):
        assert np.array_equal(BM25Index(texts).scores("berth fenders"), np.zeros(len(texts)))
        assert np.array_equal(reference_scores(texts, "berth fenders"), np.zeros(len(texts)))


def test_no_sklearn_imported():
    code = (
        "import sys; from pipelines.lexical import BM25Index; BM25Index(['the berth', 'a fender']).scores('berth');"
        "print(sorted(m for m in ('sklearn', 'scipy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
