"""File-scoped plans and applies (``kl plan -f``, ``kl apply X.igplan``, ``kl apply -f``): Terraform
runs only over a minimal workspace cut out of the selected files and the blocks they need, against
a slice of the trunk fetched by glob — never over the whole configuration or the whole state.

The footprint (what is written, read, needed) comes from ``analyzer.footprint``; this module reads
the files, builds the workspace, talks to the server through the engine client, and reuses the
sliced-apply path (``runner.core.apply``) for reserving, applying and committing.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from analyzer.addresses import AddressError, parse_instance_address
from analyzer.footprint import Footprint, compute_footprint
from analyzer.gcpause import gc_paused
from analyzer.globs import matches, parse_glob
from analyzer.hcl import HclError, ParseCache
from analyzer.plan import PlanFormatError, analyze_plan
from analyzer.plan_drift import drift_in_plan, drift_warnings
from analyzer.scoping import (
    ScopeRefused,
    Selection,
    cut_blocks,
    declaring_files,
    deletions,
    dependents_to_add,
    described_in,
    file_readers,
    local_module_sources,
    output_globs,
    selection_from_changes,
)
from runner.core import workspace
from runner.core.apply import ApplyOptions, Builder, Prepared, SavedPlan, apply_spec, check_spec
from runner.core.engine_client import EngineClient, EngineError
from runner.core.errors import EngineCode, Failed, InvalidInput, NothingToDo, StalePlan
from runner.core.git import work_tree_root
from runner.core.parsecache import load_cache, prune_cache, save_cache
from runner.core.parsecache import signature as _signature
from runner.core.plan import (
    PlannedChanges,
    PlanSource,
    Snapshot,
    TerraformContext,
    auto_var_files,
    changed_outputs,
    described_part,
    fetch_rows,
    given_var_flags,
    incidental_writes,
    plan_in_workspace,
    spec_from_plan,
)
from runner.core.recovery import ApplyOutcome
from runner.core.spec import PlanMode, PlanSpec, is_plan_file

__all__ = ["Selection", "apply_files", "changed_selection", "file_selection", "module_sources", "plan_files",
           "plan_files_saved", "read_configuration"]


def read_configuration(config_dir: Path) -> dict[str, str]:
    """The root module's .tf and .tf.json files, by name (modules are copied whole, not read here)."""
    return _read_tf(config_dir)


