"""The trained P(cheap route suffices) model: scoring and (de)serialisation. No I/O here.

Models serialise with skops (never pickle) next to a JSON card; gateway.routing.model_files reads and writes
the files. Loading trusts an explicit list of types, the ones our pipelines are built from; data
needing anything else is refused.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import json
import math
import sys
from dataclasses import dataclass, field
from typing import Any

from classifier.features import FEATURE_NAMES, feature_vector

# Types our pipelines (classifier.estimators.build_pipeline) need beyond what skops trusts by default
# (scikit-learn's own estimators and transformers are on skops' default list). skops refuses any other.
TRUSTED_TYPES = [
    "numpy.dtype",
    "sklearn.ensemble._hist_gradient_boosting.predictor.TreePredictor",
]


class _SkipSklearnExtras(importlib.abc.MetaPathFinder):
    """Refuses scikit-learn's array-API adapters for other libraries and its test packages. Importing skops.io lists
    scikit-learn's estimators (sklearn.utils.all_estimators), and that walk imports every package under sklearn:
    sklearn.externals.array_api_compat.torch imports torch (~180 MB resident, seconds), sklearn.utils._testing and the
    tests packages pytest, in a gateway that has no other use for them. pkgutil.walk_packages skips a package whose
    import raises ImportError and _testing's pytest is optional, so the estimator list, and with it skops' default
    trusted types, is the same (a process that already imported one of them is not affected)."""

    EXTRAS = ("torch", "cupy", "dask", "jax")

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        parts = name.split(".")
        if parts[0] == "pytest":  # sklearn.utils._testing's optional import (test decorators)
            raise ImportError(f"{name}: not needed to read a model file")
        if parts[0] == "sklearn" and (
            "tests" in parts
            or parts[1:3] == ["externals", "array_api_compat"]
            and len(parts) > 3
            and parts[3] in self.EXTRAS
        ):
            raise ImportError(f"{name}: not needed to read a model file")
        return None


def skops_io() -> Any:
    """skops.io, imported without what its estimator walk would pull in (_SkipSklearnExtras)."""
    if "skops.io" not in sys.modules:
        finder = _SkipSklearnExtras()
        sys.meta_path.insert(0, finder)
        try:
            import skops.io  # noqa: F401
        finally:
            sys.meta_path.remove(finder)
    return sys.modules["skops.io"]


class ModelFileError(ValueError):
    """A model file that cannot be used (missing, untrusted content, other feature set)."""


@dataclass
class RouteModel:
    """A fitted scikit-learn pipeline over FEATURE_NAMES, with its card."""

    pipeline: Any
    card: dict[str, Any] = field(default_factory=dict)
    source: str = "<memory>"
    sha256: str | None = None  # of the skops bytes it was loaded from: the model version the ledger records

    def cheap_probability(self, features: dict[str, float]) -> float:
        """P(the cheap route's answer is as good as the long route's)."""
        return float(self.cheap_probabilities([features])[0])

    def cheap_probabilities(self, rows: list[dict[str, float]]) -> list[float]:
        import numpy as np

        matrix = np.asarray([feature_vector(r) for r in rows], dtype=float)
        classes = list(self.pipeline.classes_)
        return [float(p) for p in self.pipeline.predict_proba(matrix)[:, classes.index(1)]]


def model_to_bytes(model: RouteModel) -> tuple[bytes, str]:
    """The skops bytes of the pipeline and the JSON text of its card (writing them is the caller's job)."""
    import zipfile

    sio = skops_io()
    data = sio.dumps(model.pipeline, compression=zipfile.ZIP_DEFLATED, compresslevel=9)
    return data, json.dumps(_json_safe(model.card), indent=2, sort_keys=True) + "\n"


def load_trusted(data: bytes, source: str) -> Any:
    """The scikit-learn pipeline in skops bytes, refusing any type outside TRUSTED_TYPES (never pickle)."""
    sio = skops_io()

    try:
        untrusted = set(sio.get_untrusted_types(data=data)) - set(TRUSTED_TYPES)
    except Exception as exc:  # a corrupt or non-skops file fails here first
        raise ModelFileError(f"{source}: not a readable skops file: {exc}") from exc
    if untrusted:
        raise ModelFileError(f"{source}: refusing to load types outside the trusted list: {sorted(untrusted)}")
    return sio.loads(data, trusted=TRUSTED_TYPES)


def load_pipeline(data: bytes, source: str, lean: bool = False) -> Any:
    """The pipeline in skops bytes. `lean` (a serving gateway): the shipped shapes as classifier.lean reads them,
    scored without importing scikit-learn (the same probabilities); any other pipeline through skops."""
    if lean:
        from classifier.lean import read_lean

        pipeline = read_lean(data)
        if pipeline is not None:
            return pipeline
    return load_trusted(data, source)


def model_from_bytes(
    data: bytes, card: dict[str, Any] | None = None, source: str = "<memory>", lean: bool = False
) -> RouteModel:
    """A model from skops bytes; refuses types outside TRUSTED_TYPES and models of another feature set. `lean`: see
    load_pipeline (the model then scores, and cannot be refitted or saved)."""
    pipeline = load_pipeline(data, source, lean)
    card = card or {}
    names = card.get("feature_names")
    if names is not None and list(names) != FEATURE_NAMES:
        raise ModelFileError(
            f"{source}: trained on a different feature set ({len(names)} features) than this version "
            f"computes ({len(FEATURE_NAMES)}); retrain it with `selfroute train`"
        )
    n_in = getattr(pipeline, "n_features_in_", len(FEATURE_NAMES))
    if n_in != len(FEATURE_NAMES):
        raise ModelFileError(f"{source}: model expects {n_in} features, this version computes {len(FEATURE_NAMES)}")
    return RouteModel(pipeline=pipeline, card=card, source=source, sha256=hashlib.sha256(data).hexdigest())


def _json_safe(value: Any) -> Any:
    """Cards hold plain JSON: NaN becomes null, numpy scalars become Python numbers."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
