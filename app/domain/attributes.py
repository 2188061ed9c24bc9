"""Attribute diffs between two lifecycles of one resource instance, with sensitive values masked.

Pure: instance attributes (decoded JSON) in, frozen change records out. A value is masked when
its path lies under any path Terraform listed in ``sensitive_attributes`` or when an attribute
name on its path looks like a secret (``password``, ``token``…): the dashboard shows that such a
value changed, never what it was or became.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

Step = str | int
Path = tuple[Step, ...]

MAX_VALUE_CHARS = 300
# Defence in depth for providers whose schema marks secrets only in the provider: names that
# hold credentials are masked even when the state does not list them as sensitive.
SECRET_NAME_PATTERN = "password|passwd|secret|token|private_key|api_key|access_key|credential"
_SECRET_NAME = re.compile(SECRET_NAME_PATTERN, re.I)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


class ChangeKind(StrEnum):
    ADDED = "added"
    REMOVED = "removed"
    CHANGED = "changed"


@dataclass(frozen=True, slots=True)
class AttributeChange:
    """One leaf that differs. ``before``/``after`` are display strings (compact JSON, cut at
    ``MAX_VALUE_CHARS``), or None when absent or masked."""

    path: str
    kind: ChangeKind
    before: str | None
    after: str | None
    sensitive: bool


def sensitive_paths(raw: object) -> frozenset[Path]:
    """Terraform's ``sensitive_attributes`` (lists of ``get_attr``/``index`` steps) as paths.
    Unknown step shapes end a path early, which masks more rather than less."""
    found: set[Path] = set()
    if not isinstance(raw, list):
        return frozenset()
    for steps in raw:
        if not isinstance(steps, list):
            continue
        path: list[Step] = []
        for step in steps:
            value = step.get("value") if isinstance(step, dict) else None
            if isinstance(value, dict):  # index steps carry {"value": ..., "type": ...}
                value = value.get("value")
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                break
            path.append(int(value) if isinstance(value, float) else value)
        found.add(tuple(path))
    return frozenset(found)


def flatten(value: object, prefix: Path = ()) -> dict[Path, object]:
    """Leaves of a JSON value by path; empty objects and lists are leaves themselves."""
    if isinstance(value, Mapping) and value:
        out: dict[Path, object] = {}
        for key, item in value.items():
            out.update(flatten(item, (*prefix, str(key))))
        return out
    if isinstance(value, list) and value:
        out = {}
        for index, item in enumerate(value):
            out.update(flatten(item, (*prefix, index)))
        return out
    return {prefix: value}


def format_path(path: Path) -> str:
    """``("tags", "Name")`` → ``tags.Name``; ``("list", 0)`` → ``list[0]``; odd keys are quoted."""
    text = ""
    for step in path:
        if isinstance(step, int):
            text += f"[{step}]"
        elif _IDENTIFIER.fullmatch(step):
            text += f".{step}" if text else step
        else:
            text += f"[{json.dumps(step)}]"
    return text


_TYPE_NAMES = frozenset({"string", "number", "bool", "dynamic"})


def is_sensitive(path: Path, masked: Iterable[Path], *, type_name: bool = False) -> bool:
    """Whether the value at ``path`` is masked. ``type_name``: every value seen there is a bare type name
    (``"string"``…), so a secret-looking name inside a type descriptor is the name of a field, not a secret."""
    if any(_same_prefix(path, m) for m in masked):
        return True
    named = _descriptor_owner(path) if type_name else path
    return any(isinstance(step, str) and _SECRET_NAME.search(step) for step in named)


def _descriptor_owner(path: Path) -> Path:
    """The path down to a type descriptor (``input.type[1].password`` → ``input.type``), or ``path`` itself.
    Terraform writes a dynamic value's type as ``["object", {"field": "string", …}]``: index 1 holds field names."""
    for i in range(len(path) - 2):
        if path[i] == "type" and path[i + 1] == 1 and isinstance(path[i + 2], str):
            return path[: i + 1]
    return path


def _same_prefix(path: Path, prefix: Path) -> bool:
    return len(prefix) <= len(path) and all(str(a) == str(b) for a, b in zip(path, prefix, strict=False))


def _show(value: object) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 1] + "…"


def _order(path: Path) -> list[tuple[int, str]]:
    return [(0, f"{step:012d}") if isinstance(step, int) else (1, step) for step in path]


def attribute_diff(
    before: Mapping[str, Any] | None, after: Mapping[str, Any] | None, *, masked: Iterable[Path] = (),
) -> tuple[AttributeChange, ...]:
    """Leaves added, removed or changed from ``before`` to ``after`` (None: no lifecycle), by path."""
    masked = tuple(masked)
    old, new = flatten(dict(before or {})), flatten(dict(after or {}))
    old.pop((), None)
    new.pop((), None)
    changes: list[AttributeChange] = []
    for path in sorted(old.keys() | new.keys(), key=_order):
        in_old, in_new = path in old, path in new
        if in_old and in_new and old[path] == new[path]:
            continue
        kind = ChangeKind.CHANGED if in_old and in_new else ChangeKind.ADDED if in_new else ChangeKind.REMOVED
        seen = [v[path] for v in (old, new) if path in v]
        secret = is_sensitive(path, masked, type_name=all(isinstance(v, str) and v in _TYPE_NAMES for v in seen))
        changes.append(AttributeChange(
            path=format_path(path), kind=kind, sensitive=secret,
            before=None if secret or not in_old else _show(old[path]),
            after=None if secret or not in_new else _show(new[path]),
        ))
    return tuple(changes)
