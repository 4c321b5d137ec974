"""The answer-aware verifier: P(the cheap route's answer is good enough), scored after it answered.

FrugalGPT (Chen et al., 2023) and AutoMix (Madaan et al., 2023) cascade: run the cheap model, score
its answer, escalate to the expensive one when the score is low. Here the scorer is a small learned
model over classifier.answer_features (the answer's refusal and hedge cues, multiple-choice validity,
grounding in the passages and the document, optional log-probabilities and the pre-route P(cheap)).

Label: the cheap answer is good enough (1) when rag_score >= lc_score - margin (margin 0 by default:
ties count as good, the cheaper route is the right call at equal quality). Training may weight each
example by how much the choice matters, |rag_score - lc_score| (plus a floor for ties), so the model
spends its capacity where escalating changes the score (see tests/benchmarks/bench_verifier.py).

Pure: fitting, out-of-fold scoring and (de)serialisation to skops bytes; no file I/O here.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

from classifier.answer_features import ANSWER_FEATURE_NAMES, MISSING
from classifier.model import TRUSTED_TYPES, ModelFileError, _json_safe, load_trusted

Estimator = Literal["boosting", "logistic"]
DEFAULT_ESTIMATOR: Estimator = "boosting"
DEFAULT_SEED = 0
DEFAULT_FOLDS = 5
# Weight of a tie (rag_score == lc_score) when training with choice-weighted examples.
DEFAULT_TIE_WEIGHT = 0.05
LABEL_RULE = "cheap answer good enough (label 1) when rag_score >= lc_score - margin"


def label_good(rag_score: float, lc_score: float, margin: float = 0.0) -> int:
    """1 when the cheap answer scored at least as well as the long one, within `margin`."""
    return int(float(rag_score) >= float(lc_score) - margin)


def choice_weights(rag_scores: Sequence[float], lc_scores: Sequence[float], tie_weight: float = DEFAULT_TIE_WEIGHT):
    """|rag_score - lc_score| per example, floored at tie_weight: how much the escalation decision
    changes the quality score. Ties still count a little (they teach that cheap is enough)."""
    import numpy as np

    diff = np.abs(np.asarray(rag_scores, dtype=float) - np.asarray(lc_scores, dtype=float))
    return np.maximum(diff, tie_weight)


def build_verifier_pipeline(estimator: Estimator = DEFAULT_ESTIMATOR, seed: int = DEFAULT_SEED):
    """Median imputation (NaN = feature absent) then boosted shallow trees, or a standardised
    logistic model. Both are on skops' trusted list (see classifier.model.TRUSTED_TYPES)."""
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    impute = ("impute", SimpleImputer(strategy="median", keep_empty_features=True, add_indicator=False))
    if estimator == "logistic":
        return Pipeline([impute, ("scale", StandardScaler()), ("model", LogisticRegression(C=0.3, max_iter=3000))])
    if estimator == "boosting":
        model = HistGradientBoostingClassifier(
            max_iter=80, learning_rate=0.06, max_depth=3, min_samples_leaf=25, l2_regularization=1.0,
            random_state=seed,
        )
        return Pipeline([impute, ("model", model)])
    raise ValueError(f"unknown estimator {estimator!r}; choose 'boosting' or 'logistic'")


def feature_matrix(rows: list[dict[str, float]], names: Sequence[str]):
    import numpy as np

    return np.asarray([[float(r.get(n, MISSING)) for n in names] for r in rows], dtype=float)


