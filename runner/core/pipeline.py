"""The sequencer: the one way the command line and the bot run a change through the core.

A change is a typed ``ChangeRequest`` (the whole configuration, optionally under ``-target``, or the files of a
selection; the variables; whether to refresh). ``plan`` runs it through the stages in order — scope (the
file-scoped footprint), trunk (the snapshot or the slice), workspace (a full copy or the minimal cut), the
Terraform session, the plan file with its pins — and ``apply`` carries a plan out through the run stage
(reserve, re-plan or reuse the saved plan, dry commit, apply, commit). ``drift`` and ``refresh`` are the
refresh-only runs over a check scope. The CLI (``runner.cli``) and the bot (``runner.bot``) call these and
nothing below them on the change paths.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from analyzer.footprint import Footprint
from analyzer.scoping import Selection
from runner.core import drift as _drift
from runner.core.apply import ApplyOptions, apply_spec
from runner.core.drift import DriftRequest, DriftResult, RefreshOutcome, describe
from runner.core.engine_client import EngineClient
from runner.core.filescoped import apply_files, changed_selection, file_selection, plan_files, plan_files_saved
from runner.core.parsecache import load_cache
from runner.core.plan import make_plan, summary
from runner.core.recovery import ApplyOutcome
from runner.core.scope import ScopedFootprint, derive_footprint, read_configuration
from runner.core.session import TerraformContext
from runner.core.spec import PlanMode, PlanSpec
from runner.core.workbuild import SavedPlan

__all__ = ["ApplyOptions", "ApplyOutcome", "ChangeKind", "ChangeRequest", "DriftRequest", "DriftResult", "Planned",
           "RefreshOutcome", "Selection", "apply", "changed_selection", "describe", "drift", "file_selection",
           "plan", "refresh", "scope_of", "summary"]


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
        saved = plan_files_saved(client, ctx, state=request.state, config_dir=request.config_dir,
                                 selection=request.selection, var_args=request.var_args, data_dir=request.data_dir,
                                 refresh=request.refresh, scoped=request.scoped, dest=keep,
                                 files=request.files)
        return Planned(saved.spec, saved, found)
    return Planned(plan_files(client, ctx, state=request.state, config_dir=request.config_dir,
                              selection=request.selection, var_args=request.var_args, data_dir=request.data_dir,
                              refresh=request.refresh, scoped=request.scoped,
                              files=request.files), None, found)


def apply(client: EngineClient, ctx: TerraformContext, planned: Planned, options: ApplyOptions,
          deleted: Mapping[str, str] | None = None) -> ApplyOutcome:
    """Carry the plan out: its pins verified, its reservations taken, its saved plan applied or a re-plan over
    a rebuilt workspace, the dry commit, Terraform's apply and the row-level commit."""
    spec = planned.spec
    if spec.mode == PlanMode.FILES:
        return apply_files(client, ctx, spec, options, dict(deleted or {}), planned=planned.footprint,
                           saved=planned.saved)
    return apply_spec(client, ctx, spec, Path(spec.config_dir), options)


def drift(client: EngineClient, ctx: TerraformContext, request: DriftRequest) -> DriftResult:
    """``kl drift``: a refresh-only plan over the check scope under read reservations, the report stored."""
    return _drift.check_drift(client, ctx, request)


def refresh(client: EngineClient, ctx: TerraformContext, request: DriftRequest, *, dry_run: bool) -> RefreshOutcome:
    """``kl refresh``: the refresh-only plan applied under write reservations and the refreshed rows committed."""
    return _drift.refresh(client, ctx, request, dry_run=dry_run)
