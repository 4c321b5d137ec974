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

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from classifier.answer_features import ANSWER_FEATURE_NAMES, MISSING, PORTABLE_SIGNALS, SUPPORT_FEATURES
from classifier.estimators import VERIFIER, Estimator, build_pipeline
from classifier.model import ModelFileError, _json_safe, load_pipeline, skops_io

if TYPE_CHECKING:
    from numpy.typing import NDArray

    Values = Sequence[Any] | NDArray[Any]  # labels, groups, scores: a list or an array
    Splits = list[tuple[NDArray[Any], NDArray[Any]]]  # (train, test) index arrays

# Features that learn a corpus's or a model's style rather than the answer's quality: absolute answer length and
# shape (a model family's verbosity), and log-probabilities (absent from the paired training data; a model fitted
# where they are all missing cannot use them). BENCHMARKS.md section 4a measures each feature across corpora.
STYLE_FEATURES = (
    "ans_words",
    "ans_log_chars",
    "ans_numbers",
    "ans_query_len_ratio",
    "ans_logprob_mean",
    "ans_logprob_min",
    "pre_route_probability",
)
TRANSFER_FEATURE_NAMES: list[str] = [
    n
    for n in ANSWER_FEATURE_NAMES
    if n not in STYLE_FEATURES and n not in SUPPORT_FEATURES and n not in PORTABLE_SIGNALS
]
# ... with the answer's support in the passages in embedding space (the answer and its sentences embedded, the chunks
# sent read from the store as ingestion embedded them: gateway.routing.answer_support)
TRANSFER_SUPPORT_FEATURE_NAMES: list[str] = TRANSFER_FEATURE_NAMES + list(SUPPORT_FEATURES)
# Features whose effect on P(good) reverses between L-Eval and LaRA-128k (gain-weighted AUC of the feature alone on
# each corpus, BENCHMARKS.md section 4 "What transfers, round five"): the answer restating the question (0.30 on
# L-Eval, 0.61 on LaRA) and the top retrieval score (0.58, 0.47). They learn a corpus's question and answer style.
SIGN_FLIP_FEATURES = ("ans_query_overlap", "ret_top_score")
# The features that transfer across corpora and model families: TRANSFER_FEATURE_NAMES without the sign-flipping
# ones, with classifier.answer_features.PORTABLE_SIGNALS. Measured with the linear estimator (--estimator logistic):
# boosted trees over the same features transfer worse leaving one model family out.
PORTABLE_FEATURE_NAMES: list[str] = [n for n in TRANSFER_FEATURE_NAMES if n not in SIGN_FLIP_FEATURES] + list(
    PORTABLE_SIGNALS
)
# PORTABLE_FEATURE_NAMES with the answer's support in embedding space (BENCHMARKS.md section 4, "Round six")
PORTABLE_SUPPORT_FEATURE_NAMES: list[str] = PORTABLE_FEATURE_NAMES + list(SUPPORT_FEATURES)
# --features of selfroute train --verifier and eval replay: name -> feature names (None: the policy's verifier's)
FEATURE_SETS: dict[str, list[str]] = {
    "transfer": TRANSFER_FEATURE_NAMES,
    "transfer+support": TRANSFER_SUPPORT_FEATURE_NAMES,
    "portable": PORTABLE_FEATURE_NAMES,
    "portable+support": PORTABLE_SUPPORT_FEATURE_NAMES,
    "all": [n for n in ANSWER_FEATURE_NAMES if n != "pre_route_probability"],
}

DEFAULT_ESTIMATOR: Estimator = "boosting"
DEFAULT_SEED = 0
DEFAULT_FOLDS = 5
# Weight of a tie (rag_score == lc_score) when training with choice-weighted examples.
DEFAULT_TIE_WEIGHT = 0.05
LABEL_RULE = "cheap answer good enough (label 1) when rag_score >= lc_score - margin"


