"""The pure side of file-scoped plans around the footprint: what deleted files declared, which files declare
what, which files the trunk's dependents widen a selection to, how a ``--changed-from`` scope becomes a
selection, where local module sources lie, and how the footprint's blocks are cut out of their files.

``runner.core.filescoped`` reads the files, talks to the server and runs Terraform; everything here is a function
of texts and values. Must not do I/O.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from analyzer.addresses import AddressError, declared_address, parse_instance_address, resource_address
from analyzer.footprint import Footprint
from analyzer.footprint_rules import FILE_FUNCTIONS, is_local_source, json_document_declarations
from analyzer.gitdiff import ChangeScope, WidenKind
from analyzer.globs import Glob, GlobError, intersects, matches, parse_glob
from analyzer.hcl import ParseCache, analyze_file, tfvars_values
from analyzer.prescan import scan

__all__ = [
    "Deletions",
    "LOCALS_FILE",
    "ScopeRefused",
    "Selection",
    "changed_variables",
    "cut_blocks",
    "declaring_files",
    "deletions",
    "dependents_to_add",
    "file_readers",
    "described_in",
    "local_module_sources",
    "output_globs",
    "selection_from_changes",
]

LOCALS_FILE = "kilolock_locals.tf"


class ScopeRefused(Exception):
    """A change that cannot be scoped to files: ``exit_code`` 3 (a full plan is needed) or 0 (nothing to do)."""

    def __init__(self, exit_code: int, message: str) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True, slots=True)
class Selection:
    """What to plan: configuration-relative .tf files, files deleted since a git ref (their text at the ref)
    whose declared addresses must be planned for destruction, and variables whose values changed (``var.NAME``:
    their consumers are planned as if a selected file defined them)."""

    files: tuple[str, ...]
    deleted: Mapping[str, str] = field(default_factory=dict)
    variables: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Deletions:
    """What a change removed from the configuration: ``globs`` (``T.N.*``, ``data.T.N.*``, ``module.N.*``) for
    the resources, data sources and module calls the earlier texts declared and no file declares now (their
    rows are destroyed or dropped: part of the write footprint), and ``outputs``, the root outputs likewise
    gone (the commit removes them from the trunk)."""

    globs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()


def deletions(deleted: Mapping[str, str], files: Mapping[str, str]) -> Deletions:
    """What the ``deleted`` texts (deleted files, and the earlier texts of changed ones) declared that none of
    ``files`` (the configuration now) declares: a block moved to another file is not deleted. Ephemeral
    resources and actions never have state rows. A ``.tf.json`` text that does not parse counts as declaring
    nothing now (the footprint fails closed on it), and as nothing deleted. Without deleted texts nothing
    is deleted, and the configuration is not scanned at all (its cost would follow its size)."""
    before_addresses, before_outputs = _declared(deleted)
    if not before_addresses and not before_outputs:
        return Deletions()
    now_addresses, now_outputs = _declared(files)
    globs = sorted(a + ".*" for a in before_addresses - now_addresses)
    return Deletions(tuple(globs), tuple(sorted(before_outputs - now_outputs)))


def _declared(texts: Mapping[str, str]) -> tuple[set[str], set[str]]:
    """Root-level resource, data source and module-call addresses, and root output names, the texts declare."""
    addresses: set[str] = set()
    outputs: set[str] = set()
    for name, text in texts.items():
        if name.split("@", 1)[0].endswith(".tf.json"):
            pairs = json_document_declarations(text) or []
        else:
            pairs = [(h.type, h.labels) for h in scan(text).headers]
        for type_, labels in pairs:
            if type_ == "output" and labels:
                outputs.add(labels[0])
            elif type_ in ("resource", "data", "module"):
                address = _header_address(type_, labels)
                if address is not None:
                    addresses.add(address)
    return addresses, outputs


# How many labels a declaration with an address of its own carries.
_ADDRESS_LABELS = {"resource": 2, "data": 2, "ephemeral": 2, "action": 2, "module": 1}


def _header_address(type_: str, labels: tuple[str, ...]) -> str | None:
    """The root-level address a block header declares (``T.N``, ``data.T.N``, ``module.N`` …), else None."""
    count = _ADDRESS_LABELS.get(type_)
    if count is None or len(labels) < count:
        return None
    return declared_address(type_, labels[:count])


def output_globs(names: Iterable[str]) -> tuple[str, ...]:
    """The write reservations of the root outputs a plan changes: ``output.NAME`` — the one place they are made."""
    found: list[str] = []
    for name in sorted(set(names)):
        text = f"output.{name}"
        try:
            parse_glob(text)
        except ValueError:
            continue  # a server whose glob grammar has no outputs needs no reservation for them
        found.append(text)
    return tuple(found)


def described_in(fp: Footprint, extra: Iterable[str] = ()) -> tuple[str, ...]:
    """Configuration-level addresses whose trunk rows the slice carries: the workspace's resource and
    module blocks (``module.NAME.*``), plus every written address — a ``moved`` source or a deleted
    declaration must be in the slice for Terraform to move or destroy it. Read globs add nothing: a row they
    name without a block in the workspace (a resource the trunk's dependencies name and the configuration no
    longer reaches) would be planned for destruction; it is reserved for reading, never carried."""
    names: set[str] = set()
    for block in fp.blocks:
        if block.type in ("resource", "data", "ephemeral"):
            names.add(block.name)
        elif block.type == "module":
            names.add(block.name + ".*")
    for glob in (*fp.write_globs, *extra):
        if glob.startswith("output."):
            continue
        try:
            parsed: Glob | None = parse_glob(glob)
        except GlobError:
            parsed = None
        if parsed is not None and parsed.module:
            names.add(f"module.{parsed.module[0].name}.*")
        elif parsed is not None and parsed.resource is not None:
            names.add(resource_address("", *parsed.resource))
        else:  # ``*``: kept as written, it names no configuration address
            names.add((glob[:-2] if glob.endswith(".*") else glob).split("[", 1)[0])
    return tuple(sorted(names))


def declaring_files(files: Mapping[str, str]) -> dict[str, str]:
    """Root-level resource/data address or ``module.NAME`` → the file declaring it (prescan only)."""
    found: dict[str, str] = {}
    for name, text in files.items():
        if not name.endswith(".tf"):
            continue
        for header in scan(text).headers:
            address = _header_address(header.type, header.labels)
            if address is not None:
                found[address] = name
    return found


def _declared_by(address: str, declarations: Mapping[str, str]) -> str | None:
    try:
        parsed = parse_instance_address(address)
    except AddressError:
        return None
    if parsed.module:
        return declarations.get(f"module.{parsed.module[0].name}")
    return declarations.get(parsed.resource_address)


def dependents_to_add(edges: Iterable[tuple[str, str]], write_globs: Sequence[str],
                      declarations: Mapping[str, str], selected: Iterable[str]) -> dict[str, str]:
    """Files declaring trunk resources that depend on something this change writes: a full apply
    would re-plan them, so the file-scoped one must too. file → why."""
    globs = [parse_glob(g) for g in write_globs if not g.startswith("output.")]
    chosen = set(selected)
    added: dict[str, str] = {}
    for address, depends_on in edges:
        if any(matches(g, address) for g in globs):
            continue
        target = parse_glob(depends_on + ".*")
        if not any(matches(g, depends_on) or intersects(g, target) for g in globs):
            continue
        file = _declared_by(address, declarations)
        if file and file not in chosen and file not in added:
            added[file] = f"{address} depends on {depends_on}, which this change writes"
    return added


def cut_blocks(files: Mapping[str, str], fp: Footprint) -> dict[str, str]:
    """The workspace's files: each footprint block cut out of its file (formatting kept, ``omit`` spans left
    out), grouped by file; single local values gathered into one ``locals`` block in ``LOCALS_FILE``."""
    by_file: dict[str, list[str]] = defaultdict(list)
    local_texts: list[str] = []
    for block in sorted(fp.blocks, key=lambda b: (b.file, b.span.start_pos)):
        text = files[block.file]
        cut = text[block.span.start_pos:block.span.end_pos]
        for omit in sorted(block.omit, key=lambda s: s.start_pos, reverse=True):
            start, end = omit.start_pos - block.span.start_pos, omit.end_pos - block.span.start_pos
            cut = cut[:start] + cut[end:]
        if block.type == "local":
            local_texts.append(cut)
        else:
            by_file[block.file].append(cut)
    out = {name: "\n\n".join(parts) + "\n" for name, parts in by_file.items()}
    if local_texts:
        out[LOCALS_FILE] = "locals {\n" + "\n".join("  " + t for t in local_texts) + "\n}\n"
    return out


def local_module_sources(files: Mapping[str, str], cache: ParseCache) -> dict[str, str]:
    """Module call name → its local source as written (``./x``, ``../y``), for the calls in one module's files.

    Raises HclError when a file holding a module call does not parse."""
    found: dict[str, str] = {}
    for name, text in sorted(files.items()):
        if not name.endswith(".tf") or not any(h.type == "module" for h in scan(text).headers):
            if name.endswith(".tf.json") and '"module"' in text:
                found.update(_json_module_sources(text))
            continue
        for block in analyze_file(name, text, cache=cache).blocks:
            if block.type == "module" and block.labels and block.module_source \
                    and is_local_source(block.module_source):
                found[block.labels[0]] = block.module_source
    return found


def _json_module_sources(text: str) -> dict[str, str]:
    try:
        document = json.loads(text)
    except ValueError:
        return {}
    modules = document.get("module") if isinstance(document, dict) else None
    out: dict[str, str] = {}
    for entry in modules if isinstance(modules, list) else [modules]:
        for name, body in (entry.items() if isinstance(entry, dict) else ()):
            source = body.get("source") if isinstance(body, dict) else None
            if isinstance(source, str) and is_local_source(source):
                out[name] = source
    return out


_FILE_CALL = re.compile(r"(?<![\w.-])(" + "|".join(sorted(FILE_FUNCTIONS)) + r")\s*\(")
_LITERAL_PATH = re.compile(r'\s*"((?:\$\{\s*path\.module\s*\}/)?(?:[^"\\$%\n]|\\.)*)"\s*[,)]')


def file_readers(files: Mapping[str, str]) -> dict[str, tuple[str, ...]] | None:
    """Config-relative path → the root files whose ``file()``/``templatefile()``/… calls read it, when every
    such call in the root files names a literal path (optionally ``${path.module}/``-relative); None when some
    call's path is computed, so a changed non-.tf file cannot be placed (the caller refuses it)."""
    readers: dict[str, set[str]] = {}
    for name, text in files.items():
        for call in _FILE_CALL.finditer(text):
            literal = _LITERAL_PATH.match(text, call.end())
            if literal is None:
                return None
            path = re.sub(r"^\$\{\s*path\.module\s*\}/", "", literal.group(1))
            if "${" in path or "%{" in path:
                return None
            readers.setdefault(posixpath.normpath(path), set()).add(name)
    return {path: tuple(sorted(names)) for path, names in sorted(readers.items())}


