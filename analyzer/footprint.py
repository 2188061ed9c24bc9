"""File-scoped footprints: what a plan of selected .tf files writes, reads and must carry along.

Owns the closure from the selected files' blocks to every block a minimal Terraform workspace needs and the
write/read/validation globs it implies. The widening and fail-closed rules are catalogued in
``analyzer.footprint_rules.DIAGNOSTICS`` (constructs followed exactly, without a diagnostic, in ``HANDLED``).

The closure. Every block of the selected files is a member, whole (their ``locals`` blocks too). A member's
references pull in what they name: ``var.x`` its variable block, ``local.x`` that one local value (cut out of
its ``locals`` block elsewhere), ``data.T.N`` its data block, ``module.N``/``module.N.out`` the module call,
and a resource ``T.N`` declared in another file its resource block. Terraform can only read a resource's
attributes when its block is in the configuration, and it plans every block it is given, so referenced
resources are copied too, as read-only members: their globs go to the read side, never the write side. Pulled
blocks are closed over in turn. A resource-like member pulls its provider configuration (the ``provider``
meta-argument, else the default configuration of the type's provider); a module call pulls the configurations
in its ``providers`` map and every default configuration, which a child module may inherit. ``terraform``
blocks are always members, their ``backend``/``cloud`` blocks marked for omission (the workspace builder
sets the backend). Files are found with the cheap prescan, indexed per file (``analyzer.footprint_index``, kept
in the parse cache); only the blocks the closure reaches are parsed.

The globs. Writes: each resource and data source declared in the selected files (``T.N`` and ``T.N.*``), each
module call there (``module.N.*``), every address a ``moved``/``removed``/``import`` block of the workspace
names, and what those blocks move or import into. Reads: the resource-like members the written blocks reach
(``T.N.*``, ``data.T.N.*``, ``module.N.*``), plus, from ``trunk_edges``, the resources the written ones depend
on and the resources that depend on them. Validation: resource-like members only other members need (an
output of a selected file naming something nothing written reads). Reads and validation globs a wider glob
covers are dropped. Root outputs declared in selected files change state too; globs cannot name them, so the
caller carries them.

Must not do I/O or import hcl2; texts come from the caller and parsing goes through ``analyzer.hcl``.
"""

from __future__ import annotations

import posixpath
import re
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from analyzer.addresses import AddressError, parse_instance_address, parse_module_path
from analyzer.consumers import Consumers
from analyzer.footprint_checks import Checks
from analyzer.footprint_index import MIGRATIONS, DefinitionIndex, FileIndex, classify, file_index
from analyzer.footprint_rules import (
    DIAGNOSTICS,
    HANDLED,
    Diagnostic,
    GlobCover,
    is_local_source,
    is_override_file,
    json_document_declarations,
    minimal,
    resource_globs,
    target_globs,
    trunk_reads,
    uncovered,
)
from analyzer.hcl import (
    Block,
    BlockHeader,
    HclError,
    LocalDef,
    ParseCache,
    Span,
    analyze_block,
    analyze_file,
)
from analyzer.prescan import scan

__all__ = ["DIAGNOSTICS", "HANDLED", "BlockRef", "Diagnostic", "Footprint", "compute_footprint"]

_RESOURCE_LIKE = frozenset({"resource", "data", "ephemeral", "action"})
_LOCAL_KINDS = frozenset({"each", "count", "self", "path", "terraform"})
SELECTED, WRITE, READ, VALIDATION = "selected", "write", "read", "validation"


@dataclass(frozen=True, slots=True)
class BlockRef:
    """One block the minimal workspace must contain, copied verbatim from ``file`` at ``span``.

    ``type`` is the block type, or ``local`` for one local value cut out of its ``locals`` block (the builder
    wraps it in ``locals { … }``); ``name`` is the block's address (``aws_instance.web``, ``var.region``,
    ``provider.aws.east``, ``terraform``, ``moved``) or ``local.NAME``. ``omit`` are spans inside ``span`` to
    leave out (a ``terraform`` block's ``backend``/``cloud``). ``role`` is ``selected`` (a block of a selected
    file), ``write`` (a block of another file the footprint writes: a move or import target, or a moved/removed/
    import block naming a written address), ``read`` (a written block depends on it: a read-only member) or
    ``validation`` (only other members need it).
    """

    file: str
    type: str
    name: str
    span: Span
    role: str = READ
    omit: tuple[Span, ...] = ()


