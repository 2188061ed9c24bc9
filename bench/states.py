"""Builders of synthetic v4 states shaped like terraform_data, for benchmarks and tests."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

PROVIDER = 'provider["terraform.io/builtin/terraform"]'


def instance(key: int | str | None, value: str, *, deps: Iterable[str] = (), **extra: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "schema_version": 0,
        "attributes": {
            "id": str(uuid.uuid5(uuid.NAMESPACE_OID, f"{key}:{value}")),
            "input": {"value": value, "type": "string"},
            "output": {"value": value, "type": "string"},
            "triggers_replace": None,
        },
        "sensitive_attributes": [],
        "identity_schema_version": 0,
    }
    if key is not None:
        obj["index_key"] = key
    deps = sorted(deps)
    if deps:
        obj["dependencies"] = deps
    obj.update(extra)
    return obj


def resource(name: str, instances: list[dict[str, Any]], *, module: str = "", mode: str = "managed",
             type_: str = "terraform_data") -> dict[str, Any]:
    res: dict[str, Any] = {"mode": mode, "type": type_, "name": name, "provider": PROVIDER, "instances": instances}
    if module:
        res = {"module": module, **res}
    return res


def state(serial: int, resources: list[dict[str, Any]], *, lineage: str = "11111111-2222-3333-4444-555555555555",
          outputs: Mapping[str, Any] | None = None) -> bytes:
    doc = {
        "version": 4,
        "terraform_version": "1.15.5",
        "serial": serial,
        "lineage": lineage,
        "outputs": dict(outputs or {}),
        "resources": resources,
        "check_results": None,
    }
    return (json.dumps(doc, indent=2) + "\n").encode()


def counted_state(serial: int, count: int, *, name: str = "item", value: str = "v", changed: int | None = None,
                  lineage: str = "11111111-2222-3333-4444-555555555555") -> bytes:
    """One counted resource with ``count`` instances; ``changed`` gives one instance another value."""
    instances = [instance(i, f"{value}-{i}" + ("-changed" if i == changed else "")) for i in range(count)]
    return state(serial, [resource(name, instances)], lineage=lineage)


def lock_info(lock_id: str, who: str = "alice@laptop") -> bytes:
    return json.dumps({
        "ID": lock_id, "Operation": "OperationTypeApply", "Info": "", "Who": who, "Version": "1.15.5",
        "Created": "2026-11-30T10:00:00.123456789Z", "Path": "",
    }).encode()
