import numpy as np
import pytest

from classifier.training import (
    data_hash,
    grouped_folds,
    label_from_scores,
    model_card,
    out_of_fold_probabilities,
    train,
)
from tests.support.classifier import synthetic_rows


def test_label_rule_ties_go_cheap_and_margin_widens():
    assert label_from_scores(0.5, 0.5) == 1
    assert label_from_scores(0.4, 0.5) == 0
    assert label_from_scores(0.45, 0.5, margin=0.1) == 1
    assert label_from_scores(1.0, 0.0) == 1


def test_folds_never_split_a_document():
    _, labels, groups = synthetic_rows(n_docs=12, per_doc=5)
    folds = grouped_folds(labels, groups, n_splits=5, seed=0)
    assert len(folds) == 5
    groups = np.asarray(groups)
    for train_idx, test_idx in folds:
        assert not set(groups[train_idx]) & set(groups[test_idx])
    covered = np.sort(np.concatenate([test for _, test in folds]))
    assert covered.tolist() == list(range(len(labels)))
    assert [t.tolist() for _, t in grouped_folds(labels, groups, 5, 0)] == [t.tolist() for _, t in folds]


@pytest.mark.parametrize("estimator", ["logistic", "boosting"])
def test_training_learns_the_signal_out_of_fold(estimator):
    rows, labels, groups = synthetic_rows()
    result = train(rows, labels, groups, estimator=estimator, n_splits=5, seed=0)
    metrics = result.cv_metrics
    assert metrics["roc_auc"] > 0.8  # the signal is strong; 10% label noise caps it below 1
    assert metrics["brier"] < metrics["brier_base_rate"]
    assert metrics["n"] == len(rows) and metrics["n_documents"] == 40
    assert len(result.oof_probabilities) == len(rows)
    oof_again = out_of_fold_probabilities(rows, labels, groups, estimator, 5, 0)
    assert np.allclose(oof_again, result.oof_probabilities)  # fixed seed: deterministic


def test_training_refuses_a_single_label():
    rows, _, groups = synthetic_rows(n_docs=4, per_doc=3)
    with pytest.raises(ValueError, match="both labels"):
        train(rows, [1] * len(rows), groups)


def test_card_and_data_hash():
    rows, labels, groups = synthetic_rows(n_docs=6, per_doc=6)
    result = train(rows, labels, groups, n_splits=3)
    records = [{"q": i, "label": y} for i, y in enumerate(labels)]
    digest = data_hash(records)
    assert digest == data_hash(list(records)) and digest.startswith("sha256:")
    assert digest != data_hash(records[::-1])
    card = model_card(result, estimator="logistic", data_sha=digest, label_rule="r", command="selfroute train")
    assert card["feature_names"][0] == "query_words"
    assert card["cv_metrics_grouped_by_document"]["n_splits"] == 3
    assert "scikit-learn" in card["library_versions"]
