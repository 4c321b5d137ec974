"""The answer verifier's inputs for paired examples, computed as the gateway computes them.

Each recorded cheap (RAG) answer is paired with the passages our retrieval places in the cheap prompt
for that question, the retrieval pass's signals, the document's term index (gateway.evaluation.examples.
RouteInputBuilder) and, when an embedding model is given, the answer's support in the passages
(gateway.routing.answer_support), then turned into features by gateway.routing.escalation.CheapAnswerCheck.features,
the function the live check uses. `selfroute train --verifier`, `selfroute calibrate` and `selfroute eval replay`
share this.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.evaluation.examples import Example, InputSource
from gateway.routing.escalation import CheapAnswer, CheapAnswerCheck
from policies.schema import Policy

if TYPE_CHECKING:
    from classifier.estimators import Estimator

EMBEDDINGS_FILE = "answer_embeddings.sqlite3"


class CachedEmbed:
    """The embedding model's normalised vectors, cached on disk by text (the replay embeds each recorded answer,
    its sentences and the passages once; a second run reads them back)."""

    def __init__(self, embedder, cache_dir: str | Path | None = None):
        self.embedder = embedder
        self._memory: dict[str, bytes] = {}
        self._db = None
        if cache_dir is not None:
            Path(cache_dir).mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(Path(cache_dir) / EMBEDDINGS_FILE))
            self._db.execute("CREATE TABLE IF NOT EXISTS vectors (key TEXT PRIMARY KEY, vector BLOB)")
            model = str(getattr(embedder, "model_path", "") or "")
            self._salt = hashlib.sha256(model.encode()).hexdigest()[:8]
        else:
            self._salt = ""

    def _key(self, text: str) -> str:
        return hashlib.sha256((self._salt + "\0" + text).encode("utf-8")).hexdigest()

    def prefetch(self, texts: Sequence[str], batch: int = 512, progress: bool = False) -> None:
        """Embed the texts not cached yet, in large batches (much faster than one answer at a time)."""
        import numpy as np
        from tqdm import tqdm

        keys = {self._key(t): t for t in texts}
        missing = [k for k in keys if k not in self._memory]
        if self._db is not None and missing:
            for start in range(0, len(missing), 900):
                part = missing[start : start + 900]
                rows = self._db.execute(
                    f"SELECT key, vector FROM vectors WHERE key IN ({','.join('?' * len(part))})", part
                ).fetchall()
                self._memory.update(rows)
            missing = [k for k in missing if k not in self._memory]
        # short texts together: a batch pads to its longest text (answers' sentences are a few words, passages hundreds)
        missing.sort(key=lambda k: len(keys[k]))
        for start in tqdm(
            range(0, len(missing), batch), desc="embedding answers and passages", unit="batch", disable=not progress
        ):
            part = missing[start : start + batch]
            vectors = np.asarray(self.embedder.embed([keys[k] for k in part]), dtype=np.float32)
            blobs = [(k, v.tobytes()) for k, v in zip(part, vectors)]
            self._memory.update(blobs)
            if self._db is not None:
                self._db.executemany("INSERT OR REPLACE INTO vectors VALUES (?, ?)", blobs)
                self._db.commit()

    def __call__(self, texts: list[str]):
        import numpy as np

        self.prefetch(texts)
        return np.stack([np.frombuffer(self._memory[self._key(t)], dtype=np.float32) for t in texts])


def _given(vectors):
    """The vectors already read, as CheapAnswer.passage_vectors gives them (a function, read when needed live)."""
    return lambda: vectors


def _collect(texts: list[str], dimension: int = 1):
    """An embedding function that only records what it is asked (to prefetch it in batches first); its zero rows
    have the passage vectors' width, when given, so the similarities can be computed."""
    import numpy as np

    def embed(batch: list[str]):
        texts.extend(batch)
        return np.zeros((len(batch), dimension), dtype=np.float32)

    return embed


def cheap_answers(
    builder: InputSource, examples: Sequence[Example], progress: bool = False, embed: CachedEmbed | None = None
) -> list[CheapAnswer]:
    """The recorded cheap answer (`rag_pred`) of each example with what the cheap model saw: the passages, the
    retrieval pass's signals, the document's index and (with `embed`) the embedding model for its support."""
    from tqdm import tqdm

    from gateway.routing.answer_support import answer_support

    out = []
    for e in tqdm(examples, desc="verifier inputs", disable=not progress, unit="q"):
        # the support reads the chunks sent as the store holds them (as live), read here once per answer
        vectors = builder.sent_vectors(e) if embed is not None else None
        out.append(
            CheapAnswer(
                e.record.get("rag_pred"),
                e.query,
                builder.passages(e),
                builder.document_index(e),
                retrieval=builder.retrieval_inputs(e),
                embed=embed,
                passage_vectors=_given(vectors) if embed is not None else None,
            )
        )
    if embed is not None:
        texts: list[str] = []
        for a in out:
            vectors = a.passage_vectors() if a.passage_vectors is not None else None
            width = vectors.shape[1] if vectors is not None and vectors.ndim == 2 else 1
            answer_support(a.query, a.text, a.passages, _collect(texts, width), vectors)
        embed.prefetch(texts, progress=progress)
    return out


