"""Reading a plan's ``configuration`` section into graph edges: references of resources, module
calls, variables and outputs, with the widening rules for what plan JSON cannot show.

Pure, no I/O; used by ``analyzer.plan``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from analyzer.addresses import (
    resource_address,
)
from analyzer.plan_graph import (
    _IDENTIFIER,
    _INERT_ROOTS,
    _OPAQUE_ROOTS,
    _Graph,
    _module_text,
    _object,
    _required_str,
    _Scope,
    _Targets,
)


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
