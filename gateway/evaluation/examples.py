"""Labelled and paired example files, and their routing inputs computed the way the gateway does.

Example lines (JSON): `query`; the documents as `doc_id` (DIR/<doc_id>.txt), or `documents`, a list
of ids or inline {"id", "text"} objects; a `label` (1 = the cheap route suffices) or `rag_score` and
`lc_score`; optional `group` (default: the documents' ids). Paired replay lines also carry
`rag_pred`, `lc_pred` and optionally `task`, `gt`, `model` (the model family that answered) and `corpus`.
Several files can be read together (load_corpora): each is a corpus, named by its lines' `corpus`, else by the
file (corpus_name), and the validation protocols can leave one corpus or one model family out.

Features come from gateway.routing.inputs plus a real retrieval pass of pipelines.rag over an inline
LanceDB collection of the example's documents: the same path a request with attached documents takes.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from classifier.features import extract_features
from pipelines.documents import Document
from policies.schema import Policy

log = logging.getLogger(__name__)

CACHE_FILE = "route_inputs_cache.jsonl"
CACHE_VERSION = 1
# the replay store's cap on inline collections: beyond any paired set's document sets (LaRA and L-Eval have 248)
REPLAY_INLINE_COLLECTIONS = 1_000_000


@dataclass
class Example:
    query: str
    documents: list[Document]
    group: str
    record: dict[str, Any]  # the line as read
    corpus: str = ""  # the line's `corpus`, else the file's name (load_corpora)
    source: str = ""  # the file's name (load_corpora): its --window-tokens and its inputs builder

    @property
    def doc_ids(self) -> list[str]:
        return [d.id for d in self.documents]

    @property
    def model(self) -> str:
        """The model family that answered: the line's `model`, else the corpus's one unnamed model."""
        return str(self.record.get("model") or f"{self.corpus or 'unnamed'}-model")

    @property
    def task(self) -> str:
        return str(self.record.get("task") or "")


@dataclass
class ExampleInputs:
    """What routing and the replay need about one example."""

    features: dict[str, float]
    rag_prompt_tokens: int  # the cheap route's prompt: instructions, retrieved passages, question
    direct_prompt_tokens: int  # the whole context and question, unpacked
    long_prompt_tokens: int | None = None  # the long route's prompt: documents packed into the window
    long_prefix_tokens: int | None = None  # its document block when every question gets the same one (else 0)


class ExampleFileError(ValueError):
    pass


def _read_doc(docs_dir: Path | None, doc_id: str, cache: dict[str, Document], where: str) -> Document:
    if doc_id not in cache:
        if docs_dir is None:
            raise ExampleFileError(f"{where}: document {doc_id!r} named but no --docs folder given")
        path = docs_dir / f"{doc_id}.txt"
        if not path.is_file():
            raise ExampleFileError(f"{where}: document file {path} not found")
        cache[doc_id] = Document(id=doc_id, text=path.read_text(encoding="utf-8"), title=doc_id)
    return cache[doc_id]


def load_examples(path: str | Path, docs_dir: str | Path | None) -> list[Example]:
    path = Path(path)
    docs_dir = Path(docs_dir) if docs_dir is not None else None
    cache: dict[str, Document] = {}
    examples: list[Example] = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ExampleFileError(f"{where}: invalid JSON: {exc.msg}") from exc
            if not isinstance(record.get("query"), str) or not record["query"].strip():
                raise ExampleFileError(f"{where}: needs a non-empty 'query'")
            docs: list[Document] = []
            if "doc_id" in record:
                docs.append(_read_doc(docs_dir, str(record["doc_id"]), cache, where))
            for i, item in enumerate(record.get("documents") or []):
                if isinstance(item, str):
                    docs.append(_read_doc(docs_dir, item, cache, where))
                elif isinstance(item, dict) and isinstance(item.get("text"), str):
                    docs.append(
                        Document(
                            id=str(item.get("id") or f"inline-{number}-{i}"), text=item["text"], title=item.get("title")
                        )
                    )
                else:
                    raise ExampleFileError(f"{where}: documents[{i}] must be an id or an object with 'text'")
            if not docs:
                raise ExampleFileError(f"{where}: needs 'doc_id' or 'documents'")
            group = str(record.get("group") or "+".join(sorted(d.id for d in docs)))
            examples.append(Example(record["query"], docs, group, record))
    if not examples:
        raise ExampleFileError(f"{path}: no examples")
    return examples


def corpus_name(path: Path, others: list[Path]) -> str:
    """A corpus named after its file: the file's stem, or its folder's name when the stem is the generic
    "paired..." or several files share it (lara128k/paired.jsonl and leval/paired.jsonl are "lara128k" and "leval")."""
    stems = [p.stem for p in others]
    generic = path.stem.startswith("paired") or stems.count(path.stem) > 1
    return (path.parent.name or path.stem) if generic else path.stem


def load_corpora(pairs: list[tuple[Path, Path | None]]) -> list[Example]:
    """The examples of several (data file, docs folder) pairs, each example tagged with its corpus (its line's
    `corpus`, else corpus_name). With several corpora a group (document) is prefixed with its corpus, so two
    corpora's documents never share a fold by name."""
    files = [Path(data) for data, _ in pairs]
    if len(set(files)) != len(files):
        raise ExampleFileError("the same --data file is given twice")
    out: list[Example] = []
    for (data, docs), path in zip(pairs, files):
        name = corpus_name(path, files)
        for e in load_examples(data, docs):
            e.source = name
            e.corpus = str(e.record.get("corpus") or name)
            if len(pairs) > 1:
                e.group = f"{e.corpus}/{e.group}"
            out.append(e)
    return out


