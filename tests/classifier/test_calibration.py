import numpy as np
import pytest

from classifier.calibration import calibrate_threshold, long_share
from classifier.estimators import PRE_ROUTE, build_pipeline
from classifier.training import feature_matrix, out_of_fold_probabilities
from tests.support.classifier import synthetic_rows


@pytest.mark.parametrize("share", [0.0, 0.1, 0.3, 0.5, 0.95, 1.0])
def test_exact_share_on_distinct_probabilities(share):
    probabilities = [i / 200 for i in range(200)]
    threshold = calibrate_threshold(probabilities, share)
    assert long_share(probabilities, threshold) == pytest.approx(share, abs=1 / 200)
    assert 0.0 <= threshold <= 1.0


def test_deterministic_and_order_free():
    rng = np.random.default_rng(3)
    p = rng.random(101).tolist()
    assert calibrate_threshold(p, 0.3) == calibrate_threshold(list(reversed(p)), 0.3)


def test_ties_go_the_same_way_and_bad_input_is_refused():
    assert long_share([0.5] * 10, calibrate_threshold([0.5] * 10, 0.3)) in (0.0, 1.0)
    with pytest.raises(ValueError):
        calibrate_threshold([0.1], 1.5)
    with pytest.raises(ValueError):
        calibrate_threshold([], 0.3)


def test_target_share_holds_on_data_the_model_was_not_fitted_on():
    """Fit on one set of documents, calibrate on out-of-fold predictions for a second set, and check
    the share routed long on a third, unseen set. Tolerance 0.05: with 1,500 test and 1,500 calibration
    questions the sampling error of a 30% share is about 0.012 on each side (sqrt(.3*.7/1500)), and
    documents, not questions, are the sampling unit (10 questions each), which widens it roughly two-
    to threefold; 0.05 is about two of those combined standard errors."""
    rows, labels, groups = synthetic_rows(n_docs=450, per_doc=10, seed=1)
    fit, calib, test = slice(0, 1500), slice(1500, 3000), slice(3000, 4500)
    model = build_pipeline("logistic", PRE_ROUTE).fit(feature_matrix(rows[fit]), labels[fit])
    calibration_p = model.predict_proba(feature_matrix(rows[calib]))[:, 1]
    threshold = calibrate_threshold(calibration_p.tolist(), 0.3)
    test_p = model.predict_proba(feature_matrix(rows[test]))[:, 1]
    assert long_share(test_p.tolist(), threshold) == pytest.approx(0.3, abs=0.05)
    # the out-of-fold route gives a threshold that holds too
    oof = out_of_fold_probabilities(rows[fit], labels[fit], groups[fit], "logistic", 5, 0)
    oof_threshold = calibrate_threshold(oof.tolist(), 0.3)
    assert long_share(test_p.tolist(), oof_threshold) == pytest.approx(0.3, abs=0.05)
