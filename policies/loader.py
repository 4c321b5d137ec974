"""Load a policy YAML file; errors name the file, the line and the field."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from policies.schema import Policy

DEFAULT_POLICY = "default.yaml"


class PolicyError(ValueError):
    """A policy file that cannot be used; the message names file, line and field."""


def shipped_policy_path(name: str = DEFAULT_POLICY) -> Path:
    return Path(str(resources.files("policies").joinpath(name)))


def _node_at(node: yaml.Node, loc: tuple[Any, ...]) -> yaml.Node:
    """Walk the YAML node tree along a pydantic error location, as far as it goes."""
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            match = next((v for k, v in node.value if k.value == key), None)
            if match is None:
                # an unknown (extra) key: point at the key itself
                key_node = next((k for k, _ in node.value if k.value == key), None)
                return key_node or node
            node = match
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
        else:
            break
    return node


def parse_policy(text: str, path: str = "<string>") -> Policy:
    try:
        root = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise PolicyError(f"{path}{where}: invalid YAML: {getattr(exc, 'problem', exc)}") from exc
    except RecursionError:  # PyYAML composes nested collections recursively
        raise PolicyError(f"{path}: invalid YAML: nested too deeply") from None
    if not isinstance(data, dict):
        raise PolicyError(f"{path}:1: a policy must be a YAML mapping")
    try:
        return Policy.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            node = _node_at(root, loc) if root is not None else None
            line = node.start_mark.line + 1 if node is not None else 1
            field = ".".join(str(p) for p in loc) or "(policy)"
            lines.append(f"{path}:{line}: {field}: {err['msg']}")
        raise PolicyError("\n".join(lines)) from exc


def load_policy(path: str | Path | None = None) -> tuple[Policy, Path]:
    """Load and validate a policy; returns it with the file it came from."""
    file = Path(path) if path else shipped_policy_path()
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(f"{file}: cannot read policy: {exc.strerror or exc}") from exc
    return parse_policy(text, str(file)), file
