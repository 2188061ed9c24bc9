"""File-scoped plans and applies (``kl plan -f``, ``kl apply X.igplan``, ``kl apply -f``): Terraform
runs only over a minimal workspace cut out of the selected files and the blocks they need, against
a slice of the trunk fetched by glob — never over the whole configuration or the whole state.

The footprint, widened to the trunk's dependents, is the scope stage's (``runner.core.scope``), the slice the
trunk stage's (``runner.core.trunk``) and the minimal workspace the workspace stage's (``runner.core.workbuild``);
this module plans over them and reuses the sliced-apply path (``runner.core.apply``) for reserving, applying and
committing.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

from analyzer.addresses import AddressError, parse_instance_address
from analyzer.footprint import Footprint
from analyzer.gcpause import gc_paused
from analyzer.globs import matches, parse_glob
from analyzer.hcl import HclError, ParseCache
from analyzer.plan import PlanFormatError, analyze_plan
from analyzer.plan_drift import drift_in_plan, drift_warnings
from analyzer.scoping import (
    ScopeRefused,
    Selection,
    described_in,
    file_readers,
    selection_from_changes,
)
from runner.core import workbuild
from runner.core.apply import ApplyOptions, apply_spec
from runner.core.engine_client import EngineClient
from runner.core.errors import Failed, InvalidInput, NothingToDo
from runner.core.git import work_tree_root
from runner.core.parsecache import load_cache, prune_cache, save_cache
from runner.core.parsecache import signature as _signature
from runner.core.pins import pin_files
from runner.core.plan import (
    FileScopedPart,
    PlannedChanges,
    PlanSource,
    changed_outputs,
    given_var_flags,
    incidental_writes,
    spec_from_plan,
)
from runner.core.recovery import ApplyOutcome
from runner.core.scope import ScopedFootprint, derive_footprint, module_sources, read_configuration
from runner.core.session import TerraformContext, plan_in_workspace
from runner.core.spec import PlanSpec, is_plan_file
from runner.core.trunk import fetch_slice
from runner.core.workbuild import Layout, SavedPlan, carried_files
from runner.core.workspace import auto_var_files

__all__ = ["Selection", "apply_files", "changed_selection", "file_selection", "plan_files", "plan_files_saved"]


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


def _hash_tree(config_dir: Path, fp: Footprint, layout: Layout) -> dict[str, str]:
    """The pins of the files the minimal workspace is cut from: the blocks' files, the selected files, the
    carried and the variable-definitions files, and the local modules."""
    extra = (*carried_files(config_dir, fp), *auto_var_files(config_dir))
    names = [*(block.file for block in fp.blocks), *fp.selected_files,
             *(str(path.relative_to(config_dir)) for path in extra)]
    return pin_files(config_dir, names, layout.modules)


def plan_files(client: EngineClient, ctx: TerraformContext, *, state: str, config_dir: Path, selection: Selection,
               var_args: Sequence[tuple[str, str]], data_dir: Path, refresh: bool = False,
               scoped: ScopedFootprint | None = None, files: Mapping[str, str] | None = None) -> PlanSpec:
    """kl plan -f: the footprint (``scoped`` when the caller derived it already), the minimal workspace, a
    plan over it, and the artifact."""
    with tempfile.TemporaryDirectory(prefix="kl-plan-f-") as tmp:
        return plan_files_saved(client, ctx, state=state, config_dir=config_dir, selection=selection,
                                var_args=var_args, data_dir=data_dir, refresh=refresh, scoped=scoped,
                                dest=Path(tmp), files=files).spec


def plan_files_saved(client: EngineClient, ctx: TerraformContext, *, state: str, config_dir: Path,
                     selection: Selection, var_args: Sequence[tuple[str, str]], data_dir: Path, dest: Path,
                     refresh: bool = False, scoped: ScopedFootprint | None = None,
                     files: Mapping[str, str] | None = None) -> SavedPlan:
    """plan_files with the workspace kept under ``dest`` (the caller removes it): the spec, and the saved plan
    ``apply_files`` applies without re-planning when the trunk has not moved. ``files``: the configuration
    as ``read_configuration`` read it, when the caller has (read here otherwise)."""
    files = read_configuration(config_dir) if files is None else files
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
    minimal = workbuild.cut(config_dir, files, fp, cache)
    ws = workbuild.build(config_dir, dest / "ws", slice_raw, minimal)
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
            write_set=write_set, read_set=tuple(sorted(set(slice_addresses) - set(write_set))),
            write_globs=write_globs, read_globs=tuple(sorted(set(fp.read_globs) | set(fp.validation_globs))),
            described=described, warnings=tuple(warnings),
            # A partial workspace lacks the other files' outputs; Terraform calls that a delete, but a
            # file-scoped commit removes only the outputs it declares (one that became null) and those whose
            # blocks the change deleted, so the others are not changes of this plan.
            output_changes={**{name: action for name, action in changed_outputs(analysis).items()
                               if action != "delete" or name in fp.outputs}, **{name: "delete" for name in removed}},
            scoped=FileScopedPart(
                selected_files=tuple(selection.files), files=_hash_tree(config_dir, fp, minimal.layout),
                seed_variables=selection.variables,
                deleted_files={p: hashlib.sha256(t.encode()).hexdigest() for p, t in selection.deleted.items()},
                deleted_globs=gone, validation_globs=tuple(fp.validation_globs), slice_globs=slice_globs,
                diagnostics=tuple(asdict(d) for d in fp.diagnostics), removed_outputs=removed)),
    )
    return SavedPlan(workbuild.Prepared(ws, slice_raw, slice_addresses), spec, ctx.binary)


def _declared_variables(fp: Footprint) -> frozenset[str]:
    return frozenset(b.name[len("var."):] for b in fp.blocks if b.type == "variable")


def apply_files(client: EngineClient, ctx: TerraformContext, spec: PlanSpec, options: ApplyOptions,
                deleted: Mapping[str, str], planned: Footprint | None = None,
                saved: SavedPlan | None = None) -> ApplyOutcome:
    """Check the files and inputs against ``spec``, then reserve, apply and commit it: the ``saved`` plan as it
    is when the trunk has not moved since it was made (``runner.core.apply.saved_plan_refusal``), else a re-plan
    over a rebuilt workspace and a fresh slice."""
    config_dir = Path(spec.config_dir)
    builder = workbuild.rebuild(client, spec, config_dir, data_dir=options.data_dir, deleted=deleted, planned=planned)
    return apply_spec(client, ctx, spec, config_dir, options, builder=builder, saved=saved)


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
        sources = module_sources(texts, cache)
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