@dataclass
class VerifierModel:
    """A fitted pipeline over `feature_names`, with its card and its policy threshold."""

    pipeline: Any
    feature_names: list[str] = field(default_factory=lambda: list(ANSWER_FEATURE_NAMES))
    card: dict[str, Any] = field(default_factory=dict)
    source: str = "<memory>"

    @property
    def threshold(self) -> float | None:
        """The recommended escalation threshold (escalate when P(good) < threshold), if the card has one."""
        value = self.card.get("threshold")
        return None if value is None else float(value)

    def fit(self, rows: list[dict[str, float]], labels, sample_weight=None) -> "VerifierModel":
        import numpy as np

        x = feature_matrix(rows, self.feature_names)
        y = np.asarray(labels, dtype=int)
        if len(set(y.tolist())) < 2:
            raise ValueError("the verifier needs both labels (good enough / not); all examples have one")
        kwargs = {} if sample_weight is None else {"model__sample_weight": np.asarray(sample_weight, dtype=float)}
        self.pipeline.fit(x, y, **kwargs)
        return self

    def score(self, features: dict[str, float]) -> float:
        """P(the cheap answer is good enough)."""
        return float(self.scores([features])[0])

    def scores(self, rows: list[dict[str, float]]) -> list[float]:
        x = feature_matrix(rows, self.feature_names)
        classes = list(self.pipeline.classes_)
        return [float(p) for p in self.pipeline.predict_proba(x)[:, classes.index(1)]]

    def escalate(self, features: dict[str, float], threshold: float | None = None) -> bool:
        """True when the cheap answer should be escalated to the long route."""
        t = self.threshold if threshold is None else threshold
        if t is None:
            raise ValueError("no threshold given and the model card has none")
        return self.score(features) < t


# -- training and out-of-fold scores ------------------------------------------------------------------
def _fit_predict(estimator, seed, names, rows_train, y_train, w_train, rows_test):
    import numpy as np

    if len(set(np.asarray(y_train).tolist())) < 2:
        return np.full(len(rows_test), float(np.asarray(y_train)[0]) if len(y_train) else 0.5)
    model = VerifierModel(build_verifier_pipeline(estimator, seed), list(names))
    model.fit(rows_train, y_train, w_train)
    return np.asarray(model.scores(rows_test))


def _oof(rows, labels, splits, estimator, seed, names, sample_weight):
    import numpy as np

    y = np.asarray(labels, dtype=int)
    w = None if sample_weight is None else np.asarray(sample_weight, dtype=float)
    oof = np.full(len(y), np.nan)
    for train_idx, test_idx in splits:
        oof[test_idx] = _fit_predict(
            estimator, seed, names, [rows[i] for i in train_idx], y[train_idx],
            None if w is None else w[train_idx], [rows[i] for i in test_idx],
        )
    return oof


def grouped_splits(labels, groups, n_splits: int = DEFAULT_FOLDS, seed: int = DEFAULT_SEED):
    """(train, test) index pairs with every group wholly in one test fold (classifier.training's folds)."""
    from classifier.training import grouped_folds

    return grouped_folds(labels, groups, n_splits, seed)


def leave_one_group_out_splits(groups):
    """(train, test) index pairs, one per distinct group (e.g. task): train on the others, test on it."""
    import numpy as np

    groups = np.asarray(groups)
    out = []
    for g in sorted(set(groups.tolist())):
        test = np.flatnonzero(groups == g)
        train = np.flatnonzero(groups != g)
        out.append((train, test))
    return out


def out_of_fold_scores(
    rows: list[dict[str, float]], labels, groups, *, estimator: Estimator = DEFAULT_ESTIMATOR,
    n_splits: int = DEFAULT_FOLDS, seed: int = DEFAULT_SEED, feature_names: Sequence[str] = ANSWER_FEATURE_NAMES,
    sample_weight=None,
):
    """P(good) for every example from a verifier that never saw its group (document), grouped k-fold."""
    return _oof(rows, labels, grouped_splits(labels, groups, n_splits, seed), estimator, seed, feature_names,
                sample_weight)


def leave_one_group_out_scores(
    rows: list[dict[str, float]], labels, groups, *, estimator: Estimator = DEFAULT_ESTIMATOR,
    seed: int = DEFAULT_SEED, feature_names: Sequence[str] = ANSWER_FEATURE_NAMES, sample_weight=None,
):
    """P(good) for every example from a verifier trained on the other groups only (e.g. leave one task out)."""
    return _oof(rows, labels, leave_one_group_out_splits(groups), estimator, seed, feature_names, sample_weight)


def threshold_for_escalation_share(scores, share: float) -> float:
    """The threshold that escalates (score < threshold) about `share` of these scores: chosen on
    training scores, applied to new ones, it never looks at held-out data."""
    import numpy as np

    s = np.sort(np.asarray(scores, dtype=float))
    if share <= 0 or len(s) == 0:
        return 0.0
    if share >= 1:
        return math.nextafter(float(s[-1]), math.inf)
    k = int(round(share * len(s)))
    k = min(max(k, 1), len(s) - 1)
    return float((s[k - 1] + s[k]) / 2)


