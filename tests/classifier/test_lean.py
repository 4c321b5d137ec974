"""classifier.lean: the shipped pipeline shapes scored without scikit-learn give exactly sklearn's probabilities."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import numpy as np
import pytest

from classifier.estimators import PRE_ROUTE, VERIFIER, build_pipeline
from classifier.lean import LeanPipeline, expit, read_lean
from classifier.model import ModelFileError, load_pipeline, load_trusted, skops_io
from gateway.routing.model_files import builtin_model_path


def rows(n: int, width: int, seed: int, missing: float = 0.2) -> np.ndarray:
    """Features on very different scales (counts, shares, log sizes), some missing, some exactly at zero."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 3, (n, width)) * rng.choice([0.01, 1.0, 100.0, 1e4], (n, width))
    x[rng.random((n, width)) < 0.1] = 0.0
    x[rng.random((n, width)) < missing] = np.nan
    return x


def dumps(pipeline) -> bytes:
    return skops_io().dumps(pipeline, compression=zipfile.ZIP_DEFLATED)


def assert_exact(data: bytes, x: np.ndarray, single: int = 30) -> None:
    lean, full = read_lean(data), load_trusted(data, "test")
    assert isinstance(lean, LeanPipeline)
    assert lean.classes_ == list(full.classes_) and lean.n_features_in_ == full.n_features_in_
    expected, got = full.predict_proba(x), lean.predict_proba(x)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert np.array_equal(got, expected)  # the same floats, not close ones
    for i in range(single):  # a gateway scores one row per request
        assert np.array_equal(lean.predict_proba(x[i : i + 1]), full.predict_proba(x[i : i + 1]))


@pytest.mark.parametrize("name", ["default", "verifier"])
def test_the_shipped_models_score_exactly_as_sklearn(name):
    data = builtin_model_path(name).read_bytes()
    width = load_trusted(data, name).n_features_in_
    assert_exact(data, rows(5_000, width, seed=1))
    assert_exact(data, rows(2_000, width, seed=2, missing=0.0))
    assert_exact(data, rows(2_000, width, seed=3, missing=0.9))


@pytest.mark.parametrize(
    "estimator,settings", [("logistic", VERIFIER), ("boosting", PRE_ROUTE), ("boosting", VERIFIER)]
)
def test_freshly_trained_pipelines_score_exactly_as_sklearn(estimator, settings):
    rng = np.random.default_rng(7)
    x = rows(3_000, 12, seed=4)
    x[:, 5] = np.nan  # a feature never seen in training: keep_empty_features fills it with 0
    logit = np.nan_to_num(x[:, 0]) * 0.01 - np.nan_to_num(x[:, 1]) * 0.3 + np.isnan(x[:, 2])
    y = (logit + rng.normal(0, 1, len(logit)) > 0).astype(int)
    pipeline = build_pipeline(estimator, settings, seed=0).fit(x, y)
    assert_exact(dumps(pipeline), rows(2_000, 12, seed=5))


def test_other_shapes_load_through_skops():
    from sklearn.preprocessing import StandardScaler

    x = rows(500, 6, seed=6)
    y = (np.nan_to_num(x[:, 0]) > 0).astype(int)
    pipeline = build_pipeline("boosting", PRE_ROUTE)
    pipeline.steps.insert(1, ("scale", StandardScaler()))  # imputer -> scaler -> boosting: not a shipped shape
    data = dumps(pipeline.fit(x, y))
    assert read_lean(data) is None
    loaded = load_pipeline(data, "test", lean=True)
    assert not isinstance(loaded, LeanPipeline)
    assert np.array_equal(loaded.predict_proba(x), pipeline.predict_proba(x))
    assert read_lean(b"not a zip") is None
    with pytest.raises(ModelFileError, match="not a readable skops file"):
        load_pipeline(b"not a zip", "test", lean=True)


def test_infinite_features_are_refused_as_sklearn_refuses_them():
    data = builtin_model_path("verifier").read_bytes()
    lean, full = read_lean(data), load_trusted(data, "verifier")
    x = rows(3, full.n_features_in_, seed=8)
    x[1, 4] = np.inf
    with pytest.raises(ValueError, match="infinity"):
        full.predict_proba(x)
    with pytest.raises(ValueError, match="infinity"):
        lean.predict_proba(x)


def test_expit_is_scipys():
    from scipy.special import expit as scipy_expit

    x = np.concatenate([np.random.default_rng(9).normal(0, 4, 200_000), [-800.0, -745.2, -709.9, 0.0, 40.0, 800.0]])
    assert np.array_equal(np.array([expit(float(v)) for v in x]), scipy_expit(x))


def test_a_serving_gateway_loads_both_models_without_sklearn():
    """What `serve` and the app's start-up load (check_policy_files, load_*_model(lean=True)) imports no sklearn,
    SciPy or skops, and scores as the skops-loaded models do."""
    code = """
import sys
from pathlib import Path
from gateway.routing.model_files import check_policy_files, load_route_model, load_verifier_model
from policies.loader import load_policy
policy, path = load_policy(Path("policies/default.yaml"))
assert check_policy_files(policy, path) == []
model, verifier = load_route_model(policy, path, lean=True), load_verifier_model(policy, path, lean=True)
print(model.cheap_probability({}), verifier.score({}))
print(sorted(m for m in ("sklearn", "scipy", "skops") if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lean_scores, imported = out.stdout.strip().splitlines()
    assert imported == "[]"
    from gateway.routing.model_files import load_model, load_verifier

    full = f"{load_model(builtin_model_path('default')).cheap_probability({})} "
    full += f"{load_verifier(builtin_model_path('verifier')).score({})}"
    assert lean_scores == full


def test_a_monotonic_verifier_scores_exactly_as_sklearn():
    """The "monotonic" estimator's trees (directions held by monotonic_cst) are read and walked like any others."""
    from classifier.verifier import new_verifier

    rng = np.random.default_rng(8)
    x = rows(3_000, 6, seed=9)
    y = (np.nan_to_num(x[:, 0]) - np.nan_to_num(x[:, 1]) + rng.normal(0, 50, len(x)) > 0).astype(int)
    names = [f"f{i}" for i in range(6)]
    model = new_verifier("monotonic", names).fit([dict(zip(names, r)) for r in x.tolist()], y)
    assert list(model.pipeline.get_params()["model__monotonic_cst"])[:2] == [1, -1]
    assert_exact(dumps(model.pipeline), rows(2_000, 6, seed=10))
