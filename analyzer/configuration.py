"""Which resources a configuration describes, from the ``configuration`` section of a plan's JSON.

Used to cut a state slice down to the addresses the HCL describes (a resource the HCL does not
describe would otherwise be planned for destruction), and to tell such orphans apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from analyzer.addresses import AddressError, parse_instance_address


def described_resources(plan: Mapping[str, Any]) -> frozenset[str]:
    """Configuration-level resource addresses (module calls and resources without keys), e.g.
    ``module.web.terraform_data.x`` and ``data.terraform_remote_state.other``."""
    found: set[str] = set()

    def walk(module: Mapping[str, Any], prefix: str) -> None:
        for resource in module.get("resources", []) or []:
            address = resource.get("address")
            if isinstance(address, str):
                found.add(prefix + address)
        for name, call in (module.get("module_calls", {}) or {}).items():
            child = call.get("module") if isinstance(call, Mapping) else None
            if isinstance(child, Mapping):
                walk(child, f"{prefix}module.{name}.")

    configuration = plan.get("configuration", {})
    root = configuration.get("root_module") if isinstance(configuration, Mapping) else None
    if isinstance(root, Mapping):
        walk(root, "")
    return frozenset(found)


def config_address(instance_address: str) -> str:
    """``module.a["x"].module.b[0].t.n[3]`` → ``module.a.module.b.t.n``."""
    parsed = parse_instance_address(instance_address)
    steps = "".join(f"module.{step.name}." for step in parsed.module)
    head = "data." if parsed.mode == "data" else ""
    return f"{steps}{head}{parsed.type}.{parsed.name}"


def is_described(instance_address: str, described: frozenset[str]) -> bool:
    """Whether a configuration-level address in ``described`` covers the instance. An entry
    ``module.NAME.*`` covers everything inside that root module call."""
    try:
        parsed = parse_instance_address(instance_address)
        if parsed.module and f"module.{parsed.module[0].name}.*" in described:
            return True
        return config_address(instance_address) in described
    except AddressError:
        return False


def orphans(resource_changes: Iterable[Mapping[str, Any]], described: frozenset[str]) -> frozenset[str]:
    """Addresses Terraform would destroy only because no resource block describes them any more
    (a removed count index or for_each key is still described: that deletion is intended)."""
    return frozenset(
        str(change.get("address")) for change in resource_changes
        if isinstance(change.get("address"), str) and not is_described(str(change["address"]), described)
    )
