"""Rows an apply rewrites in the state without a planned change: what a commit will see changed although
``resource_changes`` calls the instance a no-op, or leaves it out.

- A managed instance whose recorded ``dependencies`` differ from the configuration's: Terraform stores the new
  ones on every apply, no-op or not. The plan shows them already in ``prior_state`` (``depends_on``), so a
  ``moved`` block renaming a module or resource rewrites every row that depended on the old address, and a
  changed ``depends_on`` rewrites its row.
- A data source the commit takes (one ``written`` accepts): read at apply time (``["read"]`` in
  ``resource_changes``, because it depends on a pending change), or read during planning with values other
  than the trunk's copy, or absent from it.

These belong to the plan's write set, so they are reserved, and a commit naming them is what the plan said.
Must not do I/O.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from analyzer.state import InstanceRow

__all__ = ["rewritten_rows"]


def rewritten_rows(plan: Mapping[str, Any], before: Mapping[str, InstanceRow],
                   written: Callable[[str], bool]) -> frozenset[str]:
    """Instance addresses the apply of ``plan`` rewrites without a planned change. ``before`` maps the
    workspace's starting rows (current objects) by address; ``written`` says whether a data source address is
    committed (covered by a write glob)."""
    found: set[str] = set()
    for resource in _resources(plan.get("prior_state")):
        address, mode = resource.get("address"), resource.get("mode")
        if not isinstance(address, str):
            continue
        row = before.get(address)
        if mode == "managed":
            depends_on = resource.get("depends_on") or []
            if row is not None and sorted(row.dependencies) != sorted(str(d) for d in depends_on):
                found.add(address)
        elif mode == "data" and written(address) and (row is None or _values(row) != resource.get("values")):
            found.add(address)
    for change in plan.get("resource_changes") or []:
        if not isinstance(change, Mapping) or change.get("mode") != "data":
            continue
        actions = (change.get("change") or {}).get("actions")
        address = change.get("address")
        if actions == ["read"] and isinstance(address, str) and written(address):
            found.add(address)
    return frozenset(found)


def _values(row: InstanceRow) -> object:
    try:
        instance = json.loads(row.instance_json)
    except ValueError:
        return None
    return instance.get("attributes") if isinstance(instance, dict) else None


def _resources(state: object) -> Iterator[Mapping[str, Any]]:
    """Every resource of a plan's ``prior_state`` (its ``values`` representation), child modules included."""
    values = state.get("values") if isinstance(state, Mapping) else None
    if not isinstance(values, Mapping):
        return
    queue = [values.get("root_module")]
    while queue:
        module = queue.pop()
        if not isinstance(module, Mapping):
            continue
        yield from (r for r in module.get("resources") or [] if isinstance(r, Mapping))
        queue.extend(module.get("child_modules") or [])