def label_good(rag_score: float, lc_score: float, margin: float = 0.0) -> int:
    """1 when the cheap answer scored at least as well as the long one, within `margin`."""
    return int(float(rag_score) >= float(lc_score) - margin)


def choice_weights(
    rag_scores: Sequence[float], lc_scores: Sequence[float], tie_weight: float = DEFAULT_TIE_WEIGHT
) -> NDArray[Any]:
    """|rag_score - lc_score| per example, floored at tie_weight: how much the escalation decision
    changes the quality score. Ties still count a little (they teach that cheap is enough)."""
    import numpy as np

    diff = np.abs(np.asarray(rag_scores, dtype=float) - np.asarray(lc_scores, dtype=float))
    return np.maximum(diff, tie_weight)


def feature_matrix(rows: list[dict[str, float]], names: Sequence[str]) -> NDArray[Any]:
    import numpy as np

    return np.asarray([[float(r.get(n, MISSING)) for n in names] for r in rows], dtype=float)


@dataclass
class VerifierModel:
    """A fitted pipeline over `feature_names`, with its card and its policy threshold."""

    pipeline: Any
    feature_names: list[str] = field(default_factory=lambda: list(ANSWER_FEATURE_NAMES))
    card: dict[str, Any] = field(default_factory=dict)
    source: str = "<memory>"
    sha256: str | None = None  # of the skops bytes it was loaded from: the model version the ledger records
    # the "monotonic" estimator's: each feature's direction read from the rows it is fitted on (monotone_directions)
    monotone: bool = False

    @property
    def threshold(self) -> float | None:
        """The recommended escalation threshold (escalate when P(good) < threshold), if the card has one."""
        value = self.card.get("threshold")
        return None if value is None else float(value)

    def fit(self, rows: list[dict[str, float]], labels: Values, sample_weight: Values | None = None) -> VerifierModel:
        import numpy as np

        x = feature_matrix(rows, self.feature_names)
        y = np.asarray(labels, dtype=int)
        if len(set(y.tolist())) < 2:
            raise ValueError("the verifier needs both labels (good enough / not); all examples have one")
        w = None if sample_weight is None else np.asarray(sample_weight, dtype=float)
        if self.monotone:
            self.pipeline.set_params(model__monotonic_cst=monotone_directions(x, y, w))
        kwargs = {} if w is None else {"model__sample_weight": w}
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


def new_verifier(estimator: Estimator, names: Sequence[str], seed: int = DEFAULT_SEED) -> VerifierModel:
    """An unfitted verifier over `names` with the estimator's pipeline (classifier.estimators)."""
    return VerifierModel(build_pipeline(estimator, VERIFIER, seed), list(names), monotone=estimator == "monotonic")


def monotone_directions(x: NDArray[Any], y: NDArray[Any], w: NDArray[Any] | None = None) -> list[int]:
    """Per feature column, the direction its effect on P(good) is held to: the sign of its weighted rank correlation
    with the label over the rows where it is present, or 0 (free) where that correlation is within 2/sqrt(n) of
    zero (no clear direction to hold) or the feature is constant."""
    import numpy as np
    from scipy.stats import rankdata

    weights = np.ones(len(y)) if w is None else np.asarray(w, dtype=float)
    out = []
    for column in np.asarray(x, dtype=float).T:
        present = ~np.isnan(column)
        n = int(present.sum())
        if n < 3:
            out.append(0)
            continue
        ranks, labels, wp = rankdata(column[present]), np.asarray(y, dtype=float)[present], weights[present]
        rc, lc = ranks - np.average(ranks, weights=wp), labels - np.average(labels, weights=wp)
        spread = math.sqrt(float(np.sum(wp * rc * rc)) * float(np.sum(wp * lc * lc)))
        r = float(np.sum(wp * rc * lc)) / spread if spread > 0 else 0.0
        out.append(0 if abs(r) <= 2 / math.sqrt(n) else (1 if r > 0 else -1))
    return out


