"""Instance and output rows back into a v4 state file that Terraform reads as its own.

Owns the assembly: resources sorted the way Terraform sorts them, instance objects with their fields in
Terraform's order, indented and escaped the way Terraform's Go encoder writes them, so a state assembled
from rows is byte-comparable with one Terraform wrote. The row shapes and their parsing are
``analyzer.state``'s. Must not do I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from analyzer.gcpause import gc_paused
from analyzer.state import STATE_VERSION, InstanceRow, OutputRow

__all__ = ["assemble_state"]

# Terraform's instanceObjectStateV4 field order, so an assembled state reads like one Terraform wrote.
_INSTANCE_FIELD_ORDER = (
    "index_key",
    "status",
    "deposed",
    "schema_version",
    "attributes",
    "attributes_flat",
    "sensitive_attributes",
    "identity_schema_version",
    "identity",
    "private",
    "dependencies",
    "create_before_destroy",
)
# Go's encoding/json escapes these inside strings. None of them can occur outside a JSON string, so a plain
# text replacement after dumping escapes them exactly where Terraform would.
_GO_ESCAPES = (
    ("<", "\\u003c"),
    (">", "\\u003e"),
    ("&", "\\u0026"),
    ("\u2028", "\\u2028"),
    ("\u2029", "\\u2029"),
)


def assemble_state(
    *,
    serial: int,
    lineage: str,
    terraform_version: str,
    instances: Iterable[InstanceRow],
    outputs: Iterable[OutputRow],
) -> bytes:
    """Build a v4 state file from rows, ordered, indented and escaped the way Terraform writes one.

    Resources sort by module, mode, type and name; instances by key (none, then ints, then strings), the
    current object before deposed ones. Resources without rows are not written (Terraform prunes them).
    Raises ValueError when rows contradict each other: one resource with two providers, an
    (address, deposed) pair given twice, or an ``instance_json`` whose key or deposed field disagrees with
    its row.
    """
    with gc_paused():
        resources = _resources(instances)
        doc = {
            "version": STATE_VERSION,
            "terraform_version": terraform_version,
            "serial": serial,
            "lineage": lineage,
            "outputs": {output.name: _output_object(output) for output in sorted(outputs, key=_output_name)},
            "resources": resources,
            "check_results": None,
        }
        try:
            return _dump_like_terraform(doc, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            # Only a lone surrogate gets here; escaping all non-ASCII beats writing invalid UTF-8.
            return _dump_like_terraform(doc, ensure_ascii=True).encode()


def _resources(instances: Iterable[InstanceRow]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str, str, str], tuple[str, list[InstanceRow]]] = {}
    for row in instances:
        group_key = (row.module, row.mode, row.type, row.name)
        group = groups.get(group_key)
        if group is None:
            groups[group_key] = (row.provider, [row])
        elif group[0] != row.provider:
            raise ValueError(
                f"{row.resource_address} has instances with two providers: {group[0]} and {row.provider}"
            )
        else:
            group[1].append(row)

    resources: list[dict[str, Any]] = []
    for (module, mode, type_, name), (provider, rows) in sorted(groups.items(), key=lambda item: item[0]):
        rows.sort(key=_instance_order)
        resource: dict[str, Any] = {}
        if module:
            resource["module"] = module
        resource.update(mode=mode, type=type_, name=name, provider=provider)
        resource["instances"] = _instance_objects(rows)
        resources.append(resource)
    return resources


def _dump_like_terraform(doc: dict[str, Any], *, ensure_ascii: bool) -> str:
    text = json.dumps(doc, indent=2, ensure_ascii=ensure_ascii) + "\n"
    for raw, escaped in _GO_ESCAPES:
        if raw in text:
            text = text.replace(raw, escaped)
    return text


def _instance_order(row: InstanceRow) -> tuple[int, int, str, str]:
    key = row.index_key
    if key is None:
        return (0, 0, "", row.deposed)
    if isinstance(key, int):
        return (1, key, "", row.deposed)
    return (2, 0, key, row.deposed)


def _instance_objects(rows: list[InstanceRow]) -> list[dict[str, Any]]:
    objects = []
    previous: tuple[str, str] | None = None
    for row in rows:
        identity = (row.address, row.deposed)
        if identity == previous:
            raise ValueError(f"{row.address} (deposed {row.deposed!r}) appears twice among the rows")
        previous = identity
        instance = json.loads(row.instance_json)
        if instance.get("index_key") != row.index_key or (instance.get("deposed") or "") != row.deposed:
            raise ValueError(f"{row.address}: instance_json disagrees with the row's index_key or deposed")
        ordered = {field: instance[field] for field in _INSTANCE_FIELD_ORDER if field in instance}
        ordered.update(instance)
        objects.append(ordered)
    return objects


def _output_object(output: OutputRow) -> dict[str, Any]:
    obj: dict[str, Any] = {"value": json.loads(output.value_json), "type": json.loads(output.type_json)}
    if output.sensitive:
        obj["sensitive"] = True
    return obj


def _output_name(output: OutputRow) -> str:
    return output.name
