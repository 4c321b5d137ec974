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


def _last_line(node: yaml.Node) -> int:
    """The last line a value takes (a block collection's own end mark is where the next key starts)."""
    if isinstance(node, yaml.MappingNode) and node.value:
        return _last_line(node.value[-1][1])
    if isinstance(node, yaml.SequenceNode) and node.value:
        return _last_line(node.value[-1])
    end = node.end_mark
    return end.line if end.column > 0 else end.line - 1


def _scalar(value) -> str:
    # JSON strings (and true/false/null) are valid YAML scalars
    if isinstance(value, str | bool) or value is None:
        return json.dumps(value)
    return repr(value) if isinstance(value, int) else repr(float(value))


def set_threshold(text: str, threshold: float, source: str, section: str = "classifier") -> tuple[str, bool]:
    """The policy text with routing.<section>.threshold and threshold_source set (section: classifier or
    verifier). Returns (text, comments_kept)."""
    return set_values(text, {"threshold": float(threshold), "threshold_source": source}, section)


def set_values(text: str, values: dict, section: str = "classifier") -> tuple[str, bool]:
    """The policy text with routing.<section>.<key> set for each key of `values` (strings, numbers, booleans or
    None), e.g. a new model_path with its threshold (selfroute learn); `section` may be dotted ("verifier.relative").
    Returns (text, comments_kept)."""
    root = yaml.compose(text)
    node = _mapping_item(root, "routing")
    for part in section.split("."):
        node = _mapping_item(node[1] if node else None, part)
    block = node[1] if node else None
    if not isinstance(block, yaml.MappingNode) or block.flow_style or not block.value:
        data = yaml.safe_load(text) or {}
        parent = data.setdefault("routing", {})
        *path, last = section.split(".")
        for part in path:
            if not isinstance(parent.get(part), dict):
                parent[part] = {}
            parent = parent[part]
        settings = parent.get(last) or {}
        settings.update(values)
        parent[last] = settings
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
    for key, (key_node, value_node) in sorted(found.items(), key=lambda kv: -kv[1][1].start_mark.index):
        start, end = value_node.start_mark, value_node.end_mark
        if start.line != end.line:  # a multi-line value (a nested block too): one line, key and value
            final = _last_line(value_node)
            head = lines[key_node.start_mark.line][: key_node.end_mark.column] + ": "
            lines[key_node.start_mark.line : final + 1] = [head + edits[key] + "\n"]
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