def changed_variables(old: str | None, new: str | None, name: str) -> tuple[str, ...] | None:
    """The variables whose values a change of one variable-definitions file changed (``var.NAME``), or None
    when either side cannot be read (the caller fails closed)."""
    before = tfvars_values(name, old) if old is not None else {}
    after = tfvars_values(name, new) if new is not None else {}
    if before is None or after is None:
        return None
    return tuple(sorted(f"var.{k}" for k in set(before) | set(after) if before.get(k) != after.get(k)))


def selection_from_changes(scope: ChangeScope, files: Mapping[str, str], cache: ParseCache,
                           var_texts: Mapping[str, tuple[str | None, str | None]] = {}) -> Selection:
    """--changed-from: the changed files as repeated -f; widenings add files, module callers or variables,
    or refuse. ``var_texts`` maps a changed variable-definitions file to its (text at REF, text now).
    Raises ScopeRefused."""
    if scope.failures:
        raise ScopeRefused(3, "cannot scope the change safely:\n" + "\n".join(f"  {f}" for f in scope.failures)
                              + "\nrun kl plan without -f (a full plan)")
    selected = set(scope.files)
    variables: set[str] = set()
    for widening in scope.widen:
        if widening.kind is WidenKind.FULL:
            # The reason of a full-plan widening already names the full plan to run: say it once.
            advice = "" if "full plan" in widening.reason else "\nrun kl plan without -f (a full plan)"
            raise ScopeRefused(3, f"{widening.path}: {widening.reason}{advice}")
        if widening.kind is WidenKind.FILES:
            selected.update(widening.names)
        elif widening.kind is WidenKind.MODULE:
            for name in widening.names:
                callers = [f for f, text in files.items() if f.endswith(".tf")
                           and any(h.type == "module" and h.labels[:1] == (name,) for h in scan(text).headers)]
                if not callers:
                    raise ScopeRefused(3, f"{widening.path} belongs to module {name!r}, which no root .tf file "
                                          "calls: run kl plan without -f (a full plan)")
                selected.update(callers)
        elif widening.kind is WidenKind.VARIABLES:
            old, new = var_texts.get(widening.path, (None, None))
            changed = changed_variables(old, new, posixpath.basename(widening.path))
            if changed is None:
                raise ScopeRefused(3, f"{widening.path}: the variable values it sets cannot be read, so which "
                                      "variables changed is not known; fix the file or run kl plan without -f "
                                      "(a full plan)")
            variables.update(changed)
    deleted = {d.path: d.text_at_ref for d in scope.deleted}
    if not selected and not deleted and not variables:
        raise ScopeRefused(0, "no Terraform files changed: nothing to plan")
    return Selection(tuple(sorted(selected)), deleted, tuple(sorted(variables)))


