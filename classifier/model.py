"""The trained P(cheap route suffices) model: scoring, and its only I/O, saving and loading.

Files are skops (never pickle) with a JSON card beside them (same name, .json). Loading trusts an
explicit list of types, the ones our pipelines are built from; a file needing anything else is refused.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from classifier.features import FEATURE_NAMES, feature_vector

BUILTIN_MODEL = "default.skops"

# Types our pipelines (classifier.training.build_pipeline) need beyond what skops trusts by default
# (scikit-learn's own estimators and transformers are on skops' default list). skops refuses any other.
TRUSTED_TYPES = [
    "numpy.dtype",
    "sklearn.ensemble._hist_gradient_boosting.predictor.TreePredictor",
]


class ModelFileError(ValueError):
    """A model file that cannot be used (missing, untrusted content, other feature set)."""


@dataclass
class RouteModel:
    """A fitted scikit-learn pipeline over FEATURE_NAMES, with its card."""

    pipeline: Any
    card: dict[str, Any] = field(default_factory=dict)
    source: str = "<memory>"

    def cheap_probability(self, features: dict[str, float]) -> float:
        """P(the cheap route's answer is as good as the long route's)."""
        return float(self.cheap_probabilities([features])[0])

    def cheap_probabilities(self, rows: list[dict[str, float]]) -> list[float]:
        import numpy as np

        matrix = np.asarray([feature_vector(r) for r in rows], dtype=float)
        classes = list(self.pipeline.classes_)
        return [float(p) for p in self.pipeline.predict_proba(matrix)[:, classes.index(1)]]


def builtin_model_path() -> Path:
    return Path(str(resources.files("classifier").joinpath("models", BUILTIN_MODEL)))


def card_path(model_path: str | Path) -> Path:
    return Path(model_path).with_suffix(".json")


def save_model(model: RouteModel, path: str | Path) -> Path:
    """Write the skops file and its JSON card; returns the card's path."""
    import zipfile

    import skops.io as sio

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    sio.dump(model.pipeline, target, compression=zipfile.ZIP_DEFLATED, compresslevel=9)
    card = card_path(target)
    card.write_text(json.dumps(_json_safe(model.card), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return card


def load_model(path: str | Path) -> RouteModel:
    """Load a model saved by save_model; refuses types outside TRUSTED_TYPES and other feature sets."""
    import skops.io as sio

    file = Path(path)
    if not file.is_file():
        raise ModelFileError(f"{file}: model file not found")
    try:
        untrusted = set(sio.get_untrusted_types(file=file)) - set(TRUSTED_TYPES)
    except Exception as exc:  # a corrupt or non-skops file fails here first
        raise ModelFileError(f"{file}: not a readable skops file: {exc}") from exc
    if untrusted:
        raise ModelFileError(f"{file}: refusing to load types outside the trusted list: {sorted(untrusted)}")
    pipeline = sio.load(file, trusted=TRUSTED_TYPES)
    card: dict[str, Any] = {}
    if card_path(file).is_file():
        card = json.loads(card_path(file).read_text(encoding="utf-8"))
        names = card.get("feature_names")
        if names is not None and list(names) != FEATURE_NAMES:
            raise ModelFileError(
                f"{file}: trained on a different feature set ({len(names)} features) than this version "
                f"computes ({len(FEATURE_NAMES)}); retrain it with `selfroute train`"
            )
    n_in = getattr(pipeline, "n_features_in_", len(FEATURE_NAMES))
    if n_in != len(FEATURE_NAMES):
        raise ModelFileError(f"{file}: model expects {n_in} features, this version computes {len(FEATURE_NAMES)}")
    return RouteModel(pipeline=pipeline, card=card, source=str(file))


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
