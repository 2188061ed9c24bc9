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

import itertools
import re
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from analyzer.addresses import (
    AddressError,
    ModuleStep,
    format_module_path,
    parse_instance_address,
    parse_module_path,
    resource_address,
)
from analyzer.globs import Glob, canonical, parse_glob

__all__ = ["AddressChange", "PlanAnalysis", "PlanFormatError", "analyze_plan"]

_RUN_SHOW = "save the plan with `terraform plan -out=PLANFILE`, then pass the output of `terraform show -json PLANFILE`"
_NOT_WRITES = frozenset({("no-op",), ("read",)})
_KNOWN_ACTIONS = frozenset({"no-op", "create", "read", "update", "delete", "forget"})
_REPLACES = frozenset({("delete", "create"), ("create", "delete"), ("create", "forget")})
# Reference roots that name no resource and carry no value from one (each/count come from the block's own
# for_each/count, which is followed separately; self is the resource itself).
_INERT_ROOTS = frozenset({"count", "each", "path", "terraform", "self"})
# Roots whose objects plan JSON does not describe: ephemeral resources and actions have no configuration
# entry, so what they read is unknown.
_OPAQUE_ROOTS = frozenset({"ephemeral", "action", "list", "resource"})
_IDENTIFIER = re.compile(r"[^\W\d][\w-]*")

_Scope = tuple[str, ...]  # module call names from the root, without instance keys
# A graph node: a resource address without any instance key (module keys included), or a pseudo node
# ("module", scope) = every resource under that module, ("wide", scope) = anything a value there may hold.
_Node = str | tuple[str, _Scope]
_Targets = dict[_Node, frozenset[str]]  # node -> reasons (empty when the edge is exact, not a widening)


class PlanFormatError(ValueError):
    """The input is not Terraform plan JSON this module can read; the message says what to do instead."""


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


class _Graph:
    """Resource nodes (no instance keys) with their known instances, plus pseudo nodes for widenings."""

    def __init__(self) -> None:
        self.instances: dict[str, set[str]] = {}
        self.scopes: dict[str, _Scope] = {}
        self.edges: dict[_Node, _Targets] = {}

    def node_of(self, address: str) -> str:
        parsed = parse_instance_address(address)
        scope = tuple(step.name for step in parsed.module)
        node = resource_address(_module_text(scope), parsed.mode, parsed.type, parsed.name)
        self.scopes.setdefault(node, scope)
        return node

    def add_instance(self, address: str) -> None:
        self.instances.setdefault(self.node_of(address), set()).add(address)

    def add_node(self, node: str, scope: _Scope) -> None:
        self.instances.setdefault(node, set())
        self.scopes.setdefault(node, scope)

    def members(self) -> dict[_Scope, list[str]]:
        """The resource nodes under each module scope (the root scope ``()`` holds them all)."""
        found: dict[_Scope, list[str]] = {}
        for node in sorted(self.instances):
            scope = self.scopes[node]
            for depth in range(len(scope) + 1):
                found.setdefault(scope[:depth], []).append(node)
        return found

    def add_state_edge(self, source: str, target: str) -> None:
        """Record that ``source`` (an instance) depends on ``target``, a resource or a whole module."""
        target_node: _Node
        try:
            target_node = self.node_of(target)
        except AddressError:
            target_node = ("module", tuple(step.name for step in parse_module_path(target)))
        else:
            self.instances.setdefault(target_node, set())
        self.link(self.node_of(source), {target_node: frozenset()})

    def link(self, source: _Node, targets: _Targets) -> None:
        mine = self.edges.setdefault(source, {})
        for target, reasons in targets.items():
            mine[target] = mine.get(target, frozenset()) | reasons

    def closure(self, start: set[str], *, upwards: bool) -> tuple[set[_Node], set[str]]:
        """Nodes reached from ``start`` along dependencies (upwards) or dependents, and the widenings made.

        A start node counts as reached only when an edge leads back to it: an instance written by the plan
        does not make its sibling instances (``web[1]`` next to ``web[0]``) read on its own.
        """
        edges = self.edges if upwards else _reverse(self.edges)
        reached: set[_Node] = set()
        visited: set[_Node] = set(start)
        warnings: set[str] = set()
        queue: deque[_Node] = deque(sorted(start))
        while queue:
            node = queue.popleft()
            for target, reasons in sorted(edges.get(node, {}).items(), key=lambda item: _sort_key(item[0])):
                if upwards:
                    warnings.update(f"{reason}: read set widened to {_glob_of(target)}" for reason in reasons)
                elif reasons and isinstance(target, str) and target not in visited:
                    warnings.update(
                        f"{reason}: {target} is read in case that value comes from a written resource"
                        for reason in reasons
                    )
                reached.add(target)
                if target not in visited:
                    visited.add(target)
                    queue.append(target)
        return reached, warnings