# -- training and out-of-fold scores ------------------------------------------------------------------
def _fit_predict(
    estimator: Estimator,
    seed: int,
    names: Sequence[str],
    rows_train: list[dict[str, float]],
    y_train: NDArray[Any],
    w_train: NDArray[Any] | None,
    rows_test: list[dict[str, float]],
) -> NDArray[Any]:
    import numpy as np

    if len(set(np.asarray(y_train).tolist())) < 2:
        return np.full(len(rows_test), float(np.asarray(y_train)[0]) if len(y_train) else 0.5)
    model = new_verifier(estimator, names, seed)
    model.fit(rows_train, y_train, w_train)
    return np.asarray(model.scores(rows_test))


def _oof(
    rows: list[dict[str, float]],
    labels: Values,
    splits: Sequence[tuple[Any, Any]],
    estimator: Estimator,
    seed: int,
    names: Sequence[str],
    sample_weight: Values | None,
) -> NDArray[Any]:
    import numpy as np

    y = np.asarray(labels, dtype=int)
    w = None if sample_weight is None else np.asarray(sample_weight, dtype=float)
    oof = np.full(len(y), np.nan)
    for train_idx, test_idx in splits:
        oof[test_idx] = _fit_predict(
            estimator,
            seed,
            names,
            [rows[i] for i in train_idx],
            y[train_idx],
            None if w is None else w[train_idx],
            [rows[i] for i in test_idx],
        )
    return oof


def grouped_splits(labels: Values, groups: Values, n_splits: int = DEFAULT_FOLDS, seed: int = DEFAULT_SEED) -> Splits:
    """(train, test) index pairs with every group wholly in one test fold (classifier.training's folds)."""
    from classifier.training import grouped_folds

    return grouped_folds(labels, groups, n_splits, seed)


def leave_one_group_out_splits(groups: Values) -> Splits:
    """(train, test) index pairs, one per distinct group (e.g. task): train on the others, test on it."""
    import numpy as np

    groups = np.asarray(groups)
    out = []
    for g in sorted(set(groups.tolist())):
        test = np.flatnonzero(groups == g)
        train = np.flatnonzero(groups != g)
        out.append((train, test))
    return out


PROTOCOLS = ("grouped", "loto", "corpus", "model")
PROTOCOL_NAMES = {
    "grouped": "grouped k-fold by document",
    "loto": "leave one task out",
    "corpus": "leave one corpus out",
    "model": "leave one model family out (and its documents' fold)",
}


@dataclass(frozen=True)
class Split:
    """One refit: fit on `train`, score `test`; `unit` names what is held out (a task, corpus, model, or fold)."""

    train: Any
    test: Any
    unit: str


def protocol_splits(
    protocol: str,
    labels: Values,
    groups: Values,
    *,
    tasks: Values | None = None,
    corpora: Values | None = None,
    models: Values | None = None,
    n_splits: int = DEFAULT_FOLDS,
    seed: int = DEFAULT_SEED,
) -> list[Split]:
    """The refits of an out-of-fold protocol; every example lies in exactly one test part.

    - grouped: k folds by `groups` (documents); units "fold-1".."fold-k";
    - loto: leave one task out (`tasks`);
    - corpus: leave one corpus out (`corpora`): fit on the other corpora, score this one;
    - model: leave one model family out (`models`) AND its documents: the held-out model's answers in document
      fold j are scored by a verifier fitted on the other models' answers to documents outside fold j, so
      neither the model nor the document was seen (a model's sibling answers to the same question would
      otherwise teach the verifier that question)."""
    import numpy as np

    n = len(labels)
    if protocol == "grouped":
        return [
            Split(tr, te, f"fold-{k + 1}") for k, (tr, te) in enumerate(grouped_splits(labels, groups, n_splits, seed))
        ]
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; choose one of {', '.join(PROTOCOLS)}")
    keys = {"loto": tasks, "corpus": corpora, "model": models}[protocol]
    what, plural = {
        "loto": ("task", "tasks"),
        "corpus": ("corpus", "corpora (several --data files)"),
        "model": ("model", "model families"),
    }[protocol]
    if keys is None or len(set(keys)) < 2:
        raise ValueError(f"--protocol {protocol} needs a `{what}` field with at least two {plural}")
    keys = np.asarray([str(k) for k in keys])
    if protocol != "model":
        return [
            Split(tr, te, str(unit))
            for unit, (tr, te) in zip(sorted(set(keys.tolist())), leave_one_group_out_splits(keys))
        ]
    folds = np.zeros(n, dtype=int)
    for k, (_, test) in enumerate(grouped_splits(labels, groups, n_splits, seed)):
        folds[test] = k
    out = []
    for unit in sorted(set(keys.tolist())):
        for k in sorted(set(folds.tolist())):
            test = np.flatnonzero((keys == unit) & (folds == k))
            train = np.flatnonzero((keys != unit) & (folds != k))
            if len(test):
                out.append(Split(train, test, unit))
    return out