def example_label(example: Example, label_field: str | None, margin: float) -> int:
    from classifier.training import label_from_scores

    record = example.record
    if label_field and label_field in record and record[label_field] is not None:
        return int(bool(record[label_field]))
    if "rag_score" in record and "lc_score" in record:
        return label_from_scores(record["rag_score"], record["lc_score"], margin)
    raise ExampleFileError(
        f"example {example.query[:40]!r}: needs '{label_field or 'label'}' or both 'rag_score' and 'lc_score'"
    )


def long_window(policy: Policy, override: int | None = None) -> int:
    """The long route's window: an explicit override, else long_context.window_tokens, else the long
    model's context window (128k when the policy gives none)."""
    return int(override or policy.long_context.window_tokens or policy.long.context_window or 128_000)


class RouteInputBuilder:
    """Runs the gateway's routing inputs over examples: document stats, a retrieval pass, prompt sizes."""

    def __init__(
        self,
        policy: Policy,
        store_uri: str | Path,
        window_tokens: int | None = None,
        cache_dir: str | Path | None = None,
        embedder=None,
    ):
        from pipelines.embedding import Embedder
        from pipelines.long_context import LongContextPipeline
        from pipelines.rag import RagPipeline
        from pipelines.store import DocumentStore

        if policy.rag.first_pass_candidates:
            # the replay reads documents once embedded: a first pass answers only a deployment's first questions on
            # new documents while they are embedded in the background (pipelines.store.pending)
            policy = policy.model_copy(update={"rag": policy.rag.model_copy(update={"first_pass_candidates": 0})})
        self.policy = policy
        self.window = long_window(policy, window_tokens)
        if embedder is None:
            embedder = Embedder(
                policy.rag.embedding_model,
                batch_size=policy.rag.embedding_batch_size,
                backend=policy.rag.embedding_backend,
            )
        # the replay's store is the cache of every document set the run reads, not a deployment's working set: no cap
        # on its inline collections (under the deployment's 256, a run over more document sets dropped the least
        # recently used ones, whose chunks sent the support features read: sent_vectors). Not in the cache keys.
        uncapped = policy.rag.model_copy(update={"inline_cache_collections": REPLAY_INLINE_COLLECTIONS})
        self.store = DocumentStore(str(store_uri), embedder, uncapped)
        self._space = embedder.space
        self.rag = RagPipeline(self.store, policy.rag)
        # no embedder: over-long documents are cut by BM25 ranking; only the token count is used here
        self.long = LongContextPipeline(policy.long_context, window_tokens=self.window)
        self._stats: dict[tuple[str, ...], Any] = {}
        self._indexes: dict[tuple[str, ...], Any] = {}
        self._hashes: dict[int, tuple[Document, str]] = {}
        self._cache_path = Path(cache_dir) / CACHE_FILE if cache_dir else None
        self._cache = self._read_cache()

    def _read_cache(self) -> dict[str, Any]:
        if self._cache_path is None or not self._cache_path.is_file():
            return {}
        cache: dict[str, Any] = {}
        for line in self._cache_path.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
                cache[entry["key"]] = entry["value"]
            except (json.JSONDecodeError, KeyError):
                continue  # a torn last line from an interrupted run
        return cache

    def _key(self, example: Example, part: str) -> str:
        # refusal patterns and the question marker do not change retrieval: left out of the key; so is the first
        # pass, which the replay never takes (0 here: documents embedded before answering, as before it existed). The
        # backend's name is replaced by the embedder's vector space (pipelines.embedding.embedding_space), left out
        # for the fp32 model's space (torch, the backend caches were written with before the setting existed, onnx and
        # openvino: the same vectors), so those caches stay valid and a quantised export's entries are never reused
        # for another export's vectors (round six's int8 changed them under the same backend name)
        excluded = {"unanswerable_patterns", "question_marker", "first_pass_candidates", "embedding_backend"}
        retrieval_settings = self.policy.rag.model_dump(mode="json", exclude=excluded)
        if not self._space.endswith(":fp32"):
            retrieval_settings["embedding_space"] = self._space
        settings = (
            retrieval_settings
            if part in ("retrieval", "passages", "hits", "sent")
            else [self.policy.long_context.model_dump(mode="json"), self.window]
        )
        payload = [CACHE_VERSION, part, example.query, [(d.id, self._hash(d)) for d in example.documents], settings]
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode("utf-8")).hexdigest()

    def _hash(self, document: Document) -> str:
        """content_hash, once per document (a long document is hashed for every question's keys otherwise)."""
        from pipelines.store import content_hash

        found = self._hashes.get(id(document))
        if found is None or found[0] is not document:
            found = self._hashes[id(document)] = (document, content_hash(document))
        return found[1]

    def _cached(self, key: str, compute):
        if key not in self._cache:
            value = compute()
            if self._cache_path is not None:
                self._cache_path.parent.mkdir(parents=True, exist_ok=True)
                with self._cache_path.open("a", encoding="utf-8") as out:
                    out.write(json.dumps({"key": key, "value": value}) + "\n")
            self._cache[key] = value
        return self._cache[key]

    def inputs(self, example: Example, with_long: bool = True) -> ExampleInputs:
        """Cached under --data-dir: retrieval-side values by (query, documents, RAG settings), the long
        prompt's size and its cacheable document block by (query, documents, long settings, window)."""
        retrieval = self._cached(self._key(example, "retrieval"), lambda: self._retrieval_side(example))
        if not with_long:
            return ExampleInputs(**retrieval)
        # two entries, so caches written before the block was recorded stay valid; one packing fills both
        keys = self._key(example, "long"), self._key(example, "long_prefix")
        if any(k not in self._cache for k in keys):
            packed = self._long_prompt(example)
            for key, value in zip(keys, packed):
                self._cached(key, lambda value=value: value)
        return ExampleInputs(
            long_prompt_tokens=self._cache[keys[0]], long_prefix_tokens=self._cache[keys[1]], **retrieval
        )

    def _request(self, example: Example):
        from pipelines.base import ContextRequest

        messages = [{"role": "user", "content": example.query}]
        return ContextRequest(question=example.query, messages=messages, documents=example.documents)

    def _retrieval_side(self, example: Example) -> dict[str, Any]:
        from gateway.routing.inputs import document_stats, retrieval_signals
        from pipelines.tokens import count_tokens

        ids = tuple(example.doc_ids)
        if ids not in self._stats:
            self._stats[ids] = document_stats(example.documents)
        stats = self._stats[ids]
        request = self._request(example)
        retrieval = self.rag.retrieve_for(request)
        features = extract_features(example.query, stats, retrieval_signals(retrieval))
        rag_prompt = self.rag.prepare(request, retrieval=retrieval)
        return {
            "features": features,
            "rag_prompt_tokens": int(rag_prompt.prompt_tokens),
            "direct_prompt_tokens": int(stats.context_tokens + count_tokens(example.query)),
        }

    def passages(self, example: Example) -> list[str]:
        """The texts of the passages the RAG route places in the cheap prompt (what the answer verifier reads),
        cached like the other retrieval-side values."""

        def compute() -> list[str]:
            retrieval = self.rag.retrieve_for(self._request(example))
            return [p.text for p in retrieval.passages]

        return self._cached(self._key(example, "passages"), compute)

    def sent_vectors(self, example: Example):
        """The store's vectors of the chunks the RAG route places in the cheap prompt, one row each (what the live
        check reads: gateway.routing.answer_support.sent_chunk_vectors); which chunks is cached like the passages,
        the vectors are read from the store. None when no chunk was sent."""
        import numpy as np

        from gateway.routing.answer_support import stored_chunk_vectors

        def compute() -> dict:
            retrieval = self.rag.retrieve_for(self._request(example))
            chunks = [[c.chunk.doc_id, int(c.chunk.position)] for c in retrieval.selected]
            return {"collection": retrieval.collection, "chunks": chunks}

        sent = self._cached(self._key(example, "sent"), compute)
        if not sent["chunks"]:
            return None
        chunks = [(d, p) for d, p in sent["chunks"]]
        vectors = stored_chunk_vectors(self.store, sent["collection"], chunks)
        if any(v is None for v in vectors):
            # the recorded collection is gone (dropped under an older run's cap, or named under an older naming of
            # inline collections): the documents' collection now, embedded if the store lacks it. The same documents
            # and chunking settings (the cache key's) give the same chunks at the same positions.
            vectors = stored_chunk_vectors(self.store, self.store.inline_collection(example.documents), chunks)
        if any(v is None for v in vectors):
            raise ValueError(f"the store under --data-dir lacks chunks sent for {example.query[:60]!r}: re-run it")
        return np.stack([np.asarray(v, dtype=np.float32) for v in vectors])

    def retrieval_inputs(self, example: Example) -> dict[str, float] | None:
        """The retrieval signals of the pass that chose the passages (gateway.routing.answer_support.retrieval_inputs,
        as the live check computes them): the pre-route features' retrieval part and the hits' spread (cached)."""
        from classifier.features import RETRIEVAL_FEATURES

        def compute() -> list:
            from gateway.routing.answer_support import hit_positions

            return hit_positions(self.rag.retrieve_for(self._request(example)))

        positions = self._cached(self._key(example, "hits"), compute)
        features = self.inputs(example, with_long=False).features
        if not features.get("has_retrieval"):
            return None
        from gateway.routing.answer_support import hit_spread

        spread = hit_spread([(d, p) for d, p in positions])
        return {
            **{k: features[k] for k in RETRIEVAL_FEATURES},
            "hit_spread": float("nan") if spread is None else spread,
        }

    def document_index(self, example: Example):
        """The example's documents' term index (classifier.answer_features.document_index), as the gateway builds it."""
        from classifier.answer_features import document_index

        ids = tuple(example.doc_ids)
        if ids not in self._indexes:
            self._indexes[ids] = document_index("\n\n".join(d.text for d in example.documents))
        return self._indexes[ids]

    def _long_prompt(self, example: Example) -> tuple[int, int]:
        """(prompt tokens, tokens of the document block a provider could cache): the block counts only when the
        gateway would send the same one for every question (gateway.routing.prompt_cache.stable_document_block)."""
        from gateway.routing.prompt_cache import stable_document_block
        from pipelines.long_context import question_tokens

        prompt = self.long.prepare(self._request(example))
        block = 0
        if stable_document_block(prompt.provenance):
            # the packed body counts as its parts (pipelines.long_context.prompt_tokens): less the question part
            block = int(prompt.provenance["context_tokens"]) - question_tokens(example.query)
        return int(prompt.prompt_tokens), max(block, 0)

    def all_inputs(self, examples: list[Example], progress: bool = True, with_long: bool = True) -> list[ExampleInputs]:
        from tqdm import tqdm

        bar = tqdm(examples, desc="routing inputs", disable=not progress, unit="q")
        return [self.inputs(e, with_long) for e in bar]