def _reverse(edges: Mapping[_Node, _Targets]) -> dict[_Node, _Targets]:
    reverse: dict[_Node, _Targets] = {}
    for source, targets in edges.items():
        for target, reasons in targets.items():
            reverse.setdefault(target, {})[source] = reasons
    return reverse


def _sort_key(node: _Node) -> str:
    return node if isinstance(node, str) else f"~{node[0]}:{_glob_of(node)}"


def _module_text(scope: _Scope) -> str:
    return format_module_path(tuple(ModuleStep(name) for name in scope))


def _glob_of(node: _Node) -> str:
    if isinstance(node, str):
        return f"{node}.*"
    return f"{_module_text(node[1])}.*" if node[1] else "*"


def _minimal_globs(texts: set[str]) -> tuple[str, ...]:
    """Canonical globs with every glob that another one covers left out."""
    globs = {parse_glob(text) for text in texts}
    if any(glob.is_everything for glob in globs):
        return ("*",)
    kept = (glob for glob in globs if not any(other in globs for other in _covering(glob)))
    return tuple(sorted(canonical(glob) for glob in kept))


def _covering(glob: Glob) -> Iterator[Glob]:
    """Every module or resource prefix glob, other than ``glob`` itself, that covers ``glob``.

    A prefix covers when its module steps name the same calls with the same key or none, so the candidates
    are the few variants of ``glob``'s own path; looking them up keeps this linear in the number of globs.
    """
    for steps in itertools.product(*({step, ModuleStep(step.name)} for step in glob.module)):
        for depth in range(1, len(steps) + 1):
            candidate = Glob.module_prefix(steps[:depth])
            if candidate != glob:
                yield candidate
        if glob.resource is not None:
            candidate = Glob.resource_prefix(steps, *glob.resource)
            if candidate != glob:
                yield candidate


# --- the configuration section ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Ref:
    """One reference string split into its root name and traversal steps (raw text kept for re-joining)."""

    text: str
    root: str
    steps: tuple[tuple[bool, str, str], ...]  # (is_index, name or key text, raw text)

    def joined(self, count: int) -> str:
        return self.root + "".join(raw for _, _, raw in self.steps[:count])


