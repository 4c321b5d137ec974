"""The shipped model shapes scored without scikit-learn: read from the skops file's arrays, exact to sklearn.

A serving gateway scores one row per request with the routing classifier (SimpleImputer -> HistGradientBoosting)
and the answer verifier (SimpleImputer -> StandardScaler -> LogisticRegression). Loading them through skops imports
scikit-learn, SciPy and skops (~95 MB resident, BENCHMARKS.md section 2, round six) for what is a median fill, a
standardisation, a dot product and 60 shallow trees. `read_lean` reads a skops file's zip directly, its
`schema.json` and the `.npy` arrays it names (`numpy.load(allow_pickle=False)`: nothing in the file is executed or
imported), and builds a scorer only when the file is exactly one of these pipelines with the attributes it needs;
anything else returns None and loads through skops as before (classifier.model.load_trusted).

The arithmetic follows sklearn 1.9's own, operation for operation, so that P(...) is the same float, not merely
close (tests/classifier/test_lean.py compares them with == on many rows, missing values included):
- SimpleImputer (missing NaN, keep_empty_features): a NaN is replaced by its column's `statistics_`;
- StandardScaler: `x -= mean_; x /= scale_` (elementwise, exact in IEEE arithmetic);
- LogisticRegression (binary): `x @ coef_.T + intercept_` with numpy's matmul on the same shapes and layouts as
  sklearn's safe_sparse_dot (the same BLAS call, so the same sum), then expit;
- HistGradientBoostingClassifier (binary, numeric features): baseline + each tree's leaf value, added in the
  order of `_predictors` (sklearn's `raw_predictions[:, k] += predict(X)`), the tree walked as its Cython
  predictor walks it (NaN by missing_go_to_left, else `x <= num_threshold` goes left), then expit;
- expit as SciPy computes it, 1 / (1 + exp(-x)) with the C library's exp (math.exp is that exp).
"""

from __future__ import annotations

import io
import json
import math
import zipfile
from typing import Any

import numpy as np

IMPUTER = ("sklearn.impute._base", "SimpleImputer")
SCALER = ("sklearn.preprocessing._data", "StandardScaler")
LOGISTIC = ("sklearn.linear_model._logistic", "LogisticRegression")
BOOSTING = ("sklearn.ensemble._hist_gradient_boosting.gradient_boosting", "HistGradientBoostingClassifier")
PREDICTOR = ("sklearn.ensemble._hist_gradient_boosting.predictor", "TreePredictor")
BINOMIAL = ("sklearn._loss.loss", "HalfBinomialLoss")


class _Unsupported(Exception):
    """The file is not one of the shapes read here (it loads through skops instead)."""


def expit(x: float) -> float:
    """SciPy's expit: 1 / (1 + exp(-x)); exp(-x) past the float range is inf, so the result is 0.0."""
    try:
        return 1.0 / (1.0 + math.exp(-x))
    except OverflowError:
        return 0.0


class _Schema:
    """Values out of a skops schema: JSON nodes, arrays from the zip, containers, objects as (module, class,
    attributes); shared objects (skops writes a repeat as a CachedNode naming the first one's __id__)."""

    def __init__(self, archive: zipfile.ZipFile):
        self.archive = archive
        self.seen: dict[int, Any] = {}

    def value(self, node: dict[str, Any]) -> Any:
        loader = node.get("__loader__")
        if loader == "CachedNode":
            if node.get("__id__") not in self.seen:
                raise _Unsupported("a cached node before its first use")
            return self.seen[node["__id__"]]
        if loader == "JsonNode":
            out: Any = json.loads(node["content"])
        elif loader == "NdArrayNode" and node.get("type") == "numpy":
            with self.archive.open(node["file"]) as f:
                out = np.load(io.BytesIO(f.read()), allow_pickle=False)
        elif loader in ("ListNode", "TupleNode"):
            out = [self.value(n) for n in node["content"]]
        elif loader == "DictNode":
            keys = node["content"]
            out = {k: self.value(v) for k, v in keys.items()}
        elif loader == "ObjectNode":
            attributes = node["content"]
            if attributes.get("__loader__") != "DictNode":
                raise _Unsupported(f"{node.get('__class__')}: state that is not a dict")
            out = ((node["__module__"], node["__class__"]), _Lazy(self, attributes["content"]))
        else:  # functions, dtypes, methods, reducers...: read only where a shape below asks for them
            out = ("unread", loader)
        if "__id__" in node:
            self.seen[node["__id__"]] = out
        return out


