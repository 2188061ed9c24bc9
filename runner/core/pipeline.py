"""The sequencer: the one way the command line and the bot run a change through the core.

A change is a typed ``ChangeRequest`` (the whole configuration, optionally under ``-target``, or the files of a
selection; the variables; whether to refresh). ``plan`` runs it through the stages in order — scope (the
file-scoped footprint), trunk (the snapshot or the slice), workspace (a full copy or the minimal cut), the
Terraform session, the plan file with its pins — and ``apply`` carries a plan out through the run stage
(reserve, re-plan or reuse the saved plan, dry commit, apply, commit). ``drift`` and ``refresh`` are the
refresh-only runs over a check scope. A selection's plan is sequenced here, one pass down the stages; the whole
configuration's is ``runner.core.plan.make_plan``. The CLI (``runner.cli``) and the bot (``runner.bot``) import
no stage but this one, which re-exports the types and the few entry points (``recover``, ``artifact_dir``,
``ApplyRun`` for ending a timed-out job's runs) they need.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path

from analyzer.addresses import AddressError, parse_instance_address
from analyzer.footprint import Footprint
from analyzer.gcpause import gc_paused
from analyzer.globs import matches, parse_glob
from analyzer.plan import PlanFormatError, analyze_plan
from analyzer.plan_drift import drift_in_plan, drift_warnings
from analyzer.scoping import Selection, described_in
from runner.core import drift as _drift
from runner.core import plan as planfile
from runner.core import workbuild
from runner.core.apply import ApplyOptions, apply_spec
from runner.core.config import read_configuration
from runner.core.drift import DriftRequest, DriftResult, RefreshOutcome, describe
from runner.core.engine_client import EngineClient
from runner.core.errors import Failed, InvalidInput
from runner.core.filescoped import ChangedSelection, changed_selection, file_selection
from runner.core.parsecache import load_cache, prune_cache, save_cache, signature
from runner.core.pins import pin_files
from runner.core.plan import make_plan, summary
from runner.core.recovery import ApplyOutcome, recover
from runner.core.run import ApplyRun
from runner.core.scope import ScopedFootprint, derive_footprint, module_sources
from runner.core.session import TerraformContext, given_var_flags, plan_in_workspace
from runner.core.spec import PlanMode, PlanSpec
from runner.core.trunk import fetch_slice
from runner.core.workbuild import SavedPlan, carried_files
from runner.core.workspace import artifact_dir

__all__ = ["ApplyOptions", "ApplyOutcome", "ApplyRun", "ChangeKind", "ChangeRequest", "ChangedSelection",
           "DriftRequest", "DriftResult", "Planned", "RefreshOutcome", "ScopedFootprint", "Selection",
           "TerraformContext", "apply", "artifact_dir", "changed_selection", "describe", "drift", "file_selection",
           "module_sources", "plan", "read_configuration", "recover", "refresh", "scope_of", "summary"]


class ChangeKind(StrEnum):
    FULL = "full"        # the whole configuration (all of it, or under -target)
    FILES = "files"      # the files of a selection (-f, --changed-from, a merge)


@dataclass(frozen=True, slots=True)
class ChangeRequest:
    """One change to plan: where (state, configuration, kl's data directory), what (a file selection, else the
    whole configuration, optionally narrowed by ``targets``), its inputs (``var_args``: ("var" | "var-file",
    text) as given) and whether the plan refreshes. ``scoped`` is the selection's footprint when the caller
    derived it already (the bot derives it once, before it waits for earlier merges), and ``files`` the root
    module's files when the caller has read them (``scope.read_configuration``; read by the plan otherwise)."""

    state: str
    config_dir: Path
    data_dir: Path
    selection: Selection | None = None
    targets: tuple[str, ...] = ()
    var_args: tuple[tuple[str, str], ...] = ()
    refresh: bool = False
    scoped: ScopedFootprint | None = None
    files: Mapping[str, str] | None = None

    @property
    def kind(self) -> ChangeKind:
        return ChangeKind.FULL if self.selection is None else ChangeKind.FILES


@dataclass(frozen=True, slots=True)
class Planned:
    """A plan: its plan file (``spec``), and for a file-scoped plan made with a kept workspace, that workspace
    with its saved plan and the footprint the apply's rebuild reuses."""

    spec: PlanSpec
    saved: SavedPlan | None = None
    footprint: Footprint | None = None


def scope_of(client: EngineClient, request: ChangeRequest) -> ScopedFootprint:
    """The scope of a file-scoped change without running Terraform: its footprint widened to the trunk's
    dependents (the parse cache is read, not written: the plan saves it)."""
    assert request.selection is not None, "a footprint is a file-scoped change's"
    files = read_configuration(request.config_dir) if request.files is None else request.files
    return derive_footprint(client, request.state, files, request.selection,
                            load_cache(request.data_dir))


def plan(client: EngineClient, ctx: TerraformContext, request: ChangeRequest, *, keep: Path | None = None
         ) -> Planned:
    """Plan the change. With ``keep`` a file-scoped plan's workspace stays there (the caller removes it), so
    ``apply`` can run its saved plan when the trunk has not moved."""
    if request.selection is None:
        return Planned(make_plan(client, ctx, state=request.state, config_dir=request.config_dir,
                                 var_args=request.var_args, targets=request.targets, refresh=request.refresh))
    found = request.scoped.footprint if request.scoped is not None else None
    if keep is not None:
        saved = _plan_files(client, ctx, request, request.selection, keep)
        return Planned(saved.spec, saved, found)
    with tempfile.TemporaryDirectory(prefix="kl-plan-f-") as tmp:
        return Planned(_plan_files(client, ctx, request, request.selection, Path(tmp)).spec, None, found)