def _read_tf(directory: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    for path in sorted(directory.iterdir()):
        if path.is_file() and path.name.endswith((".tf", ".tf.json")) and path.name != workspace.OVERRIDE_NAME:
            found[path.name] = path.read_text(encoding="utf-8", errors="surrogateescape")
    return found


def _diagnostics_text(fp: Footprint) -> str:
    return "\n".join(f"  {d.file}:{d.line}: {d.construct}: {d.message}" for d in fp.diagnostics
                     if d.action == "fail")


def _with_file(fp: Footprint, address: str) -> str:
    """``address (declared in FILE)``: the workspace file whose block declares it — its resource block, or
    the module call of an address inside a module."""
    try:
        parsed = parse_instance_address(address)
    except AddressError:
        return address
    name = f"module.{parsed.module[0].name}" if parsed.module else parsed.resource_address
    found = next((b.file for b in fp.blocks if b.name == name), None)
    return f"{address} (declared in {found})" if found else address


def footprint(files: Mapping[str, str], selection: Selection, cache: ParseCache,
              edges: Iterable[tuple[str, str]] = (), deleted: Sequence[str] = ()) -> Footprint:
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
class Layout:
    """Where the configuration and its local modules sit: ``root`` is the lowest directory holding the
    configuration directory and every local module the workspace needs (nested calls followed), and
    ``modules`` those module directories. The workspace reproduces this tree under one private directory,
    so every ``../`` source resolves inside it."""

    root: Path
    config: Path
    modules: tuple[Path, ...]

    def at(self, dest: Path, path: Path) -> Path:
        return dest / path.relative_to(self.root)


def module_layout(config_dir: Path, fp: Footprint, cache: ParseCache, boundary: Path | None) -> Layout:
    """The layout of ``fp``'s local modules; refuses (exit 3) a module outside ``boundary`` (the git work tree
    holding the configuration, when there is one) or a layout whose root would be the filesystem root."""
    config = config_dir.resolve()
    found: dict[Path, None] = {}
    queue = [(config, source, "the configuration") for source in fp.module_dirs]
    while queue:
        base, source, caller = queue.pop()
        directory = (base / source).resolve()
        if directory in found or directory == config:
            continue
        if boundary is not None and not directory.is_relative_to(boundary):
            raise InvalidInput(f"module source {source!r} in {caller} resolves to {directory}, outside {boundary} "
                            "(the repository holding the configuration): a workspace never reaches outside it; "
                            "move the module inside, or run kl plan without -f (a full plan)")
        if not directory.is_dir():
            raise InvalidInput(f"module source {source!r} in {caller} is not a directory ({directory}): fix the "
                            "source, or run kl plan without -f (a full plan)")
        found[directory] = None
        try:
            nested = local_module_sources(_read_tf(directory), cache)
        except HclError as exc:
            raise InvalidInput(f"{exc}: fix that file of module {source!r}, or run kl plan without -f") from exc
        queue.extend((directory, nested_source, str(directory)) for nested_source in nested.values())
    root = config
    for directory in found:
        while not directory.is_relative_to(root):
            root = root.parent
    if root == Path(root.anchor):
        raise InvalidInput(f"the configuration and its local modules only meet at {root}: a workspace would "
                        "reproduce the whole filesystem; run kl plan without -f (a full plan)")
    return Layout(root, config, tuple(sorted(found)))


def build_minimal(config_dir: Path, files: Mapping[str, str], fp: Footprint, dest: Path,
                  state: bytes | None, layout: Layout) -> workspace.Workspace:
    """Cut the footprint's blocks out of their files (formatting kept) into the configuration's place in the
    layout under ``dest``, copy the local module directories to theirs, carry the variable-definitions files
    Terraform loads by itself, and add the local-backend override and the slice."""
    ws = layout.at(dest, layout.config)
    ws.mkdir(parents=True)
    for name, text in cut_blocks(files, fp).items():
        (ws / name).write_text(text, encoding="utf-8", errors="surrogateescape")
    for module in layout.modules:
        skip = {layout.config}
        shutil.copytree(module, layout.at(dest, module), dirs_exist_ok=True, symlinks=True,
                        ignore=_module_ignore(skip))
    for extra in (*carried_files(config_dir, fp), *auto_var_files(config_dir)):
        target = ws / extra.relative_to(config_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(extra, target)
    workspace.carry_lock_file(config_dir, ws)
    (ws / workspace.OVERRIDE_NAME).write_text(workspace.OVERRIDE)
    if state is not None:
        (ws / "terraform.tfstate").write_bytes(state)
    return workspace.Workspace(ws)


def _module_ignore(skip: set[Path]):  # type: ignore[no-untyped-def]
    patterns = shutil.ignore_patterns(".terraform", ".git", workspace.ARTIFACT_DIR, "*.tfstate*", "*.igplan",
                                      "kl-plan.json")

    def ignore(directory: str, names: list[str]) -> set[str]:
        dropped = set(patterns(directory, names))
        # The configuration directory inside a module's tree (an example calling ``../..``) is the workspace's
        # own place: never merged with the original files.
        return dropped | {n for n in names if (Path(directory) / n).resolve() in skip}

    return ignore


def carried_files(config_dir: Path, fp: Footprint) -> list[Path]:
    """Non-.tf files the workspace must carry: when a block reads files (file(), templatefile()…),
    every file of the configuration directory that is not Terraform's own."""
    if not any(d.construct == "file_function" for d in fp.diagnostics):
        return []
    return [p for p in workspace.copied_files(config_dir) if not p.name.endswith((".tf", ".tf.json"))]


def fetch_slice(client: EngineClient, state: str, globs: Sequence[str],
                described: frozenset[str]) -> tuple[bytes | None, list[str], Snapshot]:
    """The trunk rows under ``globs`` that the workspace describes, as a state file, their addresses, and the
    slice as fetched."""
    snapshot = fetch_rows(client, state, globs)
    part = described_part(snapshot, described)
    return part.raw, part.addresses, snapshot


def _hash_tree(config_dir: Path, fp: Footprint, layout: Layout) -> dict[str, str]:
    hashes: dict[str, str] = {}
    for block in fp.blocks:
        hashes[block.file] = workspace.file_hash(config_dir / block.file)
    for name in fp.selected_files:
        hashes[name] = workspace.file_hash(config_dir / name)
    for path in (*carried_files(config_dir, fp), *auto_var_files(config_dir)):
        hashes[str(path.relative_to(config_dir))] = workspace.file_hash(path)
    if (config_dir / workspace.LOCK_FILE).is_file():
        hashes[workspace.LOCK_FILE] = workspace.file_hash(config_dir / workspace.LOCK_FILE)
    config = config_dir.resolve()
    for root in layout.modules:
        for path in sorted(root.rglob("*")):
            if path.is_file() and ".terraform" not in path.parts and not path.is_relative_to(config):
                hashes[os.path.relpath(path, config)] = workspace.file_hash(path)
    return hashes


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


def plan_files(client: EngineClient, ctx: TerraformContext, *, state: str, config_dir: Path, selection: Selection,
               var_args: Sequence[tuple[str, str]], data_dir: Path, refresh: bool = False,
               scoped: ScopedFootprint | None = None) -> PlanSpec:
    """kl plan -f: the footprint (``scoped`` when the caller derived it already), the minimal workspace, a
    plan over it, and the artifact."""
    with tempfile.TemporaryDirectory(prefix="kl-plan-f-") as tmp:
        return plan_files_saved(client, ctx, state=state, config_dir=config_dir, selection=selection,
                                var_args=var_args, data_dir=data_dir, refresh=refresh, scoped=scoped,
                                dest=Path(tmp)).spec


def plan_files_saved(client: EngineClient, ctx: TerraformContext, *, state: str, config_dir: Path,
                     selection: Selection, var_args: Sequence[tuple[str, str]], data_dir: Path, dest: Path,
                     refresh: bool = False, scoped: ScopedFootprint | None = None) -> SavedPlan:
    """plan_files with the workspace kept under ``dest`` (the caller removes it): the spec, and the saved plan
    ``apply_files`` applies without re-planning when the trunk has not moved."""
    files = read_configuration(config_dir)
    with gc_paused():
        cache = load_cache(data_dir)
        loaded = _signature(cache)
        if scoped is None:
            scoped = derive_footprint(client, state, files, selection, cache)
    fp, selection, gone, widened = scoped.footprint, scoped.selection, scoped.deleted_globs, list(scoped.widened)
    prune_cache(cache, files)
    save_cache(data_dir, cache, loaded=loaded)
    write_globs = scoped.write_globs
    slice_globs = tuple(sorted({g for g in write_globs if not g.startswith("output.")}
                               | set(fp.read_globs) | set(fp.validation_globs)))
    described = described_in(fp, gone)
    slice_raw, slice_addresses, snapshot = fetch_slice(client, state, slice_globs, frozenset(described))
    flags = given_var_flags(var_args, _declared_variables(fp))
    layout = module_layout(config_dir, fp, cache, work_tree_root(config_dir))
    ws = build_minimal(config_dir, files, fp, dest / "ws", slice_raw, layout)
    plan = plan_in_workspace(ctx, ws, flags, (), refresh=refresh)
    try:
        analysis = analyze_plan(plan)
    except PlanFormatError as exc:
        raise Failed(f"cannot read Terraform's plan: {exc}") from exc
    globs = [parse_glob(g) for g in write_globs if not g.startswith("output.")]
    rewritten = incidental_writes(plan, slice_raw, write_globs)
    # A data source read at apply time depends on a pending change: its new values are this plan's to commit.
    deferred = {c.address for c in analysis.changes if c.mode == "data" and c.actions == ("read",)}
    outside = sorted(a for a in analysis.write_set | rewritten | deferred if not any(matches(g, a) for g in globs))
    if outside:
        raise InvalidInput("the workspace plans changes outside the file-scoped footprint ("
                           + ", ".join(_with_file(fp, a) for a in outside[:10]) + "): run kl plan without -f "
                           "(a full plan), or add the file that declares it to -f")
    present = {o.name for o in snapshot.parsed.outputs} if snapshot.parsed else set()
    removed = tuple(n for n in scoped.removed_outputs if n in present)
    warnings = widened + [f"{d.file}:{d.line}: {d.construct}: {d.message}" for d in fp.diagnostics]
    warnings += drift_warnings(drift_in_plan(plan)) if refresh else []
    write_set = tuple(sorted(analysis.write_set | rewritten))
    spec = spec_from_plan(
        PlanSource(address=client.config.base_url, state=state, config_dir=config_dir, snapshot=snapshot,
                   plan=plan, analysis=analysis, var_args=tuple(var_args), env=ctx.env, refresh=refresh),
        PlannedChanges(
            config_hash="", write_set=write_set, read_set=tuple(sorted(set(slice_addresses) - set(write_set))),
            write_globs=write_globs, read_globs=tuple(sorted(set(fp.read_globs) | set(fp.validation_globs))),
            described=described, warnings=tuple(warnings),
            # A partial workspace lacks the other files' outputs; Terraform calls that a delete, but a
            # file-scoped commit removes only the outputs it declares (one that became null) and those whose
            # blocks the change deleted, so the others are not changes of this plan.
            output_changes={**{name: action for name, action in changed_outputs(analysis).items()
                               if action != "delete" or name in fp.outputs}, **{name: "delete" for name in removed}}),
    )
    spec = replace(
        spec, mode=PlanMode.FILES, selected_files=tuple(selection.files), files=_hash_tree(config_dir, fp, layout),
        seed_variables=selection.variables,
        deleted_files={p: hashlib.sha256(t.encode()).hexdigest() for p, t in selection.deleted.items()},
        deleted_globs=gone, validation_globs=tuple(fp.validation_globs), slice_globs=slice_globs,
        diagnostics=tuple(asdict(d) for d in fp.diagnostics), removed_outputs=removed,
    )
    return SavedPlan(Prepared(ws, slice_raw, slice_addresses), spec, ctx.binary)


def check_files(spec: PlanSpec, config_dir: Path) -> None:
    """Refuse (exit 2) when any file the workspace was cut from changed since kl plan -f, or a
    variable-definitions file Terraform loads by itself appeared."""
    for name, digest in spec.files.items():
        path = config_dir / name
        if not path.is_file() or workspace.file_hash(path) != digest:
            raise StalePlan(f"{name} changed since kl plan -f: re-run kl plan -f")
    for path in auto_var_files(config_dir):
        if path.name not in spec.files:
            raise StalePlan(f"{path.name} appeared since kl plan -f (Terraform loads it by itself): re-run kl plan -f")


def _declared_variables(fp: Footprint) -> frozenset[str]:
    return frozenset(b.name[len("var."):] for b in fp.blocks if b.type == "variable")


def files_builder(client: EngineClient, spec: PlanSpec, config_dir: Path, data_dir: Path,
                  deleted: Mapping[str, str], planned: Footprint | None = None) -> Builder:
    """Rebuild the same minimal workspace over a fresh slice of the same globs (from ``planned``, the
    plan's footprint, when the caller kept it)."""
    def build(dest: Path) -> Prepared:
        files = read_configuration(config_dir)
        cache = load_cache(data_dir)
        selection = Selection(spec.selected_files, deleted, spec.seed_variables)
        fp = planned or footprint(files, selection, cache, deleted=spec.deleted_globs)
        layout = module_layout(config_dir, fp, cache, work_tree_root(config_dir))
        slice_raw, slice_addresses, _ = fetch_slice(client, spec.state, spec.slice_globs,
                                                    frozenset(spec.described_resources))
        return Prepared(build_minimal(config_dir, files, fp, dest, slice_raw, layout), slice_raw, slice_addresses)

    return build


def apply_files(client: EngineClient, ctx: TerraformContext, spec: PlanSpec, options: ApplyOptions,
                deleted: Mapping[str, str], planned: Footprint | None = None,
                saved: SavedPlan | None = None) -> ApplyOutcome:
    """Check the files and inputs against ``spec``, then reserve, apply and commit it: the ``saved`` plan as it
    is when the trunk has not moved since it was made (``runner.core.apply.saved_plan_refusal``), else a re-plan
    over a rebuilt workspace and a fresh slice."""
    config_dir = Path(spec.config_dir)
    check_files(spec, config_dir)
    check_spec(replace(spec, config_hash=workspace.config_hash(config_dir)), config_dir, ctx.env,
               options.supplied_vars)
    builder = files_builder(client, spec, config_dir, options.data_dir, deleted, planned)
    return apply_spec(client, ctx, spec, config_dir, options, builder=builder, checked=True, saved=saved)


def file_selection(config_dir: Path, files: Sequence[str]) -> Selection:
    """-f FILE…: the selected files, with the text each had at HEAD when the configuration is in a git work tree
    (what a selected file declared there and no file declares now is destroyed, its outputs removed, as a full
    apply would). Without git, or for a file new since HEAD, there is no earlier text to compare."""
    from runner.core.git import GitError, text_at

    root = work_tree_root(config_dir)
    earlier: dict[str, str] = {}
    if root is None:
        return Selection(tuple(files), earlier)
    for name in files:
        try:
            earlier[f"{name}@HEAD"] = text_at(root, "HEAD", (config_dir.resolve() / name).relative_to(root).as_posix())
        except (GitError, ValueError):
            continue  # new since HEAD, outside the work tree, or no commit yet: nothing declared before
    return Selection(tuple(files), earlier)


def changed_selection(config_dir: Path, ref: str, *, against: str | None = None) -> Selection:
    """--changed-from REF: the selection for what changed since ``ref`` in the git repository holding
    ``config_dir`` — up to the working tree, or up to the commit ``against`` (the pull-request bot, on a
    checkout of that commit). What a still-present selected file declared at ``ref`` joins the deleted
    texts, so a block removed from it is planned for destruction. Raises runner.core.git.GitError, InvalidInput,
    NothingToDo (no Terraform file changed)."""
    import posixpath

    from analyzer.gitdiff import WidenKind
    from runner.core.git import GitError, changed_from, text_at

    texts = read_configuration(config_dir)
    cache = ParseCache()
    try:
        sources = {name: posixpath.normpath(src) for name, src in local_module_sources(texts, cache).items()}
    except HclError as exc:
        raise InvalidInput(f"{exc}: fix that file, or run kl plan without -f (a full plan)") from exc
    readers = file_readers(texts)
    scope = changed_from(config_dir, config_dir, ref, against=against, module_sources=sources,
                         file_readers=readers or {}, is_artifact=is_plan_file)
    var_texts: dict[str, tuple[str | None, str | None]] = {}
    for widening in scope.widen:
        if widening.kind is WidenKind.VARIABLES:
            try:
                old: str | None = text_at(config_dir, ref, widening.path)
            except GitError:
                old = None  # new since the ref
            now = config_dir / widening.names[0]
            if against is not None:
                try:
                    new: str | None = text_at(config_dir, against, widening.path)
                except GitError:
                    new = None
            else:
                new = now.read_text(encoding="utf-8", errors="surrogateescape") if now.is_file() else None
            var_texts[widening.path] = (old, new)
    try:
        chosen = selection_from_changes(scope, texts, cache, var_texts)
    except ScopeRefused as exc:
        raise (NothingToDo if exc.exit_code == 0 else InvalidInput)(str(exc)) from exc
    deleted = dict(chosen.deleted)
    for name in chosen.files:
        try:
            deleted[f"{name}@{ref}"] = text_at(config_dir, ref, posixpath.join(scope.config_dir, name))
        except GitError:
            continue  # new since the ref: nothing declared before
    return Selection(chosen.files, deleted, chosen.variables)


def module_sources(files: Mapping[str, str], cache: ParseCache) -> dict[str, str]:
    """Module call name → local source directory (normalised, config-relative), for mapping changed module
    files to calls. Raises HclError when a file holding a module call does not parse."""
    import posixpath

    return {name: posixpath.normpath(source) for name, source in local_module_sources(files, cache).items()}
