"""The plan analysis' graph: resource-level nodes, their edges, and the globs they become.

Shared by ``analyzer.plan`` and ``analyzer.plan_config``; pure, no I/O.
"""

from __future__ import annotations

import itertools
import re
from collections import deque
from collections.abc import Iterator, Mapping
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
from analyzer.jsonfields import is_list, is_string, is_text, member

_RUN_SHOW = "save the plan with `terraform plan -out=PLANFILE`, then pass the output of `terraform show -json PLANFILE`"


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
            yield Glob.type_prefix(steps, *glob.resource[:2])


def _object(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise PlanFormatError(f"{where} must be a JSON object: {_RUN_SHOW}")
    return value


def _list_of(plan: Mapping[str, Any], key: str) -> list[Any]:
    return member(plan, key, is_list, lambda: PlanFormatError(f"{key} must be a list: {_RUN_SHOW}"), [])


def _required_str(item: Mapping[str, Any], key: str, where: str) -> str:
    return member(item, key, is_text, lambda: PlanFormatError(f"{where} has no {key}: {_RUN_SHOW}"))


def _optional_str(item: Mapping[str, Any], key: str, where: str) -> str:
    return member(item, key, is_string, lambda: PlanFormatError(f"{where}.{key} must be a string: {_RUN_SHOW}"), "")


def _checked(address: str, where: str) -> str:
    try:
        parse_instance_address(address)
    except AddressError as exc:
        raise PlanFormatError(f"{where}: {exc}: {_RUN_SHOW}") from exc
    return address
