"""Terraform plan JSON (``terraform show -json PLANFILE``) to the write set and read set of an apply.

Owns the reading of a plan's ``resource_changes`` into ``AddressChange`` rows, the write set they imply, and
the read set: the dependency closure of the write set, upwards (what the written resources read) and
downwards (what reads them), over the references in the plan's ``configuration`` section plus the edges
Terraform stored in state. It also owns the widening rules for what that section cannot show.

Must not do I/O, and must never carry attribute values: the analysis holds addresses, actions and globs only,
because plan JSON prints sensitive values in plain text. Must never produce a narrower read set than the
configuration allows: where the plan cannot show where a value comes from, it widens and says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from analyzer.globs import Glob, canonical
from analyzer.plan_config import _Configuration
from analyzer.plan_graph import (
    _RUN_SHOW,
    PlanFormatError,
    _checked,
    _glob_of,
    _Graph,
    _list_of,
    _minimal_globs,
    _object,
    _optional_str,
    _required_str,
)

__all__ = ["AddressChange", "PlanAnalysis", "PlanFormatError", "analyze_plan"]

_NOT_WRITES = frozenset({("no-op",), ("read",)})
_KNOWN_ACTIONS = frozenset({"no-op", "create", "read", "update", "delete", "forget"})
_REPLACES = frozenset({("delete", "create"), ("create", "delete"), ("create", "forget")})







@dataclass(frozen=True, slots=True)
class AddressChange:
    """One entry of ``resource_changes``: a resource instance object and what the plan does to it."""

    address: str
    module_address: str
    mode: str
    type: str
    name: str
    index: int | str | None
    deposed: str
    actions: tuple[str, ...]
    action_reason: str
    previous_address: str  # set when a ``moved`` block applies
    importing: bool = False

    @property
    def summary(self) -> str:
        """One word for the change: create, update, delete, replace, read, forget, no-op, move or import."""
        if self.actions == ("no-op",):
            if self.previous_address:
                return "move"
            return "import" if self.importing else "no-op"
        if self.actions in _REPLACES:
            return "replace"
        if len(self.actions) == 1:
            return self.actions[0]
        return "-".join(self.actions)

    @property
    def is_write(self) -> bool:
        """Whether applying the plan changes the state at this address (a move or an import does)."""
        return self.actions not in _NOT_WRITES or bool(self.previous_address) or self.importing


@dataclass(frozen=True, slots=True)
class PlanAnalysis:
    """What an apply of the plan writes and reads, as instance addresses and as reservation globs.

    ``read_set`` and ``write_set`` are disjoint (a write implies a read). ``write_globs`` name exactly the
    write set; ``read_globs`` cover the read set and may be wider, and every widening is explained in
    ``warnings``. ``config_refs`` maps each configured resource (module keys and instance keys left out) to
    the resources its configuration references, through module variables and outputs. ``has_changes`` is
    true when anything is written or an output changes.
    """

    terraform_version: str
    changes: tuple[AddressChange, ...]
    write_set: frozenset[str]
    read_set: frozenset[str]
    write_globs: tuple[str, ...]
    read_globs: tuple[str, ...]
    config_refs: Mapping[str, frozenset[str]]
    warnings: tuple[str, ...]
    output_changes: Mapping[str, tuple[str, ...]]
    has_changes: bool


def analyze_plan(
    plan_json: Mapping[str, Any],
    *,
    state_edges: Iterable[tuple[str, str]] = (),
    state_addresses: Iterable[str] = (),
) -> PlanAnalysis:
    """Compute the write set and read set of a parsed ``terraform show -json`` plan.

    ``state_edges`` are (instance address, resource address it depends on) pairs from the trunk's stored
    ``dependencies``; they add edges the configuration no longer shows (deleted resources, references in
    ``replace_triggered_by``, ``dynamic`` blocks or conditions). ``state_addresses`` are the trunk's instance
    addresses, so a read resource maps to instances the plan does not list. The plan's own ``prior_state``
    supplies both as well. Raises PlanFormatError for input that is not plan JSON, AddressError for a state
    edge or address that does not parse.
    """
    plan = _check_envelope(plan_json)
    changes = tuple(_parse_change(i, entry) for i, entry in enumerate(_list_of(plan, "resource_changes")))
    write_set, warnings = _write_set(changes)
    graph = _Graph()
    for address in (*write_set, *(c.address for c in changes), *state_addresses):
        graph.add_instance(address)
    for i, entry in enumerate(_list_of(plan, "deferred_changes")):
        inner = entry.get("resource_change") if isinstance(entry, Mapping) else None
        if isinstance(inner, Mapping) and isinstance(inner.get("address"), str):
            graph.add_instance(_checked(inner["address"], f"deferred_changes[{i}]"))
    for section in ("prior_state", "planned_values"):
        _walk_values(plan.get(section), section, graph)
    for source, target in state_edges:
        graph.add_instance(source)
        graph.add_state_edge(source, target)

    config = plan.get("configuration")
    if not isinstance(config, Mapping) or not isinstance(config.get("root_module", {}), Mapping):
        raise PlanFormatError(f"the plan JSON has no configuration section: {_RUN_SHOW}")
    config_refs = _Configuration(config.get("root_module", {}), graph).link()

    start = {graph.node_of(address) for address in write_set}
    up, up_warnings = graph.closure(start, upwards=True)
    down, down_warnings = graph.closure(start, upwards=False)
    warnings.update(up_warnings, down_warnings)
    reached = up | down
    read_set = {a for node in reached if isinstance(node, str) for a in graph.instances.get(node, ())} - write_set
    read_globs = {_glob_of(node) for node in reached if isinstance(node, str)}
    read_globs.update(_glob_of(node) for node in up if not isinstance(node, str))

    output_changes = {
        name: tuple(_actions(_object(entry, f"output_changes.{name}").get("actions"), f"output_changes.{name}"))
        for name, entry in sorted(_object(plan.get("output_changes", {}), "output_changes").items())
    }
    return PlanAnalysis(
        terraform_version=_optional_str(plan, "terraform_version", "the plan"),
        changes=changes,
        write_set=frozenset(write_set),
        read_set=frozenset(read_set),
        write_globs=tuple(sorted(canonical(Glob.exact(a)) for a in write_set)),
        read_globs=_minimal_globs(read_globs),
        config_refs=MappingProxyType(config_refs),
        warnings=tuple(sorted(warnings)),
        output_changes=MappingProxyType(output_changes),
        has_changes=bool(write_set) or any(actions != ("no-op",) for actions in output_changes.values()),
    )


# --- the plan envelope and resource_changes ---------------------------------------------------------------


def _check_envelope(plan: object) -> Mapping[str, Any]:
    if not isinstance(plan, Mapping):
        raise PlanFormatError(f"plan JSON must be a JSON object, not {type(plan).__name__}: {_RUN_SHOW}")
    version = plan.get("format_version")
    if not isinstance(version, str):
        raise PlanFormatError(f"this is not Terraform plan JSON (it has no format_version): {_RUN_SHOW}")
    if version.split(".")[0] != "1":
        raise PlanFormatError(
            f"plan JSON format_version {version} is not supported (Kilolock reads 1.x): plan with a Terraform "
            "release that writes format 1.x, or upgrade Kilolock"
        )
    if "values" in plan and "planned_values" not in plan:
        raise PlanFormatError(f"this is `terraform show -json` of a state, not of a plan: {_RUN_SHOW}")
    if "planned_values" not in plan and "resource_changes" not in plan:
        raise PlanFormatError(f"this is not Terraform plan JSON (no planned_values or resource_changes): {_RUN_SHOW}")
    if plan.get("errored") is True:
        raise PlanFormatError("the plan errored and cannot be applied: fix what terraform plan reported, then re-plan")
    return plan


def _write_set(changes: tuple[AddressChange, ...]) -> tuple[set[str], set[str]]:
    """The addresses the plan writes (both ends of a move), and a warning per change of unknown kind."""
    write_set: set[str] = set()
    warnings: set[str] = set()
    for change in changes:
        unknown = [action for action in change.actions if action not in _KNOWN_ACTIONS]
        if unknown:
            # Terraform may add actions in a minor format version; an unknown one is assumed to write.
            warnings.add(f"{change.address}: unknown action {', '.join(unknown)} is treated as a write")
        if change.is_write:
            write_set.add(change.address)
            if change.previous_address:
                write_set.add(change.previous_address)
    return write_set, warnings


def _parse_change(position: int, entry: object) -> AddressChange:
    where = f"resource_changes[{position}]"
    item = _object(entry, where)
    address = item.get("address")
    if not isinstance(address, str):
        raise PlanFormatError(f"{where} has no address: {_RUN_SHOW}")
    where = f"resource_changes[{position}] ({address})"
    _checked(address, where)
    change = _object(item.get("change"), f"{where}.change")
    previous = _optional_str(item, "previous_address", where)
    if previous:
        _checked(previous, f"{where}.previous_address")
    index = item.get("index")
    if isinstance(index, bool) or not isinstance(index, int | str | None):
        raise PlanFormatError(f"{where}.index must be a number, a string or absent: {_RUN_SHOW}")
    return AddressChange(
        address=address,
        module_address=_optional_str(item, "module_address", where),
        mode=_required_str(item, "mode", where),
        type=_required_str(item, "type", where),
        name=_required_str(item, "name", where),
        index=index,
        deposed=_optional_str(item, "deposed", where),
        actions=tuple(_actions(change.get("actions"), f"{where}.change")),
        action_reason=_optional_str(item, "action_reason", where),
        previous_address=previous,
        importing=change.get("importing") is not None,
    )


def _actions(value: object, where: str) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(a, str) for a in value):
        raise PlanFormatError(f"{where}.actions must be a non-empty list of strings: {_RUN_SHOW}")
    return value


def _walk_values(section: object, name: str, graph: _Graph) -> None:
    """Record the instances of a values representation (prior_state, planned_values) and their depends_on."""
    if not isinstance(section, Mapping):
        return
    values = section.get("values", section)  # prior_state wraps its values; planned_values is them
    pending = [values.get("root_module")] if isinstance(values, Mapping) else []
    while pending:
        module = pending.pop()
        if not isinstance(module, Mapping):
            continue
        for resource in module.get("resources") or ():
            if isinstance(resource, Mapping) and isinstance(resource.get("address"), str):
                where = f"{name} resource {resource['address']}"
                address = _checked(resource["address"], where)
                graph.add_instance(address)
                for target in resource.get("depends_on") or ():
                    if isinstance(target, str):
                        try:
                            graph.add_state_edge(address, target)
                        except ValueError as exc:
                            raise PlanFormatError(f"{where}: depends_on {target!r}: {exc}: {_RUN_SHOW}") from exc
        pending.extend(module.get("child_modules") or ())


# --- the graph --------------------------------------------------------------------------------------------
















# --- the configuration section ----------------------------------------------------------------------------




















# --- JSON helpers -----------------------------------------------------------------------------------------










