"""The scope stage: which addresses a change or a check covers, as globs — what a file-scoped selection
writes and reads (its footprint, widened to the files of the trunk's dependents), the addresses its
workspace describes, and the globs of a drift check or a refresh (``--target``, ``-f`` files, or the
whole state). Terraform is not run here: the scope comes from the files and the trunk's recorded edges.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from analyzer.addresses import parse_instance_address
from analyzer.footprint import Footprint, compute_footprint
from analyzer.gcpause import gc_paused
from analyzer.globs import Glob, GlobError, GlobKind, matches, parse_glob
from analyzer.hcl import ParseCache
from analyzer.scoping import (
    Selection,
    declaring_files,
    deletions,
    dependents_to_add,
    described_in,
    local_module_sources,
    output_globs,
)
from runner.core import workspace
from runner.core.engine_client import EngineClient, EngineError
from runner.core.errors import EngineCode, InvalidInput
from runner.core.parsecache import load_cache


def read_configuration(config_dir: Path) -> dict[str, str]:
    """The root module's .tf and .tf.json files, by name (modules are copied whole, not read here)."""
    return read_tf(config_dir)


def read_tf(directory: Path) -> dict[str, str]:
    """The .tf and .tf.json files of one directory (not the workspace's backend override), by name."""
    found: dict[str, str] = {}
    for path in sorted(directory.iterdir()):
        if path.is_file() and path.name.endswith((".tf", ".tf.json")) and path.name != workspace.OVERRIDE_NAME:
            found[path.name] = path.read_text(encoding="utf-8", errors="surrogateescape")
    return found


def _diagnostics_text(fp: Footprint) -> str:
    return "\n".join(f"  {d.file}:{d.line}: {d.construct}: {d.message}" for d in fp.diagnostics
                     if d.action == "fail")


def footprint(files: Mapping[str, str], selection: Selection, cache: ParseCache,
              edges: Iterable[tuple[str, str]] = (), deleted: Sequence[str] = ()) -> Footprint:
    """The footprint of ``selection``; raises InvalidInput for a file that is not there or a footprint that
    fails closed."""
    missing = [f for f in selection.files if f not in files]
    if missing:
        raise InvalidInput(f"-f {missing[0]}: no such .tf file in the configuration directory")
    fp = compute_footprint(files, selection.files, trunk_edges=edges, cache=cache, seeds=selection.variables,
                           deleted=deleted)
    if fp.fails_closed:
        raise InvalidInput("the file-scoped footprint cannot be proven safe, so nothing was planned:\n"
                        + _diagnostics_text(fp))
    return fp


@dataclass(frozen=True, slots=True)
class ScopedFootprint:
    """The footprint of a selection after widening to the trunk's dependents: what ``kl apply`` would
    reserve (``write_globs``: the footprint's writes and what deleted files declared; ``read_globs``: its
    reads and validation globs), without running Terraform. ``selection`` is the widened selection and
    ``widened`` says why each file joined it. ``deleted_globs`` and ``removed_outputs`` are what the change
    deleted (``scoping.deletions``): destroyed, and removed from the trunk."""

    footprint: Footprint
    selection: Selection
    write_globs: tuple[str, ...]
    read_globs: tuple[str, ...]
    deleted_globs: tuple[str, ...]
    widened: tuple[str, ...]
    removed_outputs: tuple[str, ...] = ()


def derive_footprint(client: EngineClient, state: str, files: Mapping[str, str], selection: Selection,
                     cache: ParseCache) -> ScopedFootprint:
    """The file-scoped footprint of ``selection`` against the trunk's recorded dependencies, widened to the
    files of resources that depend on what it writes. Raises InvalidInput when it fails closed."""
    deleted = deletions(selection.deleted, files)
    gone = deleted.globs
    declarations: dict[str, str] | None = None
    widened: list[str] = []
    while True:
        fp = footprint(files, selection, cache, deleted=gone)
        wanted = sorted(set(fp.write_globs) | set(gone))
        try:
            edges = client.edges(state, wanted) if wanted else []
        except EngineError as exc:
            if exc.code != EngineCode.STATE_NOT_FOUND:
                raise
            edges = []
        if not edges:
            break
        if declarations is None:  # only needed when the trunk knows dependents: a scan of every file
            declarations = declaring_files(files)
        more = dependents_to_add(edges, wanted, declarations, selection.files)
        if not more:
            fp = footprint(files, selection, cache, edges, deleted=gone)
            break
        widened += [f"widened to {file}: {why}" for file, why in sorted(more.items())]
        selection = Selection(tuple(sorted(set(selection.files) | set(more))), selection.deleted, selection.variables)
    writes = set(fp.write_globs) | set(gone) | set(output_globs(fp.outputs)) | set(output_globs(deleted.outputs))
    return ScopedFootprint(fp, selection, tuple(sorted(writes)),
                           tuple(sorted(set(fp.read_globs) | set(fp.validation_globs))), gone, tuple(widened),
                           deleted.outputs)


