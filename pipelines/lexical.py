"""BM25 over a fixed set of texts, held in memory: the lexical ranking used where no full-text index exists yet
(the long route's units, attached documents still being embedded: pipelines.store.pending).

Terms are lowercased runs of two or more word characters (scikit-learn's CountVectorizer, whose default token
pattern is exactly that); the counting is a sparse matrix, so a question is scored over hundreds of chunks in
well under a millisecond per term.
"""

from __future__ import annotations

import numpy as np

BM25_K1 = 1.5
BM25_B = 0.75


class BM25Index:
    def __init__(self, texts: list[str], k1: float = BM25_K1, b: float = BM25_B):
        from sklearn.feature_extraction.text import CountVectorizer

        self.size = len(texts)
        self.k1, self.b = k1, b
        self._vectorizer = CountVectorizer(lowercase=True)
        try:
            counts = self._vectorizer.fit_transform(texts).tocsc()
        except ValueError:  # no text has a single term (or there are no texts)
            counts = None
        self._counts = counts
        if counts is not None:
            lengths = np.asarray(counts.sum(axis=1)).ravel().astype(np.float64)
            average = lengths.mean() if len(lengths) and lengths.mean() > 0 else 1.0
            self._norm = k1 * (1 - b + b * lengths / average)
            df = np.diff(counts.indptr).astype(np.float64)  # per term (column): texts holding it
            self._idf = np.log(1 + (self.size - df + 0.5) / (df + 0.5))

    def scores(self, query: str) -> np.ndarray:
        """BM25 of the query's distinct terms against every text, in the texts' order (0 where none occurs)."""
        out = np.zeros(self.size, dtype=np.float64)
        if self._counts is None:
            return out
        vocabulary = self._vectorizer.vocabulary_
        analyse = self._vectorizer.build_analyzer()
        for term in set(analyse(query)):
            column = vocabulary.get(term)
            if column is None:
                continue
            lo, hi = self._counts.indptr[column], self._counts.indptr[column + 1]
            rows = self._counts.indices[lo:hi]
            tf = self._counts.data[lo:hi].astype(np.float64)
            out[rows] += self._idf[column] * tf * (self.k1 + 1) / (tf + self._norm[rows])
        return out
