"""Synthetic feature rows for the classifier tests: the cheap route suffices unless the query is a
summary question or retrieval finds only a weak match; documents group the rows."""

from __future__ import annotations

import random

from classifier.features import DocumentStats, RetrievalSignals, extract_features


def synthetic_rows(n_docs: int = 40, per_doc: int = 10, seed: int = 0):
    """(rows, labels, groups)."""
    rng = random.Random(seed)
    rows, labels, groups = [], [], []
    for d in range(n_docs):
        tokens = rng.randint(3000, 60000)
        stats = DocumentStats(tokens, tokens, 1, rng.randint(0, 40), rng.randint(0, 30))
        for q in range(per_doc):
            summary = rng.random() < 0.3
            top = rng.uniform(0.2, 0.8)
            query = "Summarize the main idea of the report overall." if summary else f"Who signed clause {q}?"
            signals = RetrievalSignals([top, top - 0.05, top - 0.1], [f"d{d}"] * 3, ["clause signed by"] * 3)
            rows.append(extract_features(query, stats, signals))
            # noisy truth: summaries and weak matches need the long route
            needs_long = summary or top < 0.35
            labels.append(int(not needs_long) if rng.random() > 0.1 else int(needs_long))
            groups.append(f"doc{d}")
    return rows, labels, groups
