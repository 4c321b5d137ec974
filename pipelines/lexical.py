"""BM25 over a fixed set of texts, held in memory: the lexical ranking used where no full-text index exists yet
(the long route's units, attached documents still being embedded: pipelines.store.pending).

Terms are lowercased runs of two or more word characters (scikit-learn's CountVectorizer's defaults: `str.lower`,
then the token pattern below); each term keeps the texts it occurs in and its counts there (a sparse column, as
CountVectorizer's matrix would hold it), so a question is scored over hundreds of chunks in well under a
millisecond per term. Counted here rather than with CountVectorizer so that a serving gateway does not import
scikit-learn and SciPy (~65 MB) for it; the scores are the same floats (tests/pipelines/test_lexical.py).
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np

# CountVectorizer's default token_pattern
TERMS = re.compile(r"(?u)\b\w\w+\b")


def terms(text: str) -> list[str]:
    return TERMS.findall(text.lower())


BM25_K1 = 1.5
BM25_B = 0.75


class BM25Index:
    def __init__(self, texts: list[str], k1: float = BM25_K1, b: float = BM25_B):
        self.size = len(texts)
        self.k1, self.b = k1, b
        postings: dict[str, tuple[list[int], list[int]]] = {}  # term -> (texts in order, count in each)
        lengths = np.zeros(self.size, dtype=np.float64)
        for row, text in enumerate(texts):
            counted = Counter(terms(text))
            lengths[row] = float(sum(counted.values()))
            for term, count in counted.items():
                rows, tfs = postings.setdefault(term, ([], []))
                rows.append(row)
                tfs.append(count)
        self._columns = {term: i for i, term in enumerate(postings)}
        self._rows = [np.asarray(rows, dtype=np.int64) for rows, _ in postings.values()]
        self._tf = [np.asarray(tfs, dtype=np.float64) for _, tfs in postings.values()]
        if postings:  # else no text has a single term (or there are no texts): every score is 0
            average = lengths.mean() if len(lengths) and lengths.mean() > 0 else 1.0
            self._norm = k1 * (1 - b + b * lengths / average)
            df = np.asarray([len(rows) for rows in self._rows], dtype=np.float64)  # per term: texts holding it
            self._idf = np.log(1 + (self.size - df + 0.5) / (df + 0.5))

    def scores(self, query: str) -> np.ndarray:
        """BM25 of the query's distinct terms against every text, in the texts' order (0 where none occurs)."""
        out = np.zeros(self.size, dtype=np.float64)
        for term in set(terms(query)):
            column = self._columns.get(term)
            if column is None:
                continue
            rows, tf = self._rows[column], self._tf[column]
            out[rows] += self._idf[column] * tf * (self.k1 + 1) / (tf + self._norm[rows])
        return out