class CorpusInputs:
    """A RouteInputBuilder per corpus (each with its own long window), sharing one embedding model and store: the
    same methods, dispatched by the example's corpus."""

    def __init__(
        self,
        policy: Policy,
        store_uri: str | Path,
        windows: dict[str, int | None],
        cache_dir: str | Path | None = None,
        embedder=None,
    ):
        from pipelines.embedding import Embedder

        if embedder is None:
            embedder = Embedder(
                policy.rag.embedding_model,
                batch_size=policy.rag.embedding_batch_size,
                backend=policy.rag.embedding_backend,
            )
        self.embedder = embedder
        self.builders = {
            name: RouteInputBuilder(policy, store_uri, window, cache_dir, embedder) for name, window in windows.items()
        }

    def builder(self, example: Example) -> RouteInputBuilder:
        return self.builders[example.source] if example.source in self.builders else next(iter(self.builders.values()))

    @property
    def window(self) -> int | dict[str, int]:
        """The long window: one number, or one per corpus when they differ."""
        windows = {name: b.window for name, b in self.builders.items()}
        return next(iter(windows.values())) if len(set(windows.values())) == 1 else windows

    def inputs(self, example: Example, with_long: bool = True) -> ExampleInputs:
        return self.builder(example).inputs(example, with_long)

    def passages(self, example: Example) -> list[str]:
        return self.builder(example).passages(example)

    def retrieval_inputs(self, example: Example):
        return self.builder(example).retrieval_inputs(example)

    def sent_vectors(self, example: Example):
        return self.builder(example).sent_vectors(example)

    def document_index(self, example: Example):
        return self.builder(example).document_index(example)

    def all_inputs(self, examples: list[Example], progress: bool = True, with_long: bool = True) -> list[ExampleInputs]:
        from tqdm import tqdm

        bar = tqdm(examples, desc="routing inputs", disable=not progress, unit="q")
        return [self.inputs(e, with_long) for e in bar]


# what the verification code reads the cheap side from: one builder, or one per corpus
InputSource = RouteInputBuilder | CorpusInputs


def corpus_windows(examples: list[Example], windows: list[int] | None) -> dict[str, int | None]:
    """--window-tokens per --data file (Example.source): none (the policy's), one for every file, or one per file
    in order."""
    names = list(dict.fromkeys(e.source for e in examples))
    windows = list(windows or [])
    if len(windows) > 1 and len(windows) != len(names):
        raise ExampleFileError(f"give one --window-tokens, or one per --data file ({len(names)}), not {len(windows)}")
    if len(windows) <= 1:
        return {name: (windows[0] if windows else None) for name in names}
    return dict(zip(names, windows))