class _Configuration:
    """Turns the configuration section into graph edges, resolving module variables and outputs."""

    def __init__(self, root: Mapping[str, Any], graph: _Graph) -> None:
        self.graph = graph
        self.modules: dict[_Scope, Mapping[str, Any]] = {}
        self.calls: dict[_Scope, Mapping[str, Any]] = {}
        self.opaque: set[_Scope] = set()
        self.resources: list[tuple[_Scope, str, Mapping[str, Any]]] = []
        self.memo: dict[tuple[str, _Scope, str], _Targets] = {}
        self.active: set[tuple[str, _Scope, str]] = set()
        self._collect((), root)

    def _collect(self, scope: _Scope, module: Mapping[str, Any]) -> None:
        self.modules[scope] = module
        for i, resource in enumerate(module.get("resources") or ()):
            where = f"configuration of {_module_text(scope) or 'the root module'}, resources[{i}]"
            item = _object(resource, where)
            node = resource_address(
                _module_text(scope),
                _required_str(item, "mode", where),
                _required_str(item, "type", where),
                _required_str(item, "name", where),
            )
            self.graph.add_node(node, scope)
            self.resources.append((scope, node, item))
        for name, call in sorted(_object(module.get("module_calls", {}), "module_calls").items()):
            child = (*scope, name)
            self.calls[child] = _object(call, f"module call {_module_text(child)}")
            body = self.calls[child].get("module")
            if isinstance(body, Mapping):
                self._collect(child, body)
            else:
                self.opaque.add(child)

    def link(self) -> dict[str, frozenset[str]]:
        """Add every configuration edge to the graph; returns the direct references of each resource."""
        resolved: list[tuple[str, _Targets]] = []
        for scope, node, resource in self.resources:
            targets: _Targets = {}
            sources = [resource.get(key) for key in ("expressions", "count_expression", "for_each_expression")]
            sources.extend(p.get("expressions") for p in resource.get("provisioners") or () if isinstance(p, Mapping))
            for source in sources:
                _merge(targets, self._resolve_expression(scope, source, node))
            _merge(targets, self._resolve_depends_on(scope, resource.get("depends_on"), node))
            _merge(targets, self._call_targets(scope))
            self.graph.link(node, targets)
            resolved.append((node, targets))
        for scope in self.modules:
            self.graph.link(("wide", scope), self._wide_targets(scope))
        # Resolution above may have added nodes, so module membership is linked only now.
        members = self.graph.members()
        for scope, nodes in members.items():
            self.graph.link(("module", scope), {node: frozenset() for node in nodes})
        for scope in sorted(self.opaque):
            self.graph.link(("wide", scope), {("module", scope): frozenset()})
            for node in members.get(scope, ()):
                reason = f"{node} lies in {_module_text(scope)}, whose configuration the plan does not include"
                self.graph.link(node, {("wide", scope): frozenset({reason})})
        refs: dict[str, frozenset[str]] = {}
        for node, targets in resolved:
            exact: set[str] = set()
            for target, reasons in targets.items():
                if isinstance(target, str):
                    exact.add(target)
                elif target[0] == "module" and not reasons:
                    exact.update(members.get(target[1], ()))
            refs[node] = refs.get(node, frozenset()) | exact
        return dict(sorted(refs.items()))

    def _wide_targets(self, scope: _Scope) -> _Targets:
        """What a value in ``scope`` may come from: any resource under it, any of its inputs."""
        targets: _Targets = {("module", scope): frozenset()}
        if scope:
            module = self.modules[scope]
            names = set(_object(module.get("variables", {}), "variables")) | set(self._call_arguments(scope))
            for name in sorted(names):
                _merge(targets, self._resolve_variable(scope, name))
            _merge(targets, self._call_targets(scope))
        return targets

    def _call_arguments(self, scope: _Scope) -> Mapping[str, Any]:
        return _object(self.calls[scope].get("expressions", {}), f"module call {_module_text(scope)} expressions")

    def _memoized(self, kind: str, scope: _Scope, name: str, compute: Callable[[], _Targets]) -> _Targets:
        key = (kind, scope, name)
        if key in self.memo:
            return self.memo[key]
        if key in self.active:
            # Terraform rejects cycles, so this is unreachable for a valid plan; widening keeps it safe anyway.
            return {("wide", scope): frozenset({f"reference cycle through {kind} {name} of {_module_text(scope)}"})}
        self.active.add(key)
        try:
            result = compute()
        finally:
            self.active.discard(key)
        self.memo[key] = result
        return result

    def _resolve_variable(self, scope: _Scope, name: str) -> _Targets:
        """Where input variable ``name`` of the module at ``scope`` gets its value: its call's argument."""

        def compute() -> _Targets:
            parent = scope[:-1]
            where = f"argument {name} of module call {_module_text(scope)}"
            targets = self._resolve_expression(parent, self._call_arguments(scope).get(name), where)
            _merge(targets, self._call_targets(scope))  # each.value/count.index come from the call's for_each/count
            return targets

        return self._memoized("variable", scope, name, compute)

    def _resolve_output(self, scope: _Scope, name: str, text: str, where: str) -> _Targets:
        if scope not in self.modules:
            reason = f"{where} references {text}, but the plan has no configuration for {_module_text(scope)}"
            return {("wide", scope): frozenset({reason})}
        output = _object(self.modules[scope].get("outputs", {}), "outputs").get(name)
        if not isinstance(output, Mapping):
            reason = f"{where} references {text}, which is not an output of {_module_text(scope)} in the plan"
            return {("wide", scope): frozenset({reason})}

        def compute() -> _Targets:
            here = f"output {name} of {_module_text(scope)}"
            targets = self._resolve_expression(scope, output.get("expression"), here)
            _merge(targets, self._resolve_depends_on(scope, output.get("depends_on"), here))
            _merge(targets, self._call_targets(scope))
            return targets

        return self._memoized("output", scope, name, compute)

    def _call_targets(self, scope: _Scope) -> _Targets:
        """What every object in the module at ``scope`` depends on: its calls' count, for_each and depends_on."""
        if not scope:
            return {}

        def compute() -> _Targets:
            call = self.calls[scope]
            parent = scope[:-1]
            where = f"module call {_module_text(scope)}"
            targets: _Targets = {}
            for key in ("count_expression", "for_each_expression"):
                _merge(targets, self._resolve_expression(parent, call.get(key), where))
            _merge(targets, self._resolve_depends_on(parent, call.get("depends_on"), where))
            _merge(targets, self._call_targets(parent))
            return targets

        return self._memoized("call", scope, "", compute)

    def _resolve_depends_on(self, scope: _Scope, entries: object, where: str) -> _Targets:
        targets: _Targets = {}
        for entry in entries if isinstance(entries, list) else ():
            ref = _parse_ref(entry) if isinstance(entry, str) else None
            if ref is not None and ref.root == "module" and len(ref.steps) == 1:
                # depends_on a module means on everything inside it: that is exact, not a widening.
                targets[("module", (*scope, ref.steps[0][1]))] = frozenset()
            elif isinstance(entry, str):
                _merge(targets, self._resolve_reference(scope, entry, ref, len(ref.steps) if ref else 0, where))
        return targets

    def _resolve_expression(self, scope: _Scope, expression: object, where: str) -> _Targets:
        targets: _Targets = {}
        for references in _reference_lists(expression):
            for text, ref, subject in _heads(references):
                _merge(targets, self._resolve_reference(scope, text, ref, subject, where))
        return targets

    def _resolve_reference(self, scope: _Scope, text: str, ref: _Ref | None, subject: int, where: str) -> _Targets:
        module = _module_text(scope) or "the root module"
        if ref is None or ref.root in _OPAQUE_ROOTS:
            reason = f"{where} references {text}, which plan JSON does not describe"
            return {("wide", scope): frozenset({reason})}
        steps = ref.steps
        if ref.root in _INERT_ROOTS:
            return {}
        if ref.root == "var" and steps and not steps[0][0]:
            return self._resolve_variable(scope, steps[0][1]) if scope else {}
        if ref.root == "local" and steps and not steps[0][0]:
            reason = f"{where} references {ref.joined(1)} in {module}, and plan JSON leaves out what locals refer to"
            return {("wide", scope): frozenset({reason})}
        if ref.root == "module" and steps and not steps[0][0]:
            child = (*scope, steps[0][1])
            output = subject - 1  # the subject's last step is the output name when it names one
            if subject >= 2 and not steps[output][0]:
                return self._resolve_output(child, steps[output][1], text, where)
            reason = f"{where} references the whole module {ref.joined(subject)}"
            return {("wide", child): frozenset({reason})}
        if ref.root == "data" and len(steps) >= 2 and not steps[0][0] and not steps[1][0]:
            return {self._resource(scope, "data", steps[0][1], steps[1][1]): frozenset()}
        if steps and not steps[0][0] and ref.root not in ("var", "local", "module", "data"):
            return {self._resource(scope, "managed", ref.root, steps[0][1]): frozenset()}
        reason = f"{where} references {text}, which plan JSON does not describe"
        return {("wide", scope): frozenset({reason})}

    def _resource(self, scope: _Scope, mode: str, type_: str, name: str) -> str:
        node = resource_address(_module_text(scope), mode, type_, name)
        self.graph.add_node(node, scope)
        return node


