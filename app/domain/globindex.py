"""An index of reservation globs that finds the ones a glob intersects without comparing against each.

Held globs are stored in a trie over their structured steps: module steps (name and instance key), then
the resource ``(mode, type, name)``, then an exact glob's instance key; type globs (``TYPE.*``) sit at
their module's node under ``(mode, type)``. A query walks only the branches
whose names agree with its own steps, so its cost follows the globs it actually meets, not everything
held: 1,000 requested against 2,000 held globs costs about 1,000 short walks, never 2,000,000 pairwise
``intersects`` calls. Root outputs sit in their own dictionary by name, output name prefixes
(``output.payments_*``) in one by prefix (a name query looks up each of its own prefixes), and ``*`` in
its own list.

The answers are exactly ``analyzer.globs.intersects`` (the tests check the index against it by brute
force); keyless module steps of prefix globs are wildcards, an exact glob's keyless step means "no key".
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from analyzer.addresses import ModuleStep
from analyzer.globs import Glob, GlobKind

T = TypeVar("T")

# A module step's key as indexed: ("k", key) for a written key, ANY for a prefix glob's keyless step
# (any key or none), NONE for an exact glob's keyless step (no key at all).
_Label = tuple[object, ...]
ANY: _Label = ("any",)
NONE: _Label = ("none",)


def _label(step: ModuleStep, *, wildcard: bool) -> _Label:
    if step.key is None:
        return ANY if wildcard else NONE
    return ("k", step.key)


def _key_label(key: object) -> _Label:
    return NONE if key is None else ("k", key)


@dataclass(slots=True)
class _ResourceNode(Generic[T]):
    prefixes: list[tuple[Glob, T]] = field(default_factory=list)  # TYPE.NAME.*: any instance key
    exact: dict[_Label, list[tuple[Glob, T]]] = field(default_factory=dict)

    def all(self) -> Iterator[tuple[Glob, T]]:
        yield from self.prefixes
        for items in self.exact.values():
            yield from items


@dataclass(slots=True)
class _ModuleNode(Generic[T]):
    # module name -> key label -> child
    children: dict[str, dict[_Label, _ModuleNode[T]]] = field(default_factory=dict)
    modules: list[tuple[Glob, T]] = field(default_factory=list)  # module prefixes ending here
    resources: dict[tuple[str, str, str], _ResourceNode[T]] = field(default_factory=dict)
    types: dict[tuple[str, str], list[tuple[Glob, T]]] = field(default_factory=dict)  # TYPE.* here

    def all(self) -> Iterator[tuple[Glob, T]]:
        yield from self.modules
        for items in self.types.values():
            yield from items
        for node in self.resources.values():
            yield from node.all()
        for group in self.children.values():
            for child in group.values():
                yield from child.all()


class GlobIndex(Generic[T]):
    """Globs with a payload each (a held reservation, a waiter, …); ``meeting(glob)`` yields the
    ``(glob, payload)`` entries whose globs intersect ``glob``, each once."""

    def __init__(self, entries: Iterable[tuple[Glob, T]] = ()) -> None:
        self._everything: list[tuple[Glob, T]] = []
        self._all_outputs: list[tuple[Glob, T]] = []
        self._outputs: dict[str, list[tuple[Glob, T]]] = {}
        self._output_prefixes: dict[str, list[tuple[Glob, T]]] = {}
        self._root: _ModuleNode[T] = _ModuleNode()
        self._size = 0
        for glob, payload in entries:
            self.add(glob, payload)

    def __len__(self) -> int:
        return self._size

    def add(self, glob: Glob, payload: T) -> None:
        self._size += 1
        entry = (glob, payload)
        if glob.kind is GlobKind.EVERYTHING:
            self._everything.append(entry)
            return
        if glob.kind is GlobKind.OUTPUTS:
            self._all_outputs.append(entry)
            return
        if glob.kind is GlobKind.OUTPUT:
            self._outputs.setdefault(str(glob.output), []).append(entry)
            return
        if glob.kind is GlobKind.OUTPUT_PREFIX:
            self._output_prefixes.setdefault(str(glob.output), []).append(entry)
            return
        node = self._root
        wildcard = glob.kind is not GlobKind.EXACT
        for step in glob.module:  # get before create: building nodes is most of an add's cost
            group = node.children.get(step.name)
            if group is None:
                group = node.children[step.name] = {}
            label = _label(step, wildcard=wildcard)
            below = group.get(label)
            if below is None:
                below = group[label] = _ModuleNode()
            node = below
        if glob.resource_type is not None:
            node.types.setdefault(glob.resource_type, []).append(entry)
            return
        if glob.resource is None:
            node.modules.append(entry)
            return
        resource = node.resources.get(glob.resource)
        if resource is None:
            resource = node.resources[glob.resource] = _ResourceNode()
        if glob.kind is GlobKind.EXACT:
            key = _key_label(glob.key)
            same = resource.exact.get(key)
            if same is None:
                resource.exact[key] = [entry]
            else:
                same.append(entry)
        else:
            resource.prefixes.append(entry)

    def meeting(self, glob: Glob) -> Iterator[tuple[Glob, T]]:
        """Every entry whose glob intersects ``glob``."""
        if glob.kind is GlobKind.EVERYTHING:
            yield from self._everything
            yield from self._every_output()
            yield from self._root.all()
            return
        yield from self._everything
        if glob.kind is GlobKind.OUTPUTS:
            yield from self._every_output()
            return
        if glob.kind is GlobKind.OUTPUT:
            name = str(glob.output)
            yield from self._all_outputs
            yield from self._outputs.get(name, ())
            if self._output_prefixes:
                for end in range(1, len(name) + 1):
                    yield from self._output_prefixes.get(name[:end], ())
            return
        if glob.kind is GlobKind.OUTPUT_PREFIX:
            prefix = str(glob.output)
            yield from self._all_outputs
            for name, items in self._outputs.items():
                if name.startswith(prefix):
                    yield from items
            for held, items in self._output_prefixes.items():
                if held.startswith(prefix) or prefix.startswith(held):
                    yield from items
            return
        yield from self._walk(self._root, glob, 0)

    def _every_output(self) -> Iterator[tuple[Glob, T]]:
        yield from self._all_outputs
        for items in self._outputs.values():
            yield from items
        for items in self._output_prefixes.values():
            yield from items

    def any_meeting(self, glob: Glob) -> bool:
        return next(self.meeting(glob), None) is not None

    def _walk(self, node: _ModuleNode[T], glob: Glob, depth: int) -> Iterator[tuple[Glob, T]]:
        if depth:
            yield from node.modules  # a module prefix above or at the query's path covers part of it
        if depth == len(glob.module):
            if glob.resource_type is not None:  # a type glob meets every resource of its type here
                yield from node.types.get(glob.resource_type, ())
                for (mode, type_, _), resource in node.resources.items():
                    if (mode, type_) == glob.resource_type:
                        yield from resource.all()
                return
            if glob.resource is None:  # a module prefix covers everything below its path
                for group in node.children.values():
                    for child in group.values():
                        yield from child.all()
                for items in node.types.values():
                    yield from items
                for resource in node.resources.values():
                    yield from resource.all()
                return
            yield from node.types.get(glob.resource[:2], ())
            found = node.resources.get(glob.resource)
            if found is None:
                return
            if glob.kind is GlobKind.EXACT:
                yield from found.prefixes
                yield from found.exact.get(_key_label(glob.key), ())
            else:
                yield from found.all()
            return
        step = glob.module[depth]
        group = node.children.get(step.name, {})
        label = _label(step, wildcard=glob.kind is not GlobKind.EXACT)
        if label is ANY:
            for child in group.values():
                yield from self._walk(child, glob, depth + 1)
            return
        for candidate in (label, ANY):
            below = group.get(candidate)
            if below is not None:
                yield from self._walk(below, glob, depth + 1)
