"""The footprint's reverse closure: every block of the configuration that reads what the selection writes or
defines joins the plan.

A full ``terraform apply`` re-plans every block whose inputs change. When the selected files write a resource
or a module call, or define a local value or a variable, the blocks of *other* files that refer to those
objects — directly or through a chain of locals, data sources and other resources — would change too, and
Terraform records no dependency in the state for locals, variables or outputs, so the trunk cannot tell. This
module walks that direction of the configuration graph:

- resources and module calls that refer to the frontier are written (copied into the workspace, their
  addresses added to the write globs) and join the frontier;
- data sources, ephemeral resources and local values that refer to it are copied (data sources read) and
  join the frontier, so what reads *them* is found too;
- root outputs that refer to it are planned and committed (``Footprint.outputs``);
- check blocks that refer to it are copied, so their assertions run against the new values;
- a provider configuration that refers to it fails closed (which resources use a provider configuration
  follows from types and ``provider`` arguments across the whole configuration, not from references);
- a ``.tf.json`` file whose text refers to it fails closed (JSON bodies are not read as expressions here).

Candidates are found by text (``analyzer.graph``), so only the blocks that may refer to the frontier are
parsed, from the content-hash cache when warm. Must not do I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from analyzer.blocks import Block
from analyzer.footprint_rules import is_override_file
from analyzer.graph import ReferenceMatcher

__all__ = ["Consumers"]

_WRITTEN = frozenset({"resource", "module"})
_PASS_THROUGH = frozenset({"data", "ephemeral"})


class _Host(Protocol):
    files: Any
    selected: tuple[str, ...]
    index: Any  # footprint_index.DefinitionIndex
    outputs: set[str]

    def _block(self, definition: Any) -> Block | None: ...
    def _owned_globs(self, block: Block) -> list[str]: ...
    def _diagnose(self, construct: str, file: str, line: int, detail: str) -> None: ...


class Consumers:
    """One footprint's reverse closure; ``pull`` may be called again after the write side grew."""

    def __init__(self, host: _Host, selected_blocks: Iterable[Block], member: Callable[..., Any],
                 seeds: Iterable[str] = ()) -> None:
        self._host = host
        self._member = member
        self._done: set[str] = set()
        self._seen: set[tuple[str, int]] = {(b.file, b.span.start_pos) for b in selected_blocks}
        self._frontier: set[str] = set(seeds)
        for block in selected_blocks:
            self._frontier.update(_defined(block))

    def pull(self, write_roots: list[Any], writes: set[str]) -> None:
        """Add to ``write_roots``/``writes`` every block that refers, transitively, to what they hold."""
        for member in write_roots:
            if member.local is None:
                self._seen.add((member.block.file, member.block.span.start_pos))
                self._frontier.update(a for a in _defined(member.block) if a not in self._done)
        while self._frontier:
            frontier, self._frontier = self._frontier - self._done, set()
            self._done |= frontier
            matcher = ReferenceMatcher(frontier)
            if not matcher:
                continue
            for path in sorted(self._host.files):
                if path in self._host.selected or is_override_file(path) or not path.endswith((".tf", ".tf.json")):
                    continue
                text = self._host.files[path]
                hits = list(matcher.hits(text))
                if not hits:
                    continue
                if path.endswith(".tf.json"):
                    names = ", ".join(sorted({h.address for h in hits}))
                    self._host._diagnose("tf_json", path, _line(text, hits[0].pos), f"this JSON configuration file "
                                         f"may refer to {names}, which the selection writes or defines, and JSON "
                                         "bodies are not analysed")
                    continue
                for hit in hits:
                    self._consider(path, hit.pos, hit.address, write_roots, writes)

    def _consider(self, path: str, pos: int, address: str, write_roots: list[Any], writes: set[str]) -> None:
        definition = _enclosing(self._host.index.defs(path), pos)
        if definition is None:
            return  # between blocks: a comment
        block = self._host._block(definition)
        if block is None:
            return  # it does not parse: the footprint already fails closed on it
        if block.type == "locals":
            for local in block.locals:
                if any(r.address == address for r in local.references):
                    self._frontier.add(f"local.{local.name}")
            return
        if not any(r.address == address for r in block.references):
            return
        key = (block.file, block.span.start_pos)
        if key in self._seen:
            return
        if block.type in _WRITTEN or block.type in _PASS_THROUGH:
            self._seen.add(key)
            write_roots.append(self._member(block))
            writes.update(self._host._owned_globs(block))
            self._frontier.add(block.address)
            verb = "written" if block.type in _WRITTEN else "read again"
            self._host._diagnose("consumer", block.file, block.span.start_line, f"{block.address} refers to "
                                 f"{address}, which the selection writes or defines: it is planned too ({verb})")
        elif block.type == "output" and block.labels:
            self._seen.add(key)
            write_roots.append(self._member(block))
            self._host.outputs.add(block.labels[0])
            self._host._diagnose("consumer", block.file, block.span.start_line, f"{block.address} refers to "
                                 f"{address}, which the selection writes or defines: the output is planned and "
                                 "committed")
        elif block.type == "check":
            self._seen.add(key)
            write_roots.append(self._member(block))
            writes.update(self._host._owned_globs(block))
        elif block.type == "provider":
            self._host._diagnose("provider_consumer", block.file, block.span.start_line, f"{block.address} is "
                                 f"configured from {address}, which the selection writes or defines: every "
                                 "resource using that provider configuration could change")


def _defined(block: Block) -> list[str]:
    """The objects a block defines that other blocks can refer to."""
    if block.type == "locals":
        return [f"local.{local.name}" for local in block.locals]
    if block.type in ("resource", "data", "ephemeral", "module", "variable"):
        return [block.address]
    return []


def _enclosing(definitions: Iterable[Any], pos: int) -> Any | None:
    for definition in definitions:
        if definition.is_json:
            continue
        span = definition.header if definition.header is not None else (
            definition.block.span if definition.block is not None else None)
        if span is not None and span.start_pos <= pos < span.end_pos:
            return definition
    return None


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1