def _merge(into: _Targets, more: _Targets) -> None:
    for node, reasons in more.items():
        into[node] = into.get(node, frozenset()) | reasons


def _reference_lists(value: object) -> Iterator[list[str]]:
    """Every ``references`` list in an expression or a nested block of expressions."""
    if isinstance(value, Mapping):
        references = value.get("references")
        if set(value) <= {"references", "constant_value"} and isinstance(references, list):
            yield [r for r in references if isinstance(r, str)]
        elif not set(value) <= {"constant_value"}:
            for item in value.values():
                yield from _reference_lists(item)
    elif isinstance(value, list):
        for item in value:
            yield from _reference_lists(item)


def _heads(references: list[str]) -> Iterator[tuple[str, _Ref | None, int]]:
    """The references written in the expression, without the shorter forms Terraform derives from each.

    Terraform lists ``module.child.result`` as ``["module.child.result", "module.child"]``; the second entry
    is derived, not a reference to the whole module. An entry that does not follow that pattern is kept as
    written, so an unexpected format only ever widens.
    """
    i = 0
    while i < len(references):
        text = references[i]
        ref = _parse_ref(text)
        subject = _subject_length(ref) if ref is not None else None
        if ref is None or subject is None:
            yield text, ref, len(ref.steps) if ref is not None else 0
            i += 1
            continue
        derived = [ref.joined(n) for n in range(len(ref.steps), subject - 1, -1)]
        extra = _derived_subject(ref, subject)
        if extra is not None:
            derived.append(extra)
        i += len(derived) if references[i : i + len(derived)] == derived else 1
        yield text, ref, subject