@dataclass(frozen=True, slots=True)
class Scope:
    """What a drift check or a refresh covers: the checked globs (reported, and written by a refresh), the
    other globs the workspace reads, and — for ``-f`` files — the footprint and the root files its minimal
    workspace is cut from, with the addresses that workspace describes."""

    checked: tuple[str, ...]
    read: tuple[str, ...]
    targets: tuple[str, ...]               # the --target globs -target is made from (none: the whole workspace)
    footprint: Footprint | None = None     # the file-scoped footprint (-f), else None
    files: Mapping[str, str] | None = None  # the configuration's root files (-f)
    described: frozenset[str] = frozenset()

    @property
    def slice_globs(self) -> tuple[str, ...]:
        return tuple(sorted(set(self.checked) | set(self.read)))

    @property
    def whole(self) -> bool:
        return self.checked == ("*",)

    def covered(self) -> Callable[[str], bool]:
        """Whether an address is under the checked globs."""
        globs = [parse_glob(g) for g in self.checked]
        return lambda address: any(matches(g, address) for g in globs)


def is_data_glob(glob: Glob) -> bool:
    return glob.resource is not None and glob.resource[0] == "data"


def check_scope(client: EngineClient, *, state: str, config_dir: Path, files: Sequence[str],
                targets: Sequence[str], data_dir: Path) -> Scope:
    """The globs a check covers. Raises InvalidInput for a bad glob or a footprint that fails closed."""
    if files and targets:
        raise InvalidInput("give either -f files or --target globs, not both")
    if targets:
        try:
            globs = tuple(sorted({str(parse_glob(t)) for t in targets}))
        except GlobError as exc:
            raise InvalidInput(f"--target: {exc}") from exc
        return Scope(checked=globs, read=(), targets=() if "*" in globs else globs)
    if not files:
        return Scope(checked=("*",), read=(), targets=())
    texts = read_configuration(config_dir)
    with gc_paused():
        scoped = derive_footprint(client, state, texts, Selection(tuple(files)), load_cache(data_dir))
    managed = tuple(g for g in scoped.write_globs if not is_data_glob(parse_glob(g)))
    others = set(scoped.read_globs) | (set(scoped.write_globs) - set(managed))
    return Scope(checked=managed, read=tuple(sorted(others - set(managed))), targets=(), footprint=scoped.footprint,
                 files=texts, described=frozenset(described_in(scoped.footprint, scoped.deleted_globs)))


def target_addresses(globs: Sequence[str], addresses: Sequence[str] = ()) -> tuple[str, ...]:
    """Terraform ``-target`` addresses covering the globs (``*`` needs none). Terraform has no target for a
    whole resource type, so a type glob (``TYPE.*``) becomes the resources of the slice's ``addresses`` it
    matches (the workspace's state holds nothing else of that type to refresh)."""
    found: list[str] = []
    for text in globs:
        glob = parse_glob(text)
        if glob.kind is GlobKind.EVERYTHING:
            return ()
        if glob.kind is GlobKind.TYPE:
            found.extend(parse_instance_address(a).resource_address for a in addresses if matches(glob, a))
            continue
        found.append(text[:-2] if text.endswith(".*") else text)
    return tuple(sorted(set(found)))


def slice_targets(scope: Scope, addresses: Sequence[str]) -> tuple[str, ...]:
    """The ``-target`` addresses of a check over a fetched slice holding ``addresses``."""
    if not scope.targets:
        return ()
    return target_addresses(scope.targets, addresses)


def module_sources(files: Mapping[str, str], cache: ParseCache) -> dict[str, str]:
    """Module call name → local source directory (normalised, config-relative), for mapping changed module
    files to calls. Raises HclError when a file holding a module call does not parse."""
    import posixpath

    return {name: posixpath.normpath(source) for name, source in local_module_sources(files, cache).items()}