def split_units(splits: Sequence[Split], n: int) -> list[str]:
    """The held-out unit of every example under these splits."""
    units = [""] * n
    for split in splits:
        for i in split.test:
            units[int(i)] = split.unit
    return units


def protocol_scores(
    rows: list[dict[str, float]],
    labels: Values,
    splits: Sequence[Split],
    *,
    estimator: Estimator = DEFAULT_ESTIMATOR,
    seed: int = DEFAULT_SEED,
    feature_names: Sequence[str] = ANSWER_FEATURE_NAMES,
    sample_weight: Values | None = None,
) -> NDArray[Any]:
    """P(good) for every example from the verifier of the split that holds it out (protocol_splits)."""
    return _oof(rows, labels, [(s.train, s.test) for s in splits], estimator, seed, feature_names, sample_weight)


def out_of_fold_scores(
    rows: list[dict[str, float]],
    labels: Values,
    groups: Values,
    *,
    estimator: Estimator = DEFAULT_ESTIMATOR,
    n_splits: int = DEFAULT_FOLDS,
    seed: int = DEFAULT_SEED,
    feature_names: Sequence[str] = ANSWER_FEATURE_NAMES,
    sample_weight: Values | None = None,
) -> NDArray[Any]:
    """P(good) for every example from a verifier that never saw its group (document), grouped k-fold."""
    return _oof(
        rows, labels, grouped_splits(labels, groups, n_splits, seed), estimator, seed, feature_names, sample_weight
    )


def leave_one_group_out_scores(
    rows: list[dict[str, float]],
    labels: Values,
    groups: Values,
    *,
    estimator: Estimator = DEFAULT_ESTIMATOR,
    seed: int = DEFAULT_SEED,
    feature_names: Sequence[str] = ANSWER_FEATURE_NAMES,
    sample_weight: Values | None = None,
) -> NDArray[Any]:
    """P(good) for every example from a verifier trained on the other groups only (e.g. leave one task out)."""
    return _oof(rows, labels, leave_one_group_out_splits(groups), estimator, seed, feature_names, sample_weight)


def threshold_for_escalation_share(scores: Values, share: float) -> float:
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


def classification_metrics(labels: Values, scores: Values) -> dict[str, float | None]:
    from classifier.training import classification_metrics as metrics

    return metrics(labels, scores)


@dataclass
class VerifierTrainingResult:
    model: VerifierModel
    cv_metrics: dict[str, Any]
    oof_scores: list[float]


