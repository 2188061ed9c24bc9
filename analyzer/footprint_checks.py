"""Checks on the members of a footprint (file functions, remote state, module sources, override files, the
sources of moved and removed blocks) and on block labels, as a mixin of ``analyzer.footprint``'s footprinter:
each one only adds diagnostics.

Must not do I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from analyzer.addresses import declared_address
from analyzer.footprint_rules import FILE_FUNCTIONS, is_local_source, json_document_declarations
from analyzer.hcl import HclError, analyze_file

__all__ = ["NAMED", "Checks", "labels_valid"]

NAMED = {"resource": 2, "data": 2, "ephemeral": 2, "action": 2, "module": 1, "variable": 1, "output": 1, "check": 1}
# Terraform's hclsyntax.ValidIdentifier: the rule for every name and type label of a named block.
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def labels_valid(type_: str, labels: tuple[str, ...]) -> bool:
    """Whether Terraform accepts a block's labels as names (only named block types are checked)."""
    return type_ not in NAMED or all(_IDENTIFIER.fullmatch(label) for label in labels)


class Checks:
    """Diagnostics a footprinter adds about what it holds (it provides ``files``, ``overrides``, ``cache``,
    ``index``, ``_diagnose`` and ``_parse_failure``)."""

    __slots__ = ()
    files: Any
    overrides: list[str]
    cache: Any
    index: Any

    def _diagnose(self, construct: str, file: str, line: int, detail: str) -> None:
        raise NotImplementedError

    def _parse_failure(self, path: str, exc: HclError) -> None:
        raise NotImplementedError

    def _valid_labels(self, path: str, line: int, type_: str, labels: tuple[str, ...]) -> bool:
        """Whether Terraform accepts the block's name labels; a diagnostic (not an AddressError) when not."""
        if type_ not in NAMED:
            return True
        for label in labels:
            if _IDENTIFIER.fullmatch(label):
                continue
            self._diagnose("invalid_label", path, line, f'{type_} {" ".join(json.dumps(x) for x in labels)}: '
                           f"{label!r} is not a valid name: fix `{path}:{line}`")
            return False
        return True

    def _check_member(self, member: Any) -> None:
        block = member.block
        functions = member.local.functions if member.local else block.functions
        name = f"local.{member.local.name}" if member.local else block.address
        line = member.local.span.start_line if member.local else block.span.start_line
        for function in dict.fromkeys(functions):
            if function in FILE_FUNCTIONS:
                self._diagnose("file_function", block.file, line, f"{name} calls {function}(), which reads files "
                               "next to the configuration: copy the configuration directory's other files "
                               "(templates, scripts, JSON) into the workspace")
        if member.local is not None:
            return
        if block.type == "data" and block.labels[:1] == ("terraform_remote_state",):
            self._diagnose("remote_state", block.file, line, f"{block.address} reads another state's outputs, which "
                           "no reservation here covers: it is read as it is at plan time")
        if block.type == "module" and block.module_source is None:
            self._diagnose("module_source_missing", block.file, line, f"{block.address} has no literal source")
        elif block.type == "module" and block.module_source and not is_local_source(block.module_source):
            self._diagnose("module_source_remote", block.file, line, f"{block.address} comes from "
                           f"{block.module_source!r}, whose contents are not analysed: every address under "
                           f"{block.address}.* is covered, and terraform init must fetch it")

    def _check_overrides(self, members: Iterable[Any]) -> None:
        if not self.overrides:
            return
        names = {f"local.{m.local.name}" if m.local else m.block.address for m in members}
        for path in self.overrides:
            text = self.files[path]
            if path.endswith(".json"):
                declarations = json_document_declarations(text)
                if declarations is None:
                    self._diagnose("parse_error", path, 1, "cannot parse the JSON override file")
                overridden = {declared_address(t, labels) for t, labels in declarations or ()}
            else:
                try:
                    blocks = analyze_file(path, text, cache=self.cache).blocks
                except HclError as exc:
                    self._parse_failure(path, exc)
                    continue
                overridden = {f"local.{d.name}" for b in blocks for d in b.locals} | {b.address for b in blocks}
            for address in sorted(a for a in overridden if a and a in names):
                self._diagnose("override_file", path, 1, f"this override file changes {address}, which the "
                               "workspace contains")

    def _check_migration_sources(self, write_roots: Iterable[Any]) -> None:
        """A moved or removed block must not take away an object the configuration still declares."""
        for member in write_roots:
            block = member.block
            if block.type not in ("moved", "removed") or not block.targets or "[" in block.targets[0]:
                continue
            source = block.targets[0]
            if source.startswith("module.") and source.count(".") > 1:
                continue  # an object inside a module: declared in the module's files, not here
            if block.type == "moved" and len(block.targets) > 1 and block.targets[1].split("[", 1)[0] == source:
                continue  # moved to a keyed instance of itself: how Terraform adopts count/for_each
            if declared := self.index.get(source):
                where = ", ".join(sorted({d.path for d in declared}))
                self._diagnose("migration_source_declared", block.file, block.span.start_line,
                               f"this {block.type} block takes {source} away, but {where} still declares it")
