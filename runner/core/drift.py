"""``kl drift`` and ``kl refresh``: a refresh-only Terraform run over a slice of the trunk — the whole state,
the instances under ``--target`` globs, or the file-scoped footprint of ``-f`` files.

``kl drift`` holds **read** reservations on the slice, so it runs beside applies on disjoint addresses, and
reports each drifted managed instance with the names of its changed top-level attributes (never values)
and whether its object is gone; the report is stored on the server. ``kl refresh`` holds **write**
reservations on the checked addresses and commits the refreshed rows like ``kl apply`` (gone objects are
removed from the trunk). Terraform's own output is never shown: a refresh-only plan prints values.

Exit codes: drift 0 nothing drifted, 2 drift found, 1 failure, 3 usage; refresh as kl apply.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from analyzer.globs import Mode, Reservation
from analyzer.plan_drift import DriftedInstance, DriftFormatError, drift_in_plan, keep_trunk_rows, managed_addresses
from analyzer.state import ParsedState, parse_state
from app.domain.reservations import DEFAULT_LEASE, RunStatus
from runner.core import workbuild, workspace
from runner.core.engine_client import EngineClient, EngineError
from runner.core.errors import Failed, InvalidInput, StalePlan, refusal
from runner.core.parsecache import load_cache
from runner.core.run import ApplyRun, Heartbeat, check_refused
from runner.core.scope import Scope, check_scope, slice_targets
from runner.core.session import TerraformContext, apply_plan, read_state, refresh_plan
from runner.core.trunk import Snapshot, described_part, fetch_rows, fetch_snapshot


@dataclass(frozen=True, slots=True)
class DriftRequest:
    """What to check: ``files`` (-f) or ``targets`` (--target globs), else the whole state."""

    state: str
    config_dir: Path
    files: tuple[str, ...] = ()
    targets: tuple[str, ...] = ()
    actor: str = "kl"
    data_dir: Path = Path(".kilolock")
    wait_seconds: float | None = None
    lease_seconds: float = DEFAULT_LEASE.total_seconds()


@dataclass(frozen=True, slots=True)
class DriftResult:
    state: str
    serial: int
    checked: int
    globs: tuple[str, ...]
    drifted: tuple[DriftedInstance, ...]
    run_id: str

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "serial": self.serial, "checked": self.checked,
                "drifted": [d.to_json() for d in self.drifted]}


def resolve_scope(client: EngineClient, request: DriftRequest) -> Scope:
    """The globs a check covers (``runner.core.scope.check_scope``)."""
    return check_scope(client, state=request.state, config_dir=request.config_dir, files=request.files,
                       targets=request.targets, data_dir=request.data_dir)


def fetch(client: EngineClient, state: str, scope: Scope) -> Snapshot:
    """The trunk rows the workspace starts from (the whole state for ``*``)."""
    snapshot = fetch_snapshot(client, state) if scope.whole else fetch_rows(client, state, scope.slice_globs)
    if scope.footprint is not None:
        snapshot = described_part(snapshot, scope.described)
    if snapshot.raw is None or snapshot.parsed is None:
        raise InvalidInput(f"state {state!r} has no versions yet: there is nothing to check")
    return snapshot


def _open(client: EngineClient, request: DriftRequest, scope: Scope, *, write: bool,
          kind: str) -> tuple[ApplyRun, Snapshot]:
    """Fetch the slice and open a run holding the scope's reservations at the slice's serial (re-fetched
    when a commit landed on the slice in between). A conflict fails kl drift (its exit 2 says drift)."""
    mode = Mode.WRITE if write else Mode.READ
    reservations = [Reservation(g, mode) for g in scope.checked] + [Reservation(g, Mode.READ) for g in scope.read]
    refused = check_refused(kind, write=write)
    for _ in range(3):
        chosen = fetch(client, request.state, scope)
        try:
            run = ApplyRun.open(client, request.state, holder=request.actor, reservations=reservations,
                                wait_seconds=request.wait_seconds, lease_seconds=request.lease_seconds,
                                base_serial=chosen.serial, info={"kind": kind}, refused=refused)
        except StalePlan:
            continue
        return run, chosen
    raise Failed("the slice kept changing under commits of other runs: retry kl " + kind)


def _workspace(request: DriftRequest, scope: Scope, chosen: Snapshot, dest: Path) -> workspace.Workspace:
    """The check's workspace: the whole configuration, or the minimal cut of the ``-f`` footprint."""
    minimal = None
    if scope.footprint is not None and scope.files is not None:
        minimal = workbuild.cut(request.config_dir, scope.files, scope.footprint, load_cache(request.data_dir))
    return workbuild.build(request.config_dir, dest, chosen.raw, minimal)