def train_verifier(
    rows: list[dict[str, float]],
    labels: Values,
    groups: Values,
    *,
    estimator: Estimator = DEFAULT_ESTIMATOR,
    feature_names: Sequence[str] = ANSWER_FEATURE_NAMES,
    sample_weight: Values | None = None,
    n_splits: int = DEFAULT_FOLDS,
    seed: int = DEFAULT_SEED,
    escalation_share: float | None = None,
    card: dict[str, Any] | None = None,
) -> VerifierTrainingResult:
    """Cross-validate grouped by `groups` (documents), then fit on everything.

    With `escalation_share`, the card's `threshold` is the quantile of the out-of-fold scores that
    escalates that share of answers (the policy threshold to ship with the model)."""
    import numpy as np

    y = np.asarray(labels, dtype=int)
    if len(set(y.tolist())) < 2:
        raise ValueError("the verifier needs both labels (good enough / not); all examples have one")
    oof = out_of_fold_scores(
        rows,
        y,
        groups,
        estimator=estimator,
        n_splits=n_splits,
        seed=seed,
        feature_names=feature_names,
        sample_weight=sample_weight,
    )
    metrics = classification_metrics(y, oof)
    metrics.update(
        n_groups=len(set(groups)),
        n_splits=min(n_splits, len(set(groups))),
        seed=seed,
        weighted=sample_weight is not None,
    )
    model = new_verifier(estimator, feature_names, seed)
    model.fit(rows, y, sample_weight)
    model.card = {
        "predicts": "P(the cheap route's answer is good enough): rag_score >= lc_score - margin",
        "estimator": estimator,
        "feature_names": list(feature_names),
        "label_rule": LABEL_RULE,
        "cv_metrics_grouped": metrics,
        **(card or {}),
    }
    if model.monotone:  # the directions held, as read from the training rows (+1: more of it, more P(good))
        directions = model.pipeline.get_params()["model__monotonic_cst"]
        model.card["monotone_directions"] = dict(zip(model.feature_names, (int(d) for d in directions), strict=True))
    if escalation_share is not None:
        model.card["threshold"] = threshold_for_escalation_share(oof, escalation_share)
        model.card["threshold_source"] = f"quantile of out-of-fold P(good) escalating {escalation_share:.0%}"
    return VerifierTrainingResult(model=model, cv_metrics=metrics, oof_scores=[float(p) for p in oof])


# -- (de)serialisation ----------------------------------------------------------------------------------
def verifier_to_bytes(model: VerifierModel) -> tuple[bytes, str]:
    """The skops bytes of the pipeline and the JSON text of its card (feature names included)."""
    import zipfile

    sio = skops_io()
    data = sio.dumps(model.pipeline, compression=zipfile.ZIP_DEFLATED, compresslevel=9)
    card = dict(model.card)
    card["feature_names"] = list(model.feature_names)
    return data, json.dumps(_json_safe(card), indent=2, sort_keys=True) + "\n"


def verifier_from_bytes(
    data: bytes, card: dict[str, Any] | str | None = None, source: str = "<memory>", lean: bool = False
) -> VerifierModel:
    """A verifier from skops bytes and its card (dict or JSON text). Refuses types outside
    classifier.model.TRUSTED_TYPES, and a card whose features this version does not compute. `lean`: see
    classifier.model.load_pipeline."""
    parsed: dict[str, Any] | None = json.loads(card) if isinstance(card, str) else card
    meta = dict(parsed or {})
    pipeline = load_pipeline(data, source, lean)
    names = list(meta.get("feature_names") or ANSWER_FEATURE_NAMES)
    known = set(ANSWER_FEATURE_NAMES) | _pre_route_names()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ModelFileError(f"{source}: verifier uses features this version does not compute: {unknown}")
    n_in = getattr(pipeline, "n_features_in_", len(names))
    if n_in != len(names):
        raise ModelFileError(f"{source}: verifier expects {n_in} features, its card names {len(names)}")
    return VerifierModel(
        pipeline=pipeline, feature_names=names, card=meta, source=source, sha256=hashlib.sha256(data).hexdigest()
    )


def _pre_route_names() -> set[str]:
    from classifier.features import FEATURE_NAMES

    return set(FEATURE_NAMES)