def _subject_length(ref: _Ref) -> int | None:
    """How many steps of ``ref`` name the referenced object (as Terraform's ``addrs.ParseRef`` splits it)."""
    steps = ref.steps
    is_index = [step[0] for step in steps]
    if ref.root == "self":
        return 0
    if not steps or is_index[0]:
        return None
    if ref.root in ("var", "local", "count", "each", "path", "terraform"):
        return 1
    if ref.root == "module":
        if len(steps) == 1:
            return 1
        if is_index[1]:
            return 2 if len(steps) == 2 else (3 if not is_index[2] else None)
        return 2
    if ref.root in ("data", *_OPAQUE_ROOTS):
        if len(steps) < 2 or is_index[1]:
            return None
        return 3 if len(steps) > 2 and is_index[2] else 2
    return 2 if len(steps) > 1 and is_index[1] else 1


def _derived_subject(ref: _Ref, subject: int) -> str | None:
    """The extra entry Terraform adds after a subject: the keyless resource or module call, or the module."""
    if ref.root == "module":
        return ref.joined(subject - 1) if subject >= 2 else None
    if subject >= 2 and ref.steps[subject - 1][0] and ref.root not in _INERT_ROOTS | {"var", "local"}:
        return ref.joined(subject - 1)
    return None


def _parse_ref(text: str) -> _Ref | None:
    match = _IDENTIFIER.match(text)
    if match is None:
        return None
    root = match.group()
    pos = match.end()
    steps: list[tuple[bool, str, str]] = []
    while pos < len(text):
        if text[pos] == ".":
            match = _IDENTIFIER.match(text, pos + 1)
            if match is None:
                return None
            steps.append((False, match.group(), text[pos : match.end()]))
            pos = match.end()
        elif text[pos] == "[":
            end = _index_end(text, pos)
            if end is None:
                return None
            steps.append((True, text[pos + 1 : end], text[pos : end + 1]))
            pos = end + 1
        else:
            return None
    return _Ref(text, root, tuple(steps))


def _index_end(text: str, start: int) -> int | None:
    """The position of the ``]`` closing the index that opens at ``start``."""
    pos = start + 1
    if text.startswith('"', pos):
        pos += 1
        while pos < len(text) and text[pos] != '"':
            pos += 2 if text[pos] == "\\" else 1
        pos += 1
    end = text.find("]", pos)
    return None if end < 0 else end


# --- JSON helpers -----------------------------------------------------------------------------------------


def _object(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise PlanFormatError(f"{where} must be a JSON object: {_RUN_SHOW}")
    return value


def _list_of(plan: Mapping[str, Any], key: str) -> list[Any]:
    value = plan.get(key, [])
    if not isinstance(value, list):
        raise PlanFormatError(f"{key} must be a list: {_RUN_SHOW}")
    return value


def _required_str(item: Mapping[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise PlanFormatError(f"{where} has no {key}: {_RUN_SHOW}")
    return value


def _optional_str(item: Mapping[str, Any], key: str, where: str) -> str:
    value = item.get(key, "")
    if not isinstance(value, str):
        raise PlanFormatError(f"{where}.{key} must be a string: {_RUN_SHOW}")
    return value


def _checked(address: str, where: str) -> str:
    try:
        parse_instance_address(address)
    except AddressError as exc:
        raise PlanFormatError(f"{where}: {exc}: {_RUN_SHOW}") from exc
    return address