class _Lazy:
    """An object's attributes, read one by one when asked (most of a fitted estimator's state is not needed)."""

    def __init__(self, schema: _Schema, nodes: dict[str, Any]):
        self.schema, self.nodes = schema, nodes

    def __getitem__(self, name: str) -> Any:
        if name not in self.nodes:
            raise _Unsupported(f"no attribute {name}")
        return self.schema.value(self.nodes[name])

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self.nodes else default


def _object(value: Any, kind: tuple[str, str]) -> _Lazy:
    if not (isinstance(value, tuple) and len(value) == 2 and value[0] == kind):
        raise _Unsupported(f"expected {kind[1]}, found {value[0] if isinstance(value, tuple) else type(value)}")
    return value[1]


def _floats(array: Any, shape: tuple[int, ...] | None = None) -> np.ndarray:
    if not isinstance(array, np.ndarray) or array.dtype != np.float64:
        raise _Unsupported("an array that is not float64")
    if shape is not None and array.shape != shape:
        raise _Unsupported(f"an array of shape {array.shape}, expected {shape}")
    return np.ascontiguousarray(array)


class _Imputer:
    def __init__(self, state: _Lazy, n_features: int):
        missing = state["missing_values"]
        if (
            not (isinstance(missing, float) and math.isnan(missing))
            or state["strategy"] not in ("median", "mean")
            or state["add_indicator"] is not False
            or state["keep_empty_features"] is not True
            or state["n_features_in_"] != n_features
        ):
            raise _Unsupported("an imputer other than the shipped one")
        self.statistics = _floats(state["statistics_"], (n_features,))

    def transform(self, x: np.ndarray) -> np.ndarray:
        if np.isinf(x).any():  # sklearn's check: missing values may be NaN, never infinite
            raise ValueError("Input X contains infinity or a value too large for dtype('float64').")
        x = x.copy()
        missing = np.isnan(x)
        if missing.any():
            x[missing] = np.broadcast_to(self.statistics, x.shape)[missing]
        return x


class _Scaler:
    def __init__(self, state: _Lazy, n_features: int):
        if state["with_mean"] is not True or state["with_std"] is not True or state["n_features_in_"] != n_features:
            raise _Unsupported("a scaler other than the shipped one")
        self.mean = _floats(state["mean_"], (n_features,))
        self.scale = _floats(state["scale_"], (n_features,))

    def transform(self, x: np.ndarray) -> np.ndarray:
        x -= self.mean
        x /= self.scale
        return x


def _classes(state: _Lazy) -> list[int]:
    classes = state["classes_"]
    if not isinstance(classes, np.ndarray) or classes.dtype.kind not in "iu" or sorted(classes.tolist()) != [0, 1]:
        raise _Unsupported("classes other than 0 and 1")
    return [int(c) for c in classes.tolist()]


class _Logistic:
    def __init__(self, state: _Lazy, n_features: int):
        if state["n_features_in_"] != n_features:
            raise _Unsupported("a logistic model of another width")
        self.classes_ = _classes(state)
        self.coef = _floats(state["coef_"], (1, n_features))
        self.intercept = _floats(state["intercept_"], (1,))

    def positive(self, x: np.ndarray) -> list[float]:
        # sklearn's decision_function: safe_sparse_dot(X, coef_.T) + intercept_, a (n, 1) array, reshaped
        decision = (x @ self.coef.T + self.intercept).reshape(-1)
        return [expit(float(v)) for v in decision]