def _plan_files(client: EngineClient, ctx: TerraformContext, request: ChangeRequest, selection: Selection,
                dest: Path) -> SavedPlan:
    """A file-scoped plan, its workspace kept under ``dest``: the footprint widened to the trunk's dependents
    (``request.scoped`` when the caller derived it), the trunk slice under its globs, the minimal workspace cut
    from the selected files and the blocks they need, Terraform's plan over it, and the plan file with its pins —
    never the whole configuration or the whole state."""
    state, config_dir, var_args, refresh = request.state, request.config_dir, request.var_args, request.refresh
    files = read_configuration(config_dir) if request.files is None else request.files
    with gc_paused():
        cache = load_cache(request.data_dir)
        loaded = signature(cache)
        scoped = request.scoped if request.scoped is not None else derive_footprint(client, state, files,
                                                                                      selection, cache)
    fp, selection, gone, widened = scoped.footprint, scoped.selection, scoped.deleted_globs, list(scoped.widened)
    prune_cache(cache, files)
    save_cache(request.data_dir, cache, loaded=loaded)
    write_globs = scoped.write_globs
    slice_globs = tuple(sorted({g for g in write_globs if not g.startswith("output.")}
                               | set(fp.read_globs) | set(fp.validation_globs)))
    described = described_in(fp, gone)
    slice_raw, slice_addresses, snapshot = fetch_slice(client, state, slice_globs, frozenset(described))
    minimal = workbuild.cut(config_dir, files, fp, cache)
    ws = workbuild.build(config_dir, dest / "ws", slice_raw, minimal)
    declared = frozenset(b.name[len("var."):] for b in fp.blocks if b.type == "variable")
    plan = plan_in_workspace(ctx, ws, given_var_flags(var_args, declared), (), refresh=refresh)
    try:
        analysis = analyze_plan(plan)
    except PlanFormatError as exc:
        raise Failed(f"cannot read Terraform's plan: {exc}") from exc
    globs = [parse_glob(g) for g in write_globs if not g.startswith("output.")]
    rewritten = planfile.incidental_writes(plan, slice_raw, write_globs)
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
    # A partial workspace lacks the other files' outputs; Terraform calls that a delete, but a file-scoped commit
    # removes only the outputs it declares (one that became null) and those whose blocks the change deleted, so
    # the others are not changes of this plan.
    outputs = {**{name: action for name, action in planfile.changed_outputs(analysis).items()
                  if action != "delete" or name in fp.outputs}, **{name: "delete" for name in removed}}
    # The pins of the files the minimal workspace is cut from: the blocks' files, the selected files, the
    # carried and the variable-definitions files, and the local modules.
    cut_from = [*(block.file for block in fp.blocks), *fp.selected_files,
                *(str(path.relative_to(config_dir))
                  for path in (*carried_files(config_dir, fp), *minimal.var_files))]
    spec = planfile.spec_from_plan(
        planfile.PlanSource(address=client.config.base_url, state=state, config_dir=config_dir, snapshot=snapshot,
                   plan=plan, analysis=analysis, var_args=tuple(var_args), env=ctx.env, refresh=refresh),
        planfile.PlannedChanges(
            write_set=write_set, read_set=tuple(sorted(set(slice_addresses) - set(write_set))),
            write_globs=write_globs, read_globs=tuple(sorted(set(fp.read_globs) | set(fp.validation_globs))),
            described=described, warnings=tuple(warnings), output_changes=outputs,
            scoped=planfile.FileScopedPart(
                selected_files=tuple(selection.files), files=pin_files(config_dir, cut_from, minimal.layout.modules),
                seed_variables=selection.variables,
                deleted_files={p: hashlib.sha256(t.encode()).hexdigest() for p, t in selection.deleted.items()},
                deleted_globs=gone, validation_globs=tuple(fp.validation_globs), slice_globs=slice_globs,
                diagnostics=tuple(asdict(d) for d in fp.diagnostics), removed_outputs=removed)),
    )
    return SavedPlan(workbuild.Prepared(ws, slice_raw, slice_addresses), spec, ctx.binary)


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


def apply(client: EngineClient, ctx: TerraformContext, planned: Planned, options: ApplyOptions,
          deleted: Mapping[str, str] | None = None) -> ApplyOutcome:
    """Carry the plan out: its pins verified, its reservations taken, its saved plan applied as it is when the
    trunk has not moved since it was made (``run.saved_plan_refusal``), else a re-plan over a rebuilt workspace
    (for a file-scoped plan, cut the way its plan cut it, over a fresh slice), the dry commit, Terraform's apply
    and the row-level commit."""
    spec = planned.spec
    config_dir = Path(spec.config_dir)
    if spec.mode == PlanMode.FILES:
        builder = workbuild.rebuild(client, spec, config_dir, data_dir=options.data_dir, deleted=dict(deleted or {}),
                                    planned=planned.footprint)
        return apply_spec(client, ctx, spec, config_dir, options, builder=builder, saved=planned.saved)
    return apply_spec(client, ctx, spec, config_dir, options)


def drift(client: EngineClient, ctx: TerraformContext, request: DriftRequest) -> DriftResult:
    """``kl drift``: a refresh-only plan over the check scope under read reservations, the report stored."""
    return _drift.check_drift(client, ctx, request)


def refresh(client: EngineClient, ctx: TerraformContext, request: DriftRequest, *, dry_run: bool) -> RefreshOutcome:
    """``kl refresh``: the refresh-only plan applied under write reservations and the refreshed rows committed."""
    return _drift.refresh(client, ctx, request, dry_run=dry_run)