def classification_metrics(labels, scores) -> dict[str, float | None]:
    from classifier.training import classification_metrics as metrics

    return metrics(labels, scores)


@dataclass
class VerifierTrainingResult:
    model: VerifierModel
    cv_metrics: dict[str, Any]
    oof_scores: list[float]


def train_verifier(
    rows: list[dict[str, float]], labels, groups, *, estimator: Estimator = DEFAULT_ESTIMATOR,
    feature_names: Sequence[str] = ANSWER_FEATURE_NAMES, sample_weight=None, n_splits: int = DEFAULT_FOLDS,
    seed: int = DEFAULT_SEED, escalation_share: float | None = None, card: dict[str, Any] | None = None,
) -> VerifierTrainingResult:
    """Cross-validate grouped by `groups` (documents), then fit on everything.

    With `escalation_share`, the card's `threshold` is the quantile of the out-of-fold scores that
    escalates that share of answers (the policy threshold to ship with the model)."""
    import numpy as np

    y = np.asarray(labels, dtype=int)
    if len(set(y.tolist())) < 2:
        raise ValueError("the verifier needs both labels (good enough / not); all examples have one")
    oof = out_of_fold_scores(rows, y, groups, estimator=estimator, n_splits=n_splits, seed=seed,
                             feature_names=feature_names, sample_weight=sample_weight)
    metrics = classification_metrics(y, oof)
    metrics.update(n_groups=len(set(groups)), n_splits=min(n_splits, len(set(groups))), seed=seed,
                   weighted=sample_weight is not None)
    model = VerifierModel(build_verifier_pipeline(estimator, seed), list(feature_names))
    model.fit(rows, y, sample_weight)
    model.card = {
        "predicts": "P(the cheap route's answer is good enough): rag_score >= lc_score - margin",
        "estimator": estimator,
        "feature_names": list(feature_names),
        "label_rule": LABEL_RULE,
        "cv_metrics_grouped": metrics,
        **(card or {}),
    }
    if escalation_share is not None:
        model.card["threshold"] = threshold_for_escalation_share(oof, escalation_share)
        model.card["threshold_source"] = f"quantile of out-of-fold P(good) escalating {escalation_share:.0%}"
    return VerifierTrainingResult(model=model, cv_metrics=metrics, oof_scores=[float(p) for p in oof])


# -- (de)serialisation ----------------------------------------------------------------------------------
def verifier_to_bytes(model: VerifierModel) -> tuple[bytes, str]:
    """The skops bytes of the pipeline and the JSON text of its card (feature names included)."""
    import zipfile

    import skops.io as sio

    data = sio.dumps(model.pipeline, compression=zipfile.ZIP_DEFLATED, compresslevel=9)
    card = dict(model.card)
    card["feature_names"] = list(model.feature_names)
    return data, json.dumps(_json_safe(card), indent=2, sort_keys=True) + "\n"


def verifier_from_bytes(
    data: bytes, card: dict[str, Any] | str | None = None, source: str = "<memory>"
) -> VerifierModel:
    """A verifier from skops bytes and its card (dict or JSON text). Refuses types outside
    classifier.model.TRUSTED_TYPES, and a card whose features this version does not compute."""
    if isinstance(card, str):
        card = json.loads(card)
    card = dict(card or {})
    pipeline = load_trusted(data, source)
    names = list(card.get("feature_names") or ANSWER_FEATURE_NAMES)
    known = set(ANSWER_FEATURE_NAMES) | _pre_route_names()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ModelFileError(f"{source}: verifier uses features this version does not compute: {unknown}")
    n_in = getattr(pipeline, "n_features_in_", len(names))
    if n_in != len(names):
        raise ModelFileError(f"{source}: verifier expects {n_in} features, its card names {len(names)}")
    return VerifierModel(pipeline=pipeline, feature_names=names, card=card, source=source)


def _pre_route_names() -> set[str]:
    from classifier.features import FEATURE_NAMES

    return set(FEATURE_NAMES)