class _Boosting:
    def __init__(self, state: _Lazy, n_features: int):
        if (
            state["n_features_in_"] != n_features
            or state["n_trees_per_iteration_"] != 1
            or state.get("is_categorical_") is not None
            or state.get("_preprocessor") is not None
        ):
            raise _Unsupported("boosting other than binary over numeric features")
        _object(state["_loss"], BINOMIAL)
        self.classes_ = _classes(state)
        baseline = _floats(state["_baseline_prediction"])
        if baseline.shape not in ((1,), (1, 1)):
            raise _Unsupported("a baseline of another shape")
        self.baseline = float(baseline.reshape(-1)[0])
        self.trees = []
        for iteration in state["_predictors"]:
            if not isinstance(iteration, list) or len(iteration) != 1:
                raise _Unsupported("an iteration of more than one tree")
            nodes = _object(iteration[0], PREDICTOR)["nodes"]
            if not isinstance(nodes, np.ndarray) or nodes.dtype.names is None:
                raise _Unsupported("tree nodes that are not a record array")
            if nodes["is_categorical"].any():
                raise _Unsupported("a categorical split")
            self.trees.append(
                list(
                    zip(
                        nodes["is_leaf"].astype(bool).tolist(),
                        nodes["value"].astype(np.float64).tolist(),
                        nodes["feature_idx"].tolist(),
                        nodes["num_threshold"].astype(np.float64).tolist(),
                        nodes["missing_go_to_left"].astype(bool).tolist(),
                        nodes["left"].tolist(),
                        nodes["right"].tolist(),
                    )
                )
            )
        if any(f >= n_features for tree in self.trees for leaf, _, f, *_ in tree if not leaf):
            raise _Unsupported("a split on a feature the model does not take")

    def positive(self, x: np.ndarray) -> list[float]:
        out = []
        for row in x.tolist():
            raw = 0.0 + self.baseline  # np.zeros(...) += baseline
            for tree in self.trees:
                node = tree[0]
                while not node[0]:
                    value = row[node[2]]
                    if value != value:  # NaN
                        node = tree[node[5] if node[4] else node[6]]
                    else:
                        node = tree[node[5] if value <= node[3] else node[6]]
                raw += node[1]
            out.append(expit(raw))
        return out


class LeanPipeline:
    """The part of a fitted sklearn Pipeline a gateway uses: `classes_`, `n_features_in_`, `predict_proba`."""

    def __init__(self, steps: list[Any], model: _Logistic | _Boosting, n_features: int):
        self.steps, self.model, self.n_features_in_ = steps, model, n_features
        self.classes_ = model.classes_

    def predict_proba(self, x: Any) -> np.ndarray:
        matrix = np.array(x, dtype=np.float64)  # a C-ordered copy, as sklearn's validation makes
        if matrix.ndim != 2 or matrix.shape[1] != self.n_features_in_:
            raise ValueError(f"expected rows of {self.n_features_in_} features, got shape {matrix.shape}")
        for step in self.steps:
            matrix = step.transform(matrix)
        positive = np.asarray(self.model.positive(matrix), dtype=np.float64)
        proba = np.empty((len(positive), 2), dtype=np.float64)
        one = self.classes_.index(1)
        proba[:, one] = positive
        proba[:, 1 - one] = 1 - positive
        return proba


def read_lean(data: bytes) -> LeanPipeline | None:
    """The shipped shapes of a skops file's pipeline as a LeanPipeline, or None (load it through skops)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            schema = _Schema(archive)
            root = json.loads(archive.read("schema.json"))
            if root.get("__module__") != "sklearn.pipeline" or root.get("__class__") != "Pipeline":
                return None
            state = _Lazy(schema, root["content"]["content"])
            steps = state["steps"]
            if state.get("memory") is not None or not isinstance(steps, list):
                return None
            objects = []
            for step in steps:
                if not (isinstance(step, list) and len(step) == 2 and isinstance(step[1], tuple)):
                    return None
                objects.append(step[1])
            kinds = [kind for kind, _ in objects]
            if kinds == [IMPUTER, SCALER, LOGISTIC]:
                n = objects[0][1]["n_features_in_"]
                return LeanPipeline(
                    [_Imputer(objects[0][1], n), _Scaler(objects[1][1], n)], _Logistic(objects[2][1], n), n
                )
            if kinds == [IMPUTER, BOOSTING]:
                n = objects[0][1]["n_features_in_"]
                return LeanPipeline([_Imputer(objects[0][1], n)], _Boosting(objects[1][1], n), n)
            return None
    except (_Unsupported, KeyError, TypeError, ValueError, zipfile.BadZipFile, OSError):
        return None