@dataclass(frozen=True, slots=True)
class Footprint:
    """The result of ``compute_footprint`` (the module docstring says how each part is derived).

    ``selected_files`` are the selection, de-duplicated, in the caller's order. ``write_globs`` are what the
    apply may change (reserve for write; the commit refuses anything else), ``read_globs`` what the written
    objects depend on (reserve for read; put in the state slice), ``validation_globs`` what the workspace
    holds only so Terraform can validate and plan it (state slice only, no reservation). All globs are
    canonical, sorted and unique. ``blocks`` are the workspace's members in file and position order;
    ``module_dirs`` the local module sources (normalised relative paths, possibly starting with ``..``) to copy
    whole. ``diagnostics`` say where the footprint was widened or why it must not be used (``fails_closed``).
    ``outputs`` are the root outputs the plan covers (declared in a selected file, or reading what it writes):
    their values are planned and committed (``footprint_rules.output_globs`` gives their reservations).
    """

    selected_files: tuple[str, ...]
    write_globs: tuple[str, ...]
    read_globs: tuple[str, ...]
    validation_globs: tuple[str, ...]
    blocks: tuple[BlockRef, ...]
    module_dirs: tuple[str, ...]
    diagnostics: tuple[Diagnostic, ...]
    outputs: tuple[str, ...] = ()

    @property
    def fails_closed(self) -> bool:
        """Whether any diagnostic says this footprint must not be used (run a full plan instead)."""
        return any(d.action == "fail" for d in self.diagnostics)


def compute_footprint(
    files: Mapping[str, str],
    selected: Sequence[str],
    *,
    trunk_edges: Iterable[tuple[str, str]] = (),
    cache: ParseCache | None = None,
    seeds: Sequence[str] = (),
    deleted: Sequence[str] = (),
) -> Footprint:
    """The footprint of applying only the ``selected`` files of a root module.

    ``files`` maps configuration-relative paths to the texts of the root module's ``.tf`` / ``.tf.json`` files;
    ``trunk_edges`` are ``(instance address, resource address it depends on)`` pairs from the trunk's state;
    ``seeds`` are objects (``var.NAME``) whose values changed outside the files, planned as if selected;
    ``deleted`` the globs of blocks the change deleted (``scoping.deletions``): written, so a ``moved`` or
    ``removed`` block naming them joins the workspace wherever it is.
    Never raises for a problem in the configuration: those become diagnostics. Raises ValueError when a
    selected path is not among ``files`` or is not a configuration file, AddressError for a bad trunk edge.
    """
    chosen = tuple(dict.fromkeys(selected))
    for path in chosen:
        if path not in files:
            raise ValueError(f"selected file {path!r} is not among the configuration's files")
        if not path.endswith((".tf", ".tf.json")):
            raise ValueError(f"selected file {path!r} is not a .tf or .tf.json file")
    return _Footprinter(files, chosen, cache if cache is not None else ParseCache(), tuple(seeds),
                        tuple(deleted)).run(tuple(trunk_edges))


@dataclass(slots=True)
class _Def:
    """A top-level block some file declares: known from the prescan (``header``) or a full parse (``block``)."""

    path: str
    header: BlockHeader | None = None
    block: Block | None = None
    is_json: bool = False
    labels: tuple[str, ...] = ()  # for JSON declarations, which are never parsed into blocks


@dataclass(frozen=True, slots=True)
class _Member:
    block: Block
    local: LocalDef | None = None

    @property
    def key(self) -> tuple[str, int, str]:
        return (self.block.file, self.block.span.start_pos, self.local.name if self.local else "")