def answer_rows(
    answers: Sequence[CheapAnswer], probabilities: Sequence[float | None] | None = None, with_support: bool = True
) -> list[dict]:
    """Verifier features per answer; `probabilities`: the pre-route P(cheap) of each (out of fold), if any."""
    probabilities = probabilities if probabilities is not None else [None] * len(answers)
    return [CheapAnswerCheck.features(a, p, with_support) for a, p in zip(answers, probabilities)]


def protocol_inputs(examples: Sequence[Example]) -> dict:
    """The keyword arguments of classifier.verifier.protocol_splits for these examples."""
    return {
        "tasks": [e.task for e in examples],
        "corpora": [e.corpus for e in examples],
        "models": [e.model for e in examples],
    }


def replay_scores(
    policy: Policy,
    policy_file,
    examples,
    inputs,
    builder: InputSource,
    *,
    protocol: str = "grouped",
    estimator: Estimator = "boosting",
    folds: int = 5,
    seed: int = 0,
    model=None,
    verifier_file=None,
    verifier_threshold: float | None = None,
    progress: bool = False,
    embed: CachedEmbed | None = None,
    feature_names: Sequence[str] | None = None,
    splits=None,
    rows_out: list | None = None,
    verifier_estimator: Estimator | None = None,
):
    """(P(cheap), verifier P(good) or None, verifier threshold or None) per example, for the replay and calibrate.

    P(cheap): from `model` (a route model file) as it is, else out of fold under `protocol` (classifier.verifier.
    protocol_splits: "grouped" k folds by document, "loto" leave one task out, "corpus" leave one corpus out,
    "model" leave one model family out and its documents; or the given `splits`). P(good): from `verifier_file` as
    it is, else, when the policy has routing.verifier, out of fold with the same splits over `feature_names`
    (default: the policy's verifier's), with choice-weighted labels; None when neither. The threshold:
    `verifier_threshold`, else the policy's, else the verifier card's. `rows_out`, when given, receives the
    verifier's feature rows (for permutation importance). `verifier_estimator`: the refitted verifier's estimator
    (default: `estimator`, the pre-route model's)."""
    import numpy as np

    from classifier.answer_features import SUPPORT_FEATURES
    from classifier.training import label_from_scores, out_of_fold_probabilities
    from classifier.verifier import choice_weights, label_good, protocol_scores, protocol_splits
    from gateway.routing.model_files import load_model, load_verifier, load_verifier_model

    labels = [label_from_scores(e.record["rag_score"], e.record["lc_score"]) for e in examples]
    groups = [e.group for e in examples]
    if splits is None and (model is None or (verifier_file is None and policy.routing.verifier is not None)):
        splits = protocol_splits(protocol, labels, groups, n_splits=folds, seed=seed, **protocol_inputs(examples))
    rows = [i.features for i in inputs]
    probabilities: Any  # a list from the model file, an array out of fold (both index and zip alike)
    if model is not None:
        probabilities = load_model(model).cheap_probabilities(rows)
    else:
        probabilities = out_of_fold_probabilities(
            rows, labels, groups, estimator, folds, seed, splits=[(s.train, s.test) for s in splits]
        )
    verifier, threshold = None, verifier_threshold
    if verifier_file is not None:
        verifier = load_verifier(verifier_file)
    elif policy.routing.verifier is None:
        return probabilities, None, None
    shipped = None
    if threshold is None and policy.routing.verifier is not None:
        threshold = policy.routing.verifier.threshold
    if threshold is None or (verifier is None and feature_names is None):
        shipped = verifier or load_verifier_model(policy, policy_file)
    if threshold is None:  # the card's: of the given verifier, else of the policy's (refitted here)
        threshold = shipped.threshold if shipped is not None else None
    if threshold is None:
        raise ValueError("no verifier threshold: give --verifier-threshold")
    names = (
        list(verifier.feature_names)
        if verifier is not None
        else list(feature_names)
        if feature_names is not None
        else verifier_features(shipped)
    )
    if not set(names) & set(SUPPORT_FEATURES):
        embed = None  # nothing reads the embedding-space support: skip the embedding pass
    answers = cheap_answers(builder, examples, progress=progress, embed=embed)
    rows_v = answer_rows(answers, probabilities)
    if rows_out is not None:
        rows_out.extend(rows_v)
    if verifier is not None:
        return probabilities, verifier.scores(rows_v), threshold
    rag = [float(e.record["rag_score"]) for e in examples]
    lc = [float(e.record["lc_score"]) for e in examples]
    y = np.array([label_good(r, c) for r, c in zip(rag, lc)])
    scores = protocol_scores(
        rows_v,
        y,
        splits,
        estimator=verifier_estimator or estimator,
        seed=seed,
        feature_names=names,
        sample_weight=choice_weights(rag, lc),
    )
    return probabilities, [float(s) for s in scores], threshold


def verifier_features(verifier) -> list[str]:
    """The features a refitted verifier reads: the shipped verifier's (its card), without the pre-route P(cheap)
    (refits take the answer features only), else classifier.verifier.TRANSFER_FEATURE_NAMES."""
    from classifier.verifier import TRANSFER_FEATURE_NAMES

    names = list(verifier.feature_names) if verifier is not None else list(TRANSFER_FEATURE_NAMES)
    return [n for n in names if n != "pre_route_probability"]