def _checked_count(chosen: Snapshot, scope: Scope) -> int:
    covered = scope.covered()
    return sum(1 for a in managed_addresses(chosen.addresses) if covered(a))


def _record(client: EngineClient, request: DriftRequest, result: DriftResult, *, source: str,
            refreshed: int = 0) -> dict[str, Any]:
    return client.record_drift(request.state, {
        "source": source, "globs": list(result.globs), "checked": result.checked, "serial": result.serial,
        "run_id": result.run_id, "actor": request.actor, "refreshed": refreshed,
        "drifted": [] if source == "refresh" else [d.to_json() for d in result.drifted]})


def _drifted(plan: dict[str, Any], scope: Scope) -> tuple[DriftedInstance, ...]:
    try:
        return drift_in_plan(plan, include=scope.covered())
    except DriftFormatError as exc:
        raise Failed(f"cannot read Terraform's refresh-only plan: {exc}") from exc


@contextmanager
def _scratch(run: ApplyRun, kind: str, what: str) -> Iterator[Path]:
    """A directory for the run's Terraform work, removed when the block ends; a failure in the block closes
    the run as failed (``what`` failed: why) before it goes on."""
    tmp = Path(tempfile.mkdtemp(prefix=f"kl-{kind}-{run.id}-"))
    try:
        yield tmp
    except BaseException as exc:
        run.close_failed(f"{what} failed: {exc}")
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_drift(client: EngineClient, ctx: TerraformContext, request: DriftRequest) -> DriftResult:
    """kl drift: the refresh-only plan under read reservations, the report stored; the trunk is untouched."""
    scope = resolve_scope(client, request)
    run, chosen = _open(client, request, scope, write=False, kind="drift")
    with _scratch(run, "drift", "drift check") as tmp:
        plan = refresh_plan(ctx, _workspace(request, scope, chosen, tmp / "ws"), slice_targets(scope, chosen.addresses))
    run.close(RunStatus.ABORTED, "drift check (read only): reservations released")
    result = DriftResult(request.state, chosen.serial, _checked_count(chosen, scope), scope.checked,
                         _drifted(plan, scope), run.id)
    answer = _record(client, request, result, source="drift")
    return replace(result, drifted=_named(result.drifted, answer))


def _named(drifted: tuple[DriftedInstance, ...], answer: dict[str, Any]) -> tuple[DriftedInstance, ...]:
    """``drifted`` with the last change the server recorded for each instance, from its answer."""
    report = answer.get("report") if isinstance(answer, dict) else None
    found = report.get("found") if isinstance(report, dict) else None
    said = {e.get("address"): e.get("last_change") for e in found or () if isinstance(e, dict)}
    return tuple(replace(d, last_change=str(said.get(d.address) or "")) for d in drifted)


def _refreshed_state(after: ParsedState, before: ParsedState, scope: Scope) -> bytes:
    """What the refresh commits: the refreshed managed instances under the checked globs, every other row of
    the slice as the trunk holds it (data sources are re-read by every run and are not drift), and the
    trunk's outputs (they move with the next apply of the files that declare them)."""
    covered = scope.covered()
    return keep_trunk_rows(after, before, lambda row: row.mode == "managed" and covered(row.address))


