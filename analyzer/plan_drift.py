"""Drift in a refresh-only plan: which managed instances changed outside Terraform, which top-level
attributes changed (names only), and which objects are gone.

Terraform's ``show -json`` of a refresh-only plan lists, under ``resource_drift``, every instance whose
refreshed object differs from the state, with both objects in clear text (sensitive values included).
This module turns that into names and flags and never returns, logs or formats a value.
Data sources are never drift: Terraform re-reads them on every run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from analyzer.addresses import AddressError, parse_instance_address
from analyzer.state import InstanceRow, ParsedState
from analyzer.state_assembly import assemble_state
from analyzer.values import same_value


class DriftFormatError(ValueError):
    """The plan JSON is not shaped like Terraform's ``show -json`` output."""


@dataclass(frozen=True, slots=True)
class DriftedInstance:
    """One managed instance whose remote object differs from the state."""

    address: str
    attributes: tuple[str, ...]  # top-level attribute names whose values changed, sorted
    gone: bool                   # the object no longer exists remotely
    last_change: str = ""        # the server's words for the last change it recorded here (not sent back)

    def to_json(self) -> dict[str, Any]:
        return {"address": self.address, "attributes": list(self.attributes), "gone": self.gone}


def changed_attributes(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> tuple[str, ...]:
    """Top-level attribute names whose values differ between two objects (a key present on one side only
    counts as changed), compared as JSON values (``analyzer.values``: ``true`` is not ``1``)."""
    before, after = before or {}, after or {}
    return tuple(sorted(k for k in set(before) | set(after) if not same_value(before.get(k), after.get(k))))


def is_data_address(address: str) -> bool:
    try:
        return parse_instance_address(address).mode == "data"
    except AddressError:
        return address.startswith("data.") or ".data." in address


def drift_in_plan(plan: Mapping[str, Any], include: Callable[[str], bool] | None = None) -> tuple[DriftedInstance, ...]:
    """The drifted managed instances of a refresh-only plan (``show -json``), sorted by address;
    ``include`` limits them to the addresses a check covers."""
    entries = plan.get("resource_drift") or []
    if not isinstance(entries, list):
        raise DriftFormatError("resource_drift must be a list")
    found: dict[str, DriftedInstance] = {}
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("address"), str):
            raise DriftFormatError("every resource_drift entry needs an address")
        address = entry["address"]
        if entry.get("mode", "managed") != "managed" or is_data_address(address):
            continue
        if entry.get("deposed"):
            continue  # a deposed object is on its way out; its drift is not the instance's
        if include is not None and not include(address):
            continue
        change = entry.get("change") or {}
        actions = tuple(change.get("actions") or ())
        if actions == ("no-op",):
            continue
        gone = actions == ("delete",) or change.get("after") is None
        attributes = () if gone else changed_attributes(change.get("before"), change.get("after"))
        if not gone and not attributes:
            continue  # re-serialised only: nothing a person could act on
        found[address] = DriftedInstance(address, attributes, gone)
    return tuple(found[a] for a in sorted(found))


def managed_addresses(addresses: Iterable[str]) -> list[str]:
    """The managed (non-data) addresses among ``addresses``, sorted and unique."""
    return sorted({a for a in addresses if not is_data_address(a)})


def keep_trunk_rows(after: ParsedState, before: ParsedState | None, refreshed: Callable[[InstanceRow], bool]) -> bytes:
    """A post-refresh state in which only the rows ``refreshed`` accepts come from Terraform; every other row
    is the trunk's copy from ``before`` (the slice the workspace started from), and so are the outputs. A
    refresh inside a workspace touches everything in it; a commit must only carry what its run writes."""
    kept = [r for r in after.instances if refreshed(r)]
    if before is not None:
        kept += [r for r in before.instances if not refreshed(r)]
    return assemble_state(serial=after.serial, lineage=before.lineage if before else after.lineage,
                          terraform_version=after.terraform_version, instances=kept,
                          outputs=before.outputs if before else after.outputs)


def drift_warnings(found: Iterable[DriftedInstance]) -> list[str]:
    """One line per drifted instance, for a plan that refreshed (names only)."""
    return [f"{d.address} was deleted outside Terraform" if d.gone else
            f"{d.address} changed outside Terraform: {', '.join(d.attributes)}" for d in found]
