"""Write a calibrated threshold into a policy YAML, keeping its comments and layout.

The edit is made on the lines of the file: the `threshold:` and `threshold_source:` values under
routing.classifier (or routing.verifier) are replaced (or added under that block). Only when the policy
has no block-style mapping there is the file re-dumped, which loses comments; the caller is told.
"""

from __future__ import annotations

import json

import yaml


def _mapping_item(node: yaml.Node | None, key: str):
    if not isinstance(node, yaml.MappingNode):
        return None
    return next(((k, v) for k, v in node.value if getattr(k, "value", None) == key), None)


def _scalar(value) -> str:
    # JSON strings are valid YAML double-quoted scalars
    return json.dumps(value) if isinstance(value, str) else repr(float(value))


def set_threshold(text: str, threshold: float, source: str, section: str = "classifier") -> tuple[str, bool]:
    """The policy text with routing.<section>.threshold and threshold_source set (section: classifier or
    verifier). Returns (text, comments_kept)."""
    return set_values(text, {"threshold": float(threshold), "threshold_source": source}, section)


def set_values(text: str, values: dict, section: str = "classifier") -> tuple[str, bool]:
    """The policy text with routing.<section>.<key> set for each key of `values` (strings or numbers), e.g. a new
    model_path with its threshold (selfroute learn). Returns (text, comments_kept)."""
    root = yaml.compose(text)
    routing = _mapping_item(root, "routing")
    classifier = _mapping_item(routing[1] if routing else None, section)
    block = classifier[1] if classifier else None
    if not isinstance(block, yaml.MappingNode) or block.flow_style or not block.value:
        data = yaml.safe_load(text) or {}
        settings = data.setdefault("routing", {}).get(section) or {}
        settings.update(values)
        data["routing"][section] = settings
        return yaml.safe_dump(data, sort_keys=False, allow_unicode=True), False

    lines = text.splitlines(keepends=True)
    indent = " " * block.value[0][0].start_mark.column
    edits: dict[str, str] = {key: _scalar(value) for key, value in values.items()}
    inserts: list[str] = []
    # replace existing values in place, bottom-up so earlier offsets stay valid
    found = {}
    for key in edits:
        item = _mapping_item(block, key)
        if item is not None:
            found[key] = item
    for key, (_key_node, value_node) in sorted(found.items(), key=lambda kv: -kv[1][1].start_mark.index):
        start, end = value_node.start_mark, value_node.end_mark
        if start.line != end.line:  # a multi-line value: replace its lines with a single line
            lines[start.line : end.line + 1] = [lines[start.line][: start.column] + edits[key] + "\n"]
        else:
            line = lines[start.line]
            lines[start.line] = line[: start.column] + edits[key] + line[end.column :]
    for key in edits:
        if key not in found:
            inserts.append(f"{indent}{key}: {edits[key]}\n")
    if inserts:
        # right after threshold when it is there, else after the block's last value
        anchor_node = found["threshold"][1] if "threshold" in found else block.value[-1][1]
        end = anchor_node.end_mark
        anchor = end.line if end.column > 0 else end.line - 1
        if not lines[anchor].endswith("\n"):
            lines[anchor] += "\n"
        lines[anchor + 1 : anchor + 1] = inserts
    return "".join(lines), True