@dataclass(frozen=True, slots=True)
class RefreshOutcome:
    result: DriftResult
    serial: int | None


def refresh(client: EngineClient, ctx: TerraformContext, request: DriftRequest, *, dry_run: bool) -> RefreshOutcome:
    """kl refresh: the refresh-only plan under write reservations on the checked addresses, applied, and the
    refreshed rows committed; the drift report updated. ``dry_run`` reports and releases, committing nothing."""
    scope = resolve_scope(client, request)
    run, chosen = _open(client, request, scope, write=True, kind="refresh")
    ctx.echo(f"reserved for run {run.id} ({request.actor}):")
    for glob in scope.checked:
        ctx.echo(f"  write {glob}")
    for glob in scope.read:
        ctx.echo(f"  read  {glob}")
    with _scratch(run, "refresh", "refresh") as tmp, run.heartbeat(request.lease_seconds, ctx.echo) as heartbeat:
        return _refresh_run(client, ctx, request, scope, chosen, run, tmp, heartbeat, dry_run)


def _refresh_run(client: EngineClient, ctx: TerraformContext, request: DriftRequest, scope: Scope, chosen: Snapshot,
                 run: ApplyRun, tmp: Path, heartbeat: Heartbeat, dry_run: bool) -> RefreshOutcome:
    run_id = run.id
    ws = _workspace(request, scope, chosen, tmp / "ws")
    plan = refresh_plan(ctx, ws, slice_targets(scope, chosen.addresses))
    drifted = _drifted(plan, scope)
    result = DriftResult(request.state, chosen.serial, _checked_count(chosen, scope), scope.checked, drifted, run_id)
    if dry_run:
        run.close(RunStatus.ABORTED, "dry run: reservations released")
        return RefreshOutcome(result, None)
    if drifted:
        apply_plan(ctx, ws, quiet=True)
    after = parse_state(read_state(ws) or b"") if drifted else chosen.parsed
    if not isinstance(after, ParsedState) or chosen.parsed is None:
        raise Failed("terraform left no readable state behind; nothing was committed")
    if heartbeat.lost:
        raise Failed(f"the reservations were lost during the refresh: {heartbeat.lost}; "
                                  "nothing was committed")
    body = json.loads(_refreshed_state(after, chosen.parsed, scope))
    try:
        answer = run.commit(body, list(chosen.addresses), prune_outputs=False)
    except EngineError as exc:
        raise refusal(exc.code)(f"commit refused: {exc}") from exc
    serial = answer.serial
    committed = DriftResult(result.state, serial if serial is not None else chosen.serial, result.checked,
                            result.globs, drifted, run_id)
    _record(client, request, committed, source="refresh", refreshed=len(drifted))
    return RefreshOutcome(committed, serial)


def shown_globs(globs: Sequence[str]) -> tuple[str, ...]:
    """Each glob once, as a person reads them: a file-scoped footprint reserves a resource as the pair
    ``X`` and ``X.*`` (the resource and every instance of it), shown as ``X``."""
    listed = set(globs)
    return tuple(dict.fromkeys(g for g in globs if not (g.endswith(".*") and g[:-2] in listed)))


def describe(result: DriftResult) -> list[str]:
    """The lines kl drift prints: addresses and attribute names, never values."""
    lines = [f"kl drift: state {result.state!r} at serial {result.serial}: {result.checked} managed instance(s) "
             f"checked under {', '.join(shown_globs(result.globs))}"]
    for item in result.drifted:
        if item.gone:
            lines.append(f"  gone     {item.address} (deleted outside Terraform)")
        else:
            lines.append(f"  drifted  {item.address}: {', '.join(item.attributes)}")
        if item.last_change:
            lines.append(f"           last change Kilolock recorded: {item.last_change}")
    if result.drifted:
        lines.append(f"{len(result.drifted)} drifted instance(s): kl refresh (with the same -f/--target) commits "
                     "what the objects are now; kl apply puts them back as configured")
    else:
        lines.append("no drift: the objects match the trunk")
    return lines
