"""The verifier's inputs that need the gateway's parts: the retrieval pass that chose the passages sent, and the
answer's support in those passages in embedding space (classifier.answer_features' RETRIEVAL_INPUTS, ret_hit_spread
and SUPPORT_FEATURES). The live check (gateway.routing.planner.cheap_answer) and the replay
(gateway.evaluation.verification) call these same functions, so both compute the same values.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from pipelines.rag import Retrieval
    from pipelines.store import DocumentStore

EmbedFn = Callable[[list[str]], np.ndarray]  # texts -> L2-normalised rows (pipelines.embedding.Embedder.embed_queries)
# -> the vectors of the passages sent, one row per chunk (sent_chunk_vectors), or None: then the passages' texts are embedded
VectorsFn = Callable[[], "np.ndarray | None"]

# hits within this many chunks of each other count as one place in the document
HIT_CLUSTER_CHUNKS = 2
# an answer's sentences scored against the passages: the first ones carry the answer, and a long answer stays cheap
MAX_SENTENCES = 12


def hit_spread(positions: Sequence[tuple[str, int]]) -> float | None:
    """How scattered the retrieved hits are: the number of separate places they come from (a document's hits
    within HIT_CLUSTER_CHUNKS chunks of each other are one place) over the number of hits; 1/n = all together,
    1 = every hit somewhere else. None without hits. (document id, chunk position) per hit."""
    if not positions:
        return None
    places = 0
    by_doc: dict[str, list[int]] = {}
    for doc, position in positions:
        by_doc.setdefault(doc, []).append(int(position))
    for found in by_doc.values():
        found.sort()
        places += 1 + sum(1 for a, b in zip(found, found[1:]) if b - a > HIT_CLUSTER_CHUNKS)
    return places / len(positions)


def hit_positions(retrieval: Retrieval | None) -> list[tuple[str, int]]:
    """(document id, chunk position) of each retrieved hit of a pipelines.rag Retrieval (neighbours left out)."""
    if retrieval is None:
        return []
    return [(h.chunk.doc_id, int(h.chunk.position)) for h in retrieval.hits if h.rank != 0]


def retrieval_inputs(question: str, retrieval: Retrieval | None) -> dict[str, float] | None:
    """The retrieval signals of the pass that chose the passages sent (classifier.features.retrieval_features,
    the pre-route features' own function) and the hits' spread; None without a retrieval pass."""
    from classifier.features import retrieval_features
    from gateway.routing.inputs import retrieval_signals

    signals = retrieval_signals(retrieval)
    if signals is None:
        return None
    values = retrieval_features(question, signals)
    spread = hit_spread(hit_positions(retrieval))
    values["hit_spread"] = math.nan if spread is None else spread
    return values


def stored_chunk_vectors(
    store: DocumentStore, collection: str, chunks: Sequence[tuple[str, int]]
) -> list[np.ndarray | None]:
    """The vectors the store holds for these chunks ((document id, position) each), read through its in-memory
    cache of document vectors (pipelines.store.DocumentStore.chunk_vectors); None for a chunk it does not hold
    (a document still being embedded)."""
    from pipelines.errors import CollectionNotFound, StoreUnavailable

    ids = sorted({doc for doc, _ in chunks})
    try:
        held = store.chunk_vectors(collection, ids) if ids else {}
    except (CollectionNotFound, StoreUnavailable):  # dropped or unreadable meanwhile: the caller embeds the texts
        held = {}
    out: list[np.ndarray | None] = []
    for doc, position in chunks:
        found = held.get(doc)
        out.append(found.vectors[int(position)] if found is not None and 0 <= int(position) < len(found) else None)
    return out


def sent_chunk_vectors(store: DocumentStore, retrieval: Retrieval | None) -> np.ndarray | None:
    """One row per chunk placed in the cheap prompt (retrieval.selected): the store's vector of that chunk, as
    ingestion embedded it (no passage is embedded again per answer); a chunk the store does not hold yet is embedded
    here with the store's model (its vectors equal the stored ones within float tolerance). None without chunks."""
    if retrieval is None or not retrieval.selected:
        return None
    chunks = [c.chunk for c in retrieval.selected]
    vectors = stored_chunk_vectors(store, retrieval.collection, [(c.doc_id, c.position) for c in chunks])
    missing = [i for i, v in enumerate(vectors) if v is None]
    if missing:
        fresh = store.embedder.embed([chunks[i].text for i in missing])
        for i, v in zip(missing, fresh):
            vectors[i] = v
    return np.stack([np.asarray(v, dtype=np.float32) for v in vectors])


def answer_support(
    question: str,
    answer: str | None,
    passages: Sequence[str],
    embed: EmbedFn | None,
    passage_vectors: np.ndarray | None = None,
) -> dict[str, float] | None:
    """Cosine similarities in the embedding model's space: the whole answer against its best passage, each of the
    answer's sentences (pipelines.safety.grounding's splitter) against its best passage (mean and min over the
    sentences), and the question against its best passage. The passages: `passage_vectors` when given (the chunks
    sent, as the store holds them: sent_chunk_vectors), else the texts embedded. None without an embedding model,
    passages or answer."""
    from pipelines.safety.grounding import split_sentences

    passages = [p for p in passages if p and p.strip()]
    has_vectors = passage_vectors is not None and len(passage_vectors) > 0
    if embed is None or not (has_vectors or passages) or not answer or not answer.strip():
        return None
    sentences = [answer[a:b] for a, b in split_sentences(answer)][:MAX_SENTENCES] or [answer]
    texts = [answer, question or answer, *sentences]
    vectors = np.asarray(embed(texts if has_vectors else [*texts, *passages]), dtype=np.float32)
    whole, asked = vectors[0], vectors[1]
    claims = vectors[2 : 2 + len(sentences)]
    sent = np.asarray(passage_vectors, dtype=np.float32) if has_vectors else vectors[len(texts) :]
    per_sentence = (claims @ sent.T).max(axis=1)
    return {
        "ans_passage_similarity": float((sent @ whole).max()),
        "ans_sentence_support_mean": float(per_sentence.mean()),
        "ans_sentence_support_min": float(per_sentence.min()),
        "query_passage_similarity": float((sent @ asked).max()) if question else math.nan,
    }


def with_logprobs(body: dict, wanted: bool, model: str) -> dict:
    """The cheap leg's body asking for token log-probabilities (routing.verifier.logprobs); not of the in-process
    local/ models, which have none to give (gateway.upstreams.local refuses the field)."""
    if not wanted or body.get("logprobs") or model.startswith("local/"):
        return body
    return {**body, "logprobs": True}


def take_logprobs(completion: dict, client_body: dict) -> list[float] | None:
    """The answer's token log-probabilities from an OpenAI-style completion (choices[0].logprobs.content[].logprob),
    removed from it unless the client asked for them itself. None when the upstream returned none."""
    try:
        choice = completion["choices"][0]
    except (KeyError, IndexError, TypeError):
        return None
    found = choice.get("logprobs") if isinstance(choice, dict) else None
    if not client_body.get("logprobs") and isinstance(choice, dict) and "logprobs" in choice:
        choice["logprobs"] = None
    content = found.get("content") if isinstance(found, dict) else None
    if not isinstance(content, list):
        return None
    raw = [t.get("logprob") for t in content if isinstance(t, dict)]
    values = [float(v) for v in raw if isinstance(v, (int, float)) and math.isfinite(float(v))]
    return values or None
