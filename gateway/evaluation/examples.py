"""Labelled and paired example files, and their routing inputs computed the way the gateway does.

Example lines (JSON): `query`; the documents as `doc_id` (DIR/<doc_id>.txt), or `documents`, a list
of ids or inline {"id", "text"} objects; a `label` (1 = the cheap route suffices) or `rag_score` and
`lc_score`; optional `group` (default: the documents' ids). Paired replay lines also carry
`rag_pred`, `lc_pred` and optionally `task`, `gt`.

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


@dataclass
class Example:
    query: str
    documents: list[Document]
    group: str
    record: dict[str, Any]  # the line as read

    @property
    def doc_ids(self) -> list[str]:
        return [d.id for d in self.documents]


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
                    docs.append(Document(id=str(item.get("id") or f"inline-{number}-{i}"), text=item["text"],
                                         title=item.get("title")))
                else:
                    raise ExampleFileError(f"{where}: documents[{i}] must be an id or an object with 'text'")
            if not docs:
                raise ExampleFileError(f"{where}: needs 'doc_id' or 'documents'")
            group = str(record.get("group") or "+".join(sorted(d.id for d in docs)))
            examples.append(Example(record["query"], docs, group, record))
    if not examples:
        raise ExampleFileError(f"{path}: no examples")
    return examples


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

    def __init__(self, policy: Policy, store_uri: str | Path, window_tokens: int | None = None,
                 cache_dir: str | Path | None = None, embedder=None):
        from pipelines.embedding import Embedder
        from pipelines.long_context import LongContextPipeline
        from pipelines.rag import RagPipeline
        from pipelines.store import DocumentStore

        self.policy = policy
        self.window = long_window(policy, window_tokens)
        if embedder is None:
            embedder = Embedder(policy.rag.embedding_model, batch_size=policy.rag.embedding_batch_size)
        self.store = DocumentStore(str(store_uri), embedder, policy.rag)
        self.rag = RagPipeline(self.store, policy.rag)
        # no embedder: over-long documents are cut by BM25 ranking; only the token count is used here
        self.long = LongContextPipeline(policy.long_context, window_tokens=self.window)
        self._stats: dict[tuple[str, ...], Any] = {}
        self._indexes: dict[tuple[str, ...], Any] = {}
        self._cache_path = Path(cache_dir) / CACHE_FILE if cache_dir else None
        self._cache = self._read_cache()

    def _read_cache(self) -> dict[str, dict]:
        if self._cache_path is None or not self._cache_path.is_file():
            return {}
        cache = {}
        for line in self._cache_path.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
                cache[entry["key"]] = entry["value"]
            except (json.JSONDecodeError, KeyError):
                continue  # a torn last line from an interrupted run
        return cache

    def _key(self, example: Example, part: str) -> str:
        from pipelines.store import content_hash

        # refusal patterns and the question marker do not change retrieval: left out of the key
        retrieval_settings = self.policy.rag.model_dump(mode="json", exclude={"unanswerable_patterns", "question_marker"})
        settings = (retrieval_settings if part in ("retrieval", "passages")
                    else [self.policy.long_context.model_dump(mode="json"), self.window])
        payload = [CACHE_VERSION, part, example.query, [(d.id, content_hash(d)) for d in example.documents], settings]
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode("utf-8")).hexdigest()

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
        return ExampleInputs(long_prompt_tokens=self._cache[keys[0]], long_prefix_tokens=self._cache[keys[1]],
                             **retrieval)

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