@dataclass(slots=True)
class _Footprinter(Checks):
    files: Mapping[str, str]
    selected: tuple[str, ...]
    cache: ParseCache
    seeds: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    diagnostics: dict[tuple[str, int, str, str], Diagnostic] = field(default_factory=dict)
    index: DefinitionIndex[_Def] = field(default_factory=lambda: DefinitionIndex(_header_def))
    locals_defs: list[_Def] = field(default_factory=list)
    providers: dict[str, list[_Def]] = field(default_factory=dict)
    terraform_defs: list[_Def] = field(default_factory=list)
    migrations: list[_Def] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)
    resolved: dict[str, list[_Member] | None] = field(default_factory=dict)
    digests: dict[str, str] = field(default_factory=dict)
    reads: set[str] = field(default_factory=set)
    outputs: set[str] = field(default_factory=set)

    # --- the index ------------------------------------------------------------------------------------

    def run(self, trunk_edges: tuple[tuple[str, str], ...]) -> Footprint:
        selected_blocks = self._build_index()
        # The addresses the duplicate checks and the closure ask for first, looked up in one pass over the index.
        self.index.expect({a for b in selected_blocks
                           for a in (b.address, *(r.address for r in b.references))})
        write_roots = [_Member(b) for b in selected_blocks if _is_write_root(b)]
        writes = {g for b in selected_blocks for g in self._owned_globs(b)} | set(self.deleted)
        self.outputs.update(b.labels[0] for b in selected_blocks if b.type == "output" and b.labels)
        for definition in (*self.terraform_defs, *self.migrations):
            if definition.is_json:
                self._diagnose("tf_json", definition.path, 1, "a JSON configuration file holds a terraform, moved, "
                               "removed or import block, which the workspace needs or which may touch the "
                               "selected files, and JSON files cannot be analysed")
        extra_reads: list[_Member] = []
        consumers = Consumers(self, selected_blocks, _Member, self.seeds)
        while True:
            count = len(write_roots)
            extra_reads += self._pull_migrations(write_roots, writes)
            consumers.pull(write_roots, writes)
            if len(write_roots) == count:
                break
        self._check_selected_duplicates(selected_blocks)
        self._check_migration_sources(write_roots)
        terraform_blocks = [_Member(b) for d in self.terraform_defs if (b := self._block(d)) is not None]
        read_members = self._close([*write_roots, *extra_reads, *terraform_blocks])
        members = self._close([*(_Member(b) for b in selected_blocks), *read_members.values()])
        self._check_overrides(members.values())

        write_keys = {m.key for m in write_roots}
        reads: set[str] = set()
        validation: set[str] = set()
        module_dirs: set[str] = set()
        refs: list[BlockRef] = []
        for key, member in members.items():
            block = member.block
            self._check_member(member)
            selected = block.file in self.selected
            if member.local is not None and selected:
                continue  # the whole locals block of a selected file is a member already
            role = SELECTED if selected else WRITE if key in write_keys else READ if key in read_members else VALIDATION
            if member.local is None and block.type in ("resource", "data", "module") and role in (READ, VALIDATION):
                (reads if role == READ else validation).update(resource_globs(block.address))
            if block.type == "module" and block.module_source is not None and is_local_source(block.module_source):
                module_dirs.add(posixpath.normpath(block.module_source))
            refs.append(_block_ref(member, role))
        refs.sort(key=lambda r: (r.file, r.span.start_pos))
        reads.update(trunk_reads(trunk_edges, writes))
        reads.update(self.reads)
        write_list = minimal(writes)
        read_list = uncovered(reads, write_list)
        return Footprint(
            selected_files=self.selected,
            write_globs=write_list,
            read_globs=read_list,
            validation_globs=uncovered(validation, (*write_list, *read_list)),
            blocks=tuple(refs),
            module_dirs=tuple(sorted(module_dirs)),
            diagnostics=tuple(sorted(self.diagnostics.values(), key=lambda d: (d.file, d.line, d.construct))),
            outputs=tuple(sorted(self.outputs)),
        )

    def _build_index(self) -> list[Block]:
        selected_blocks: list[Block] = []
        for path in sorted(self.files):
            text = self.files[path]
            if is_override_file(path):
                self.overrides.append(path)
                if path in self.selected:
                    self._diagnose("override_file", path, 1, "an override file merges into blocks of other files, "
                                   "so it cannot be planned on its own")
                continue
            if path.endswith(".tf.json"):
                if path in self.selected:
                    self._diagnose("tf_json", path, 1, "JSON configuration files cannot be analysed")
                self._index_json(path, text)
                continue
            if not path.endswith(".tf"):
                continue
            if path in self.selected:
                selected_blocks += self._index_parsed(path, text)
                continue
            index = self._prescan(path, text)
            if not index.complete:
                self._index_parsed(path, text)
                continue
            if index.bad:
                for position in sorted(index.bad):
                    header = index.headers[position]
                    self._valid_labels(path, header.line, header.type, header.labels)
            for header, definition in self.index.add_index(path, index):
                self._collect(definition, header.type, header.labels)
        return selected_blocks

    def _index_parsed(self, path: str, text: str) -> list[Block]:
        """Parse a whole file and index its blocks whose labels are valid; those blocks (none when the
        file does not parse: that is diagnosed)."""
        try:
            analysis = analyze_file(path, text, cache=self.cache)
        except HclError as exc:
            self._parse_failure(path, exc)
            return []
        indexed = [b for b in analysis.blocks if self._valid_labels(path, b.span.start_line, b.type, b.labels)]
        self._add_file(path, [(_Def(path, block=b), b.type, b.labels) for b in indexed])
        return indexed

    def _prescan(self, path: str, text: str) -> FileIndex:
        """The file's index: its headers, whether the scan was complete, which headers carry labels Terraform
        rejects and what the others declare (cached with the scan, so a warm run scans and checks nothing)."""
        digest = self.digests[path] = self.cache.digest(text)
        hit = self.cache.prescans.get(digest)
        if not isinstance(hit, FileIndex):
            result = scan(text)
            hit = self.cache.prescans[digest] = file_index(result.headers, result.complete)
        return hit

    def _add_file(self, path: str, definitions: list[tuple[_Def, str, tuple[str, ...]]]) -> None:
        """Index a file whose definitions are made already (a parsed or a JSON file)."""
        collected = self.index.add_defs(path, [(d, classify(type_, labels)) for d, type_, labels in definitions])
        for position, definition in collected:
            _, type_, labels = definitions[position]
            self._collect(definition, type_, labels)

    def _collect(self, definition: _Def, type_: str, labels: tuple[str, ...]) -> None:
        """Keep a block ``classify`` collects in its list."""
        if type_ == "locals":
            self.locals_defs.append(definition)
        elif type_ == "terraform":
            self.terraform_defs.append(definition)
        elif type_ == "provider" and labels:
            self.providers.setdefault(labels[0], []).append(definition)
        elif type_ in MIGRATIONS and definition.path not in self.selected:
            self.migrations.append(definition)

    def _index_json(self, path: str, text: str) -> None:
        declarations = json_document_declarations(text)
        if declarations is None:
            self._diagnose("parse_error", path, 1, "cannot parse the JSON configuration file")
        self._add_file(path, [(_Def(path, is_json=True, labels=labels), type_, labels)
                              for type_, labels in declarations or ()])

    # --- migrations: moved, removed and import blocks ---------------------------------------------------

    def _pull_migrations(self, write_roots: list[_Member], writes: set[str]) -> list[_Member]:
        """Grow the write side until no moved/removed/import block of the configuration touches it unseen."""
        extra_reads: list[_Member] = []
        handled_targets: set[tuple[str, int]] = set()
        changed = True
        while changed:
            changed = False
            for definition in self.migrations:
                block = self._block(definition)
                if block is None or any(m.block is block for m in write_roots):
                    continue
                globs = self._target_globs(block)
                written = GlobCover(writes)
                if any(written.intersects(g) for g in globs):
                    write_roots.append(_Member(block))
                    writes.update(globs)
                    changed = True
                    self._diagnose("moved_elsewhere", block.file, block.span.start_line,
                                   f"this {block.type} block names {', '.join(block.targets)}, which the selected "
                                   "files write: it is copied into the workspace and its addresses are written")
            for member in list(write_roots):
                block = member.block
                key = (block.file, block.span.start_pos)
                if block.type not in ("moved", "import") or key in handled_targets or len(block.targets) < 1:
                    continue
                handled_targets.add(key)
                pulled = self._target_block(block, block.targets[-1])
                if pulled is None:
                    continue
                target = block.targets[-1].replace("[*]", "")
                if pulled.block.type == "module" and target.startswith(pulled.block.address + "."):
                    extra_reads.append(pulled)
                elif all(m.key != pulled.key for m in write_roots):
                    write_roots.append(pulled)
                    writes.update(self._owned_globs(pulled.block))
                    changed = True
                    self._diagnose("target_elsewhere", block.file, block.span.start_line,
                                   f"this {block.type} block writes {block.targets[-1]}, declared in "
                                   f"{pulled.block.file}: that block is copied and {pulled.block.address} written")
        return extra_reads

    def _owned_globs(self, block: Block) -> list[str]:
        """The write globs a block of a selected file (or one pulled onto the write side) owns."""
        if block.type in ("resource", "data") and len(block.labels) == 2:
            # A data source of the selection, or one reading what it writes or defines, may read something new,
            # which a full apply stores: it is written (re-read and committed). Data sources the workspace only
            # reads are read members (the commit keeps the trunk's copy of data sources no write glob covers).
            return list(resource_globs(block.address, exact=True))
        if block.type == "module":
            return list(resource_globs(block.address))
        if block.type in MIGRATIONS:
            return self._target_globs(block)
        self.reads.update(g for address in block.scoped_data for g in resource_globs(address))
        return []

    def _target_globs(self, block: Block) -> list[str]:
        globs: list[str] = []
        for target in block.targets:
            try:
                globs.extend(target_globs(target))
            except AddressError:
                self._diagnose("invalid_reference", block.file, block.span.start_line, f"{target!r} in this "
                               f"{block.type} block is not a resource or module address: the configuration is invalid")
        return globs

    def _target_block(self, block: Block, target: str) -> _Member | None:
        """The block declaring the object a moved/import block writes to, when it lives outside the selection."""
        text = target.replace("[*]", "")
        try:
            address = parse_instance_address(text)
            name = f"module.{address.module[0].name}" if address.module else address.resource_address
        except AddressError:
            try:
                name = f"module.{parse_module_path(text)[0].name}"  # a whole module (instance) moves
            except (AddressError, IndexError):
                return None
        members = self._resolve(name, block, block.span.start_line, quiet=True)
        if not members or members[0].block.file in self.selected:
            return None
        return members[0]

    def _check_selected_duplicates(self, selected_blocks: list[Block]) -> None:
        """Objects the selected files declare must be declared nowhere else (Terraform rejects that)."""
        for block in selected_blocks:
            if block.type == "locals":
                for local in block.locals:
                    self._resolve(f"local.{local.name}", block, local.span.start_line)
            elif block.type == "provider" and block.labels:
                self._provider(block.address[len("provider."):], block)
            elif len(declared := self.index.get(block.address)) > 1:
                where = ", ".join(sorted({d.path for d in declared}))
                self._diagnose("duplicate_definition", block.file, block.span.start_line,
                               f"{block.address} is declared more than once ({where})")

    # --- the closure ------------------------------------------------------------------------------------

    def _close(self, roots: Iterable[_Member]) -> dict[tuple[str, int, str], _Member]:
        seen: dict[tuple[str, int, str], _Member] = {}
        queue = deque(roots)
        while queue:
            member = queue.popleft()
            if member.key in seen:
                continue
            seen[member.key] = member
            queue.extend(self._dependencies(member))
        return seen

    def _dependencies(self, member: _Member) -> list[_Member]:
        block = member.block
        references = member.local.references if member.local else block.references
        out: list[_Member] = []
        for ref in references:
            if ref.kind in _LOCAL_KINDS or ref.address in block.scoped_data:
                continue
            if ref.kind == "invalid":
                self._diagnose("invalid_reference", block.file, ref.line, f"Terraform rejects the reference "
                               f"{ref.text!r} in {block.address}: the configuration is invalid")
                continue
            if ref.kind == "unreadable":
                self._diagnose("unreadable_expression", block.file, ref.line, f"{ref.text} in {block.address}")
                continue
            out.extend(self._resolve(ref.address, block, ref.line) or ())
        if member.local is None:
            configs = list(block.provider_configs)
            if block.type == "module":
                configs.extend(self._default_providers())
            for config in dict.fromkeys(configs):
                out.extend(self._provider(config, block))
        return out

    def _resolve(self, address: str, site: Block, line: int, *, quiet: bool = False) -> list[_Member] | None:
        if address in self.resolved:
            found = self.resolved[address]
        else:
            found = self.resolved[address] = self._lookup(address, site, line)
        if found is None and not quiet:
            self._diagnose("undefined_reference", site.file, line, f"{site.address} refers to {address}, which "
                           "no file of the configuration declares: the configuration is invalid")
        return found

    def _lookup(self, address: str, site: Block, line: int) -> list[_Member] | None:
        if address.startswith("local."):
            return self._local(address[len("local."):], site, line)
        definitions = self.index.get(address)
        if not definitions:
            return None
        if len(definitions) > 1:
            where = ", ".join(sorted({d.path for d in definitions}))
            self._diagnose("duplicate_definition", site.file, line, f"{address} is declared more than once ({where})")
        members = []
        for definition in definitions:
            if definition.is_json:
                self._diagnose("tf_json", definition.path, 1, f"{address}, which {site.address} needs, is declared "
                               "in a JSON configuration file, which cannot be analysed")
                continue
            block = self._block(definition)
            if block is not None:
                members.append(_Member(block))
        return members

    def _local(self, name: str, site: Block, line: int) -> list[_Member] | None:
        pattern = re.compile(r"(?<![\w-])" + re.escape(name) + r"[ \t]*=(?![=>])")
        found: list[_Member] = []
        for definition in self.locals_defs:
            if definition.is_json:
                if definition.labels == (name,):
                    self._diagnose("tf_json", definition.path, 1, f"local.{name}, which {site.address} needs, is "
                                   "declared in a JSON configuration file, which cannot be analysed")
                continue
            text = self.files[definition.path]
            span = definition.header or (definition.block.span if definition.block else None)
            if span is not None and not pattern.search(text, span.start_pos, span.end_pos):
                continue
            block = self._block(definition)
            if block is not None:
                found.extend(_Member(block, local) for local in block.locals if local.name == name)
        if len(found) > 1:
            self._diagnose("duplicate_definition", site.file, line, f"local.{name} is declared more than once")
        return found or None

    def _provider(self, config: str, site: Block) -> list[_Member]:
        name, _, alias = config.partition(".")
        found = []
        for definition in self.providers.get(name, []):
            if definition.is_json:
                self._diagnose("tf_json", definition.path, 1, f"provider {name} is configured in a JSON file, which "
                               "cannot be analysed")
                continue
            block = self._block(definition)
            if block is not None and block.address == f"provider.{config}":
                found.append(_Member(block))
        if len(found) > 1:
            self._diagnose("duplicate_definition", site.file, site.span.start_line,
                           f"provider configuration {config} is declared more than once")
        if not found and alias:
            self._diagnose("undefined_reference", site.file, site.span.start_line, f"{site.address} uses the "
                           f"provider configuration {config}, which no provider block declares")
        return found

    def _default_providers(self) -> list[str]:
        """Every provider with a default (un-aliased) configuration block: a child module inherits them all."""
        names = []
        for name, definitions in sorted(self.providers.items()):
            for definition in definitions:
                block = self._block(definition)
                if definition.is_json or (block is not None and block.address == f"provider.{name}"):
                    names.append(name)
        return names

    def _block(self, definition: _Def) -> Block | None:
        if definition.block is None and definition.header is not None and not definition.is_json:
            try:
                definition.block = analyze_block(definition.path, self.files[definition.path], definition.header,
                                                 cache=self.cache, digest=self.digests.get(definition.path))
            except HclError as exc:
                self._parse_failure(definition.path, exc)
                definition.header = None
        return definition.block

    # --- checks on members --------------------------------------------------------------------------------

    def _parse_failure(self, path: str, exc: HclError) -> None:
        where, _, problem = str(exc).partition(": ")
        line = where.rpartition(":")[2]
        number = int(line) if line.isdigit() else 1
        self._diagnose("parse_error", path, number, f"{problem or exc}: fix `{path}:{number}`")

    def _diagnose(self, construct: str, file: str, line: int, detail: str) -> None:
        action, fallback = DIAGNOSTICS[construct].action, DIAGNOSTICS[construct].how
        diagnostic = Diagnostic(file=file, line=line, construct=construct, message=f"{detail}; {fallback}",
                                action=action)
        self.diagnostics.setdefault((file, line, construct, detail), diagnostic)


def _header_def(path: str, header: BlockHeader) -> _Def:
    return _Def(path, header=header)


def _is_write_root(block: Block) -> bool:
    return block.type in ("resource", "data", "module", *MIGRATIONS) or bool(block.scoped_data)


def _block_ref(member: _Member, role: str) -> BlockRef:
    block = member.block
    if member.local is not None:
        return BlockRef(block.file, "local", f"local.{member.local.name}", member.local.span, role)
    return BlockRef(block.file, block.type, block.address, block.span, role, block.backend_spans)