# -- what transfers: permutation importance under a protocol -------------------------------------------
def gain_auc(rag: Values, lc: Values, scores: Values) -> float | None:
    """ROC AUC of P(good) for "the cheap answer is at least as good", over the answers where the routes' scores
    differ, each weighted by |rag - lc| (0.5: no signal)."""
    import numpy as np
    from sklearn.metrics import roc_auc_score

    rag, lc, scores = (np.asarray(v, float) for v in (rag, lc, scores))
    keep = rag != lc
    y = (rag >= lc)[keep]
    if len(set(y.tolist())) < 2:
        return None
    return float(roc_auc_score(y, scores[keep], sample_weight=np.abs(rag - lc)[keep]))


def escalation_gain_points(rag: Values, lc: Values, scores: Values, share: float = 0.25) -> float:
    """Quality (points) of escalating the `share` of answers with the lowest P(good) minus escalating a random
    share of the same size (its exact expectation)."""
    import numpy as np

    rag, lc, scores = (np.asarray(v, float) for v in (rag, lc, scores))
    k = int(round(share * len(rag)))
    gain = lc - rag
    order = np.argsort(scores, kind="stable")
    return float(100 * (gain[order[:k]].sum() - k * gain.mean()) / len(rag))


def permutation_importance(
    rows: list[dict[str, float]],
    labels: Values,
    rag: Values,
    lc: Values,
    splits: Sequence[Split],
    units: Sequence[str],
    *,
    feature_names: Sequence[str],
    estimator: Estimator = DEFAULT_ESTIMATOR,
    seed: int = DEFAULT_SEED,
    sample_weight: Values | None = None,
    share: float = 0.25,
) -> list[tuple[str, dict[str, float]]]:
    """Per feature, the loss in gain-weighted AUC and in the escalation gain over random (points at `share`) on the
    held-out units when that feature is shuffled within each split's test part, the split's model fitted once on
    its training part. Mean over units; largest AUC loss first. A feature that helps in the units it was trained
    on but carries a corpus's or model's style shows a loss near zero or negative here."""
    import numpy as np

    names = list(feature_names)
    x = feature_matrix(rows, names)
    y = np.asarray(labels, dtype=int)
    w = None if sample_weight is None else np.asarray(sample_weight, float)
    rng = np.random.default_rng(seed)
    fitted = []
    for s in splits:
        if len(set(y[s.train].tolist())) < 2:
            continue
        model = new_verifier(estimator, names, seed)
        model.fit([rows[i] for i in s.train], y[s.train], None if w is None else w[s.train])
        fitted.append((s, model))
    unit_array = np.asarray(units)
    unit_names = sorted(set(unit_array.tolist()))

    def proba(model: VerifierModel, matrix: NDArray[Any]) -> NDArray[Any]:
        classes = list(model.pipeline.classes_)
        return model.pipeline.predict_proba(matrix)[:, classes.index(1)]

    def metrics(column: int | None) -> tuple[float, float]:
        scores = np.full(len(y), np.nan)
        for s, model in fitted:
            part = x[s.test].copy()
            if column is not None:
                part[:, column] = rng.permutation(part[:, column])
            scores[s.test] = proba(model, part)
        aucs, gains = [], []
        for u in unit_names:
            idx = np.flatnonzero((unit_array == u) & ~np.isnan(scores))
            if len(idx) == 0:
                continue
            a = gain_auc(np.asarray(rag)[idx], np.asarray(lc)[idx], scores[idx])
            if a is not None:
                aucs.append(a)
            gains.append(escalation_gain_points(np.asarray(rag)[idx], np.asarray(lc)[idx], scores[idx], share))
        return float(np.mean(aucs)) if aucs else math.nan, float(np.mean(gains)) if gains else math.nan

    base_auc, base_gain = metrics(None)
    out = []
    for j, name in enumerate(names):
        auc, gain = metrics(j)
        out.append((name, {"auc": base_auc - auc, "transfer": base_gain - gain}))
    out.sort(key=lambda item: -item[1]["auc"])
    return [("(none shuffled: the scores)", {"auc": base_auc, "transfer": base_gain}), *out]
