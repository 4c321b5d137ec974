"""Routing model files: a skops file with its JSON card beside it (same name, .json)."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from classifier.model import ModelFileError, RouteModel, model_from_bytes, model_to_bytes
from gateway.files import write_atomic
from gateway.upstreams.local import is_packaged_local_model
from policies.schema import Policy

if TYPE_CHECKING:  # sklearn and skops load with the verifier, not with this module
    from classifier.verifier import VerifierModel

BUILTIN_MODEL = "default.skops"
BUILTIN_PREFIX = "builtin:"
# the files shipped in classifier/models/, by their builtin: name
BUILTIN_FILES = {"default": BUILTIN_MODEL, "verifier": "verifier.skops"}


def builtin_model_path(name: str = "default") -> Path:
    """A model shipped in the classifier package (trained on L-Eval; see its card)."""
    return Path(str(resources.files("classifier").joinpath("models", BUILTIN_FILES[name])))


def card_path(model_path: str | Path) -> Path:
    return Path(model_path).with_suffix(".json")


def save_model(model: RouteModel, path: str | Path) -> Path:
    """Write the skops file and its JSON card; returns the card's path."""
    return _write(path, *model_to_bytes(model))


def load_model(path: str | Path, lean: bool = False) -> RouteModel:
    """Load a model saved by save_model (see classifier.model.model_from_bytes for what is refused). `lean`: for
    scoring only, without scikit-learn where the pipeline allows (classifier.model.load_pipeline)."""
    data, card = _read(path, "model")
    return model_from_bytes(data, card, source=str(path), lean=lean)


def resolve_model_path(model_path: str, policy_file: Path | None) -> Path:
    """'builtin:default' / 'builtin:verifier' -> the shipped models; other paths are relative to the policy file."""
    if model_path.startswith(BUILTIN_PREFIX):
        name = model_path[len(BUILTIN_PREFIX) :]
        if name not in BUILTIN_FILES:
            known = ", ".join(f"'{BUILTIN_PREFIX}{n}'" for n in BUILTIN_FILES)
            raise ValueError(f"unknown builtin model {model_path!r}; the shipped ones are {known}")
        return builtin_model_path(name)
    path = Path(model_path).expanduser()
    if not path.is_absolute() and policy_file is not None:
        path = Path(policy_file).parent / path
    return path


def load_route_model(policy: Policy, policy_file: Path | None = None, lean: bool = False) -> RouteModel | None:
    """The policy's classifier, or None when the policy routes without one (`lean`: see load_model)."""
    settings = policy.routing.classifier
    if settings is None:
        return None
    return load_model(resolve_model_path(settings.model_path, policy_file), lean)


def check_policy_files(policy: Policy, policy_file: Path | None = None) -> list[str]:
    """Every file the policy names, opened the way the gateway will open it: the classifier (loaded, so an
    untrusted or mismatched model is caught too), a custom embedding model folder, and local .gguf models.
    Returns one line per problem; empty when the gateway can start with this policy."""
    problems = []
    try:
        load_route_model(policy, policy_file, lean=True)  # as the gateway loads it (no scikit-learn in `serve`)
    except (ModelFileError, ValueError, OSError) as exc:
        problems.append(f"routing.classifier.model_path: {exc}")
    try:
        load_verifier_model(policy, policy_file, lean=True)
    except (ModelFileError, ValueError, OSError) as exc:
        problems.append(f"routing.verifier.model_path: {exc}")
    embedding = policy.rag.embedding_model
    if embedding is not None and not Path(embedding).expanduser().is_dir():
        problems.append(f"rag.embedding_model: {embedding}: no such model folder")
    for role, config in (("cheap", policy.cheap), ("long", policy.long)):
        if config.model.startswith("local/") and not is_packaged_local_model(config.model):
            path = Path(config.model.partition("/")[2]).expanduser()
            if path.suffix != ".gguf" or not path.is_file():
                problems.append(f"{role}.model: {config.model}: no such .gguf file")
    return problems


def save_verifier(model: VerifierModel, path: str | Path) -> Path:
    """Write the verifier's skops file and its JSON card (feature names, threshold); returns the card's path."""
    from classifier.verifier import verifier_to_bytes

    return _write(path, *verifier_to_bytes(model))


def load_verifier(path: str | Path, lean: bool = False) -> VerifierModel:
    """Load a verifier saved by save_verifier (classifier.verifier.verifier_from_bytes says what is refused;
    `lean`: see load_model)."""
    from classifier.verifier import verifier_from_bytes

    data, card = _read(path, "verifier")
    return verifier_from_bytes(data, card, source=str(path), lean=lean)


def load_verifier_model(policy: Policy, policy_file: Path | None = None, lean: bool = False) -> VerifierModel | None:
    """The policy's answer verifier, or None when the policy keeps the literal-refusal rule (`lean`: see
    load_model)."""
    settings = policy.routing.verifier
    if settings is None:
        return None
    model = load_verifier(resolve_model_path(settings.model_path, policy_file), lean)
    if settings.threshold is None and model.threshold is None:
        raise ModelFileError(f"{model.source}: the verifier's card has no threshold; set routing.verifier.threshold")
    return model


def _write(path: str | Path, data: bytes, card_text: str) -> Path:
    """A skops file and its JSON card beside it; returns the card's path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    # each file whole or not at all: a gateway reloading (any worker or replica) never reads half a model
    write_atomic(target, data)
    card = card_path(target)
    write_atomic(card, card_text)
    return card


def _read(path: str | Path, kind: str) -> tuple[bytes, dict]:
    """A skops file's bytes and its card ({} when the card is missing)."""
    file = Path(path)
    if not file.is_file():
        raise ModelFileError(f"{file}: {kind} file not found")
    card = json.loads(card_path(file).read_text(encoding="utf-8")) if card_path(file).is_file() else {}
    return file.read_bytes(), card
