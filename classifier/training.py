"""Fit the P(cheap route suffices) model and measure it with cross-validation grouped by document.

Pure: takes feature rows and labels, returns fitted pipelines, metrics and a card dict. Reading data
and writing files belong to the callers (gateway.commands.train) and classifier.model.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING, Any

from classifier.estimators import PRE_ROUTE, Estimator, build_pipeline
from classifier.features import FEATURE_NAMES, feature_vector

if TYPE_CHECKING:
    from numpy.typing import NDArray

    Values = Sequence[Any] | NDArray[Any]  # labels, groups, scores: a list or an array
    Splits = list[tuple[NDArray[Any], NDArray[Any]]]  # (train, test) index arrays

DEFAULT_SEED = 0
DEFAULT_FOLDS = 5
DEFAULT_ESTIMATOR: Estimator = "boosting"
LABEL_RULE = "cheap suffices (label 1) when rag_score >= lc_score - margin"


def label_from_scores(rag_score: float, lc_score: float, margin: float = 0.0) -> int:
    """1 when the cheap (RAG) answer scored at least as well as the long one, within `margin`.
    Ties count as cheap: at equal quality the cheaper route is the right call."""
    return int(float(rag_score) >= float(lc_score) - margin)


def feature_matrix(rows: list[dict[str, float]]) -> NDArray[Any]:
    import numpy as np

    return np.asarray([feature_vector(r) for r in rows], dtype=float)


def grouped_folds(labels: Values, groups: Values, n_splits: int = DEFAULT_FOLDS, seed: int = DEFAULT_SEED) -> Splits:
    """(train_index, test_index) pairs: every group (document) lies wholly in one test fold.
    Stratified by label where the groups allow; fewer folds when there are fewer groups."""
    import numpy as np
    from sklearn.model_selection import GroupKFold, StratifiedGroupKFold

    labels = np.asarray(labels)
    groups = np.asarray(groups)
    n_groups = len(set(groups.tolist()))
    if n_groups < 2:
        raise ValueError("grouped cross-validation needs at least two documents")
    splits = min(n_splits, n_groups)
    if len(set(labels.tolist())) > 1 and min(np.bincount(labels.astype(int))) >= splits:
        splitter = StratifiedGroupKFold(n_splits=splits, shuffle=True, random_state=seed)
    else:
        splitter = GroupKFold(n_splits=splits)
    return list(splitter.split(np.zeros(len(labels)), labels, groups))


def _fit_predict(
    estimator: Estimator, seed: int, x_train: NDArray[Any], y_train: NDArray[Any], x_test: NDArray[Any]
) -> NDArray[Any]:
    import numpy as np

    if len(set(y_train.tolist())) < 2:
        # a fold whose training part has one class: the honest prediction is that class's rate
        return np.full(len(x_test), float(y_train[0]) if len(y_train) else 0.5)
    pipeline = build_pipeline(estimator, PRE_ROUTE, seed).fit(x_train, y_train)
    return pipeline.predict_proba(x_test)[:, list(pipeline.classes_).index(1)]


def out_of_fold_probabilities(
    rows: list[dict[str, float]],
    labels: Values,
    groups: Values,
    estimator: Estimator = DEFAULT_ESTIMATOR,
    n_splits: int = DEFAULT_FOLDS,
    seed: int = DEFAULT_SEED,
    splits: Splits | None = None,
) -> NDArray[Any]:
    """P(cheap) for every example from a model that never saw its document (or, with `splits`, from the
    model of the split that holds it out, e.g. leave one task out)."""
    import numpy as np

    x = feature_matrix(rows)
    y = np.asarray(labels, dtype=int)
    oof = np.zeros(len(y), dtype=float)
    for train_idx, test_idx in splits if splits is not None else grouped_folds(y, groups, n_splits, seed):
        oof[test_idx] = _fit_predict(estimator, seed, x[train_idx], y[train_idx], x[test_idx])
    return oof


def classification_metrics(labels: Values, probabilities: Values) -> dict[str, float | None]:
    import numpy as np
    from sklearn.metrics import accuracy_score, brier_score_loss, log_loss, roc_auc_score

    y = np.asarray(labels, dtype=int)
    p = np.clip(np.asarray(probabilities, dtype=float), 1e-6, 1 - 1e-6)
    both = len(set(y.tolist())) == 2
    return {
        "roc_auc": float(roc_auc_score(y, p)) if both else None,
        "accuracy": float(accuracy_score(y, p >= 0.5)),
        "majority_accuracy": float(max(y.mean(), 1 - y.mean())),
        "brier": float(brier_score_loss(y, p)),
        "brier_base_rate": float(brier_score_loss(y, np.full(len(y), y.mean()))),
        "log_loss": float(log_loss(y, p, labels=[0, 1])),
        "positive_rate": float(y.mean()),
        "n": int(len(y)),
    }


@dataclass
class TrainingResult:
    pipeline: Any
    cv_metrics: dict[str, Any]
    oof_probabilities: list[float]


def train(
    rows: list[dict[str, float]],
    labels: Values,
    groups: Values,
    estimator: Estimator = DEFAULT_ESTIMATOR,
    n_splits: int = DEFAULT_FOLDS,
    seed: int = DEFAULT_SEED,
) -> TrainingResult:
    """Cross-validate grouped by document, then fit on everything."""
    import numpy as np

    y = np.asarray(labels, dtype=int)
    if len(set(y.tolist())) < 2:
        raise ValueError("training needs both labels (cheap suffices / does not); all examples have one")
    oof = out_of_fold_probabilities(rows, y, groups, estimator, n_splits, seed)
    metrics: dict[str, Any] = classification_metrics(y, oof)
    metrics.update(
        n_documents=len(set(groups)),
        n_splits=min(n_splits, len(set(groups))),
        seed=seed,
        grouping="StratifiedGroupKFold by document (shuffle, fixed seed)",
    )
    pipeline = build_pipeline(estimator, PRE_ROUTE, seed).fit(feature_matrix(rows), y)
    return TrainingResult(pipeline=pipeline, cv_metrics=metrics, oof_probabilities=[float(p) for p in oof])


def document_hash(text: str) -> str:
    """A training document's identity in a model card (calibrate uses it to skip documents the model saw)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def data_hash(records: list[dict[str, Any]]) -> str:
    """sha256 over the canonical JSON of the training records (order-sensitive)."""
    digest = hashlib.sha256()
    for record in records:
        digest.update(json.dumps(record, sort_keys=True, ensure_ascii=False).encode("utf-8"))
        digest.update(b"\n")
    return "sha256:" + digest.hexdigest()


def library_versions() -> dict[str, str]:
    versions = {}
    for name in ("scikit-learn", "skops", "numpy", "sentence-transformers", "lancedb", "tiktoken"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def model_card(
    result: TrainingResult,
    *,
    estimator: Estimator,
    data_sha: str,
    label_rule: str,
    command: str,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "predicts": "P(cheap route suffices): the RAG answer scores at least as well as the long-context one",
        "estimator": estimator,
        "feature_names": list(FEATURE_NAMES),
        "label_rule": label_rule,
        "training_data_hash": data_sha,
        "cv_metrics_grouped_by_document": result.cv_metrics,
        "library_versions": library_versions(),
        "training_command": command,
        **(extra or {}),
    }
