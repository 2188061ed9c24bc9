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
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from analyzer.addresses import parse_instance_address
from analyzer.globs import Glob, GlobError, GlobKind, Mode, Reservation, matches, parse_glob
from analyzer.plan_drift import DriftedInstance, DriftFormatError, drift_in_plan, keep_trunk_rows, managed_addresses
from analyzer.state import ParsedState, parse_state
from app.domain.reservations import DEFAULT_LEASE
from runner.core import workspace
from runner.core.apply import Heartbeat
from runner.core.engine_client import EngineClient, EngineError
from runner.core.errors import REFUSALS, EngineCode, Failed, InvalidInput, ReservationRefused, refusal
from runner.core.plan import (
    PLAN_FILE,
    TerraformContext,
    described_part,
    fetch_rows,
    fetch_snapshot,
    init,
    show_plan,
    terraform,
)


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
class Scope:
    """The checked globs (reported, and written by a refresh), the other globs the workspace reads, and how
    to build the workspace's configuration."""

    checked: tuple[str, ...]
    read: tuple[str, ...]
    targets: tuple[str, ...]            # the --target globs -target is made from (none: the whole workspace)
    footprint: Any = None               # the file-scoped footprint (-f), else None
    files: Any = None                   # the configuration's root files (-f)
    described: frozenset[str] = frozenset()

    @property
    def slice_globs(self) -> tuple[str, ...]:
        return tuple(sorted(set(self.checked) | set(self.read)))


@dataclass(frozen=True, slots=True)
class Slice:
    raw: bytes | None
    parsed: ParsedState | None
    addresses: tuple[str, ...]

    @property
    def serial(self) -> int:
        return self.parsed.serial if self.parsed else 0


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


def _is_data_glob(glob: Glob) -> bool:
    return glob.resource is not None and glob.resource[0] == "data"


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


def slice_targets(scope: Scope, chosen: Slice) -> tuple[str, ...]:
    """The ``-target`` addresses of a check over the fetched slice."""
    if not scope.targets:
        return ()
    return target_addresses(scope.targets, chosen.addresses)


def resolve_scope(client: EngineClient, request: DriftRequest) -> Scope:
    """The globs a check covers. Raises InvalidInput for a bad glob or a footprint that fails closed."""
    if request.files and request.targets:
        raise InvalidInput("give either -f files or --target globs, not both")
    if request.targets:
        try:
            globs = tuple(sorted({str(parse_glob(t)) for t in request.targets}))
        except GlobError as exc:
            raise InvalidInput(f"--target: {exc}") from exc
        return Scope(checked=globs, read=(), targets=() if "*" in globs else globs)
    if not request.files:
        return Scope(checked=("*",), read=(), targets=())
    from analyzer.gcpause import gc_paused
    from analyzer.scoping import described_in
    from runner.core.filescoped import Selection, derive_footprint, read_configuration
    from runner.core.parsecache import load_cache

    files = read_configuration(request.config_dir)
    with gc_paused():
        scoped = derive_footprint(client, request.state, files, Selection(request.files), load_cache(request.data_dir))
    managed = tuple(g for g in scoped.write_globs if not _is_data_glob(parse_glob(g)))
    others = set(scoped.read_globs) | (set(scoped.write_globs) - set(managed))
    return Scope(checked=managed, read=tuple(sorted(others - set(managed))), targets=(), footprint=scoped.footprint,
                 files=files, described=frozenset(described_in(scoped.footprint, scoped.deleted_globs)))


def fetch(client: EngineClient, state: str, scope: Scope) -> Slice:
    """The trunk rows the workspace starts from (the whole state for ``*``)."""
    whole = scope.checked == ("*",)
    snapshot = fetch_snapshot(client, state) if whole else fetch_rows(client, state, scope.slice_globs)
    if scope.footprint is not None:
        snapshot = described_part(snapshot, scope.described)
    if snapshot.raw is None or snapshot.parsed is None:
        raise InvalidInput(f"state {state!r} has no versions yet: there is nothing to check")
    return Slice(snapshot.raw, snapshot.parsed, tuple(snapshot.addresses))


def _covered(scope: Scope) -> Any:
    globs = [parse_glob(g) for g in scope.checked]
    return lambda address: any(matches(g, address) for g in globs)


def _open(client: EngineClient, request: DriftRequest, scope: Scope, *, write: bool,
          kind: str) -> tuple[str, Slice]:
    """Fetch the slice and open a run holding the scope's reservations at the slice's serial (re-fetched
    when a commit landed on the slice in between)."""
    mode = Mode.WRITE if write else Mode.READ
    reservations = [Reservation(g, mode) for g in scope.checked] + [Reservation(g, Mode.READ) for g in scope.read]
    for _ in range(3):
        chosen = fetch(client, request.state, scope)
        try:
            opened = client.open_run(request.state, actor=request.actor, reservations=reservations,
                                     wait_seconds=request.wait_seconds, lease_seconds=request.lease_seconds,
                                     base_serial=chosen.serial, info={"kind": kind})
        except EngineError as exc:
            if exc.code == EngineCode.STALE_PLAN:
                continue
            if exc.code in REFUSALS:
                refused = ReservationRefused if write else Failed
                raise refused(f"cannot reserve the slice for kl {kind}:\n{exc}") from exc
            raise
        return opened.id, chosen
    raise Failed("the slice kept changing under commits of other runs: retry kl " + kind)


def _workspace(request: DriftRequest, scope: Scope, chosen: Slice, dest: Path) -> workspace.Workspace:
    if scope.footprint is not None:
        from runner.core.filescoped import build_minimal, module_layout
        from runner.core.git import work_tree_root
        from runner.core.parsecache import load_cache

        layout = module_layout(request.config_dir, scope.footprint, load_cache(request.data_dir),
                               work_tree_root(request.config_dir))
        return build_minimal(request.config_dir, scope.files, scope.footprint, dest, chosen.raw, layout)
    return workspace.build(request.config_dir, dest, chosen.raw)


def refresh_plan(ctx: TerraformContext, ws: workspace.Workspace, targets: Sequence[str]) -> dict[str, Any]:
    """init, plan -refresh-only -out, show -json (quietly: Terraform prints drifted values)."""
    init(ctx, ws)
    terraform(ctx, ws, ["plan", "-refresh-only", "-input=false", "-lock=false", "-no-color", f"-out={PLAN_FILE}",
                        *(f"-target={t}" for t in targets)], quiet=True)
    return show_plan(ctx, ws)


def _close(client: EngineClient, run_id: str, actor: str, status: str, summary: str) -> None:
    try:
        client.run_action(run_id, "close", {"holder": actor, "status": status, "error_summary": summary[-2000:]})
    except EngineError:
        pass  # the lease or an operator may have ended it already


def _checked_count(chosen: Slice, scope: Scope) -> int:
    covered = _covered(scope)
    return sum(1 for a in managed_addresses(chosen.addresses) if covered(a))


def _record(client: EngineClient, request: DriftRequest, result: DriftResult, *, source: str,
            refreshed: int = 0) -> dict[str, Any]:
    return client.record_drift(request.state, {
        "source": source, "globs": list(result.globs), "checked": result.checked, "serial": result.serial,
        "run_id": result.run_id, "actor": request.actor, "refreshed": refreshed,
        "drifted": [] if source == "refresh" else [d.to_json() for d in result.drifted]})


def _drifted(plan: dict[str, Any], scope: Scope) -> tuple[DriftedInstance, ...]:
    try:
        return drift_in_plan(plan, include=_covered(scope))
    except DriftFormatError as exc:
        raise Failed(f"cannot read Terraform's refresh-only plan: {exc}") from exc


def check_drift(client: EngineClient, ctx: TerraformContext, request: DriftRequest) -> DriftResult:
    """kl drift: the refresh-only plan under read reservations, the report stored; the trunk is untouched."""
    scope = resolve_scope(client, request)
    run_id, chosen = _open(client, request, scope, write=False, kind="drift")
    tmp = Path(tempfile.mkdtemp(prefix=f"kl-drift-{run_id}-"))
    try:
        plan = refresh_plan(ctx, _workspace(request, scope, chosen, tmp / "ws"), slice_targets(scope, chosen))
    except BaseException as exc:
        _close(client, run_id, request.actor, "failed", f"drift check failed: {exc}")
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _close(client, run_id, request.actor, "aborted", "drift check (read only): reservations released")
    result = DriftResult(request.state, chosen.serial, _checked_count(chosen, scope), scope.checked,
                         _drifted(plan, scope), run_id)
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
    covered = _covered(scope)
    return keep_trunk_rows(after, before, lambda row: row.mode == "managed" and covered(row.address))


@dataclass(frozen=True, slots=True)
class RefreshOutcome:
    result: DriftResult
    serial: int | None


def refresh(client: EngineClient, ctx: TerraformContext, request: DriftRequest, *, dry_run: bool) -> RefreshOutcome:
    """kl refresh: the refresh-only plan under write reservations on the checked addresses, applied, and the
    refreshed rows committed; the drift report updated. ``dry_run`` reports and releases, committing nothing."""
    scope = resolve_scope(client, request)
    run_id, chosen = _open(client, request, scope, write=True, kind="refresh")
    ctx.echo(f"reserved for run {run_id} ({request.actor}):")
    for glob in scope.checked:
        ctx.echo(f"  write {glob}")
    for glob in scope.read:
        ctx.echo(f"  read  {glob}")
    tmp = Path(tempfile.mkdtemp(prefix=f"kl-refresh-{run_id}-"))
    try:
        with Heartbeat(client, run_id, request.actor, max(request.lease_seconds / 3, 1.0), ctx.echo) as heartbeat:
            return _refresh_run(client, ctx, request, scope, chosen, run_id, tmp, heartbeat, dry_run)
    except BaseException as exc:
        _close(client, run_id, request.actor, "failed", f"refresh failed: {exc}")
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _refresh_run(client: EngineClient, ctx: TerraformContext, request: DriftRequest, scope: Scope, chosen: Slice,
                 run_id: str, tmp: Path, heartbeat: Heartbeat, dry_run: bool) -> RefreshOutcome:
    ws = _workspace(request, scope, chosen, tmp / "ws")
    plan = refresh_plan(ctx, ws, slice_targets(scope, chosen))
    drifted = _drifted(plan, scope)
    result = DriftResult(request.state, chosen.serial, _checked_count(chosen, scope), scope.checked, drifted, run_id)
    if dry_run:
        _close(client, run_id, request.actor, "aborted", "dry run: reservations released")
        return RefreshOutcome(result, None)
    if drifted:
        terraform(ctx, ws, ["apply", "-input=false", "-lock=false", "-auto-approve", "-no-color", PLAN_FILE],
                  quiet=True)
    after = parse_state(ws.read_state() or b"") if drifted else chosen.parsed
    if not isinstance(after, ParsedState) or chosen.parsed is None:
        raise Failed("terraform left no readable state behind; nothing was committed")
    if heartbeat.lost:
        raise Failed(f"the reservations were lost during the refresh: {heartbeat.lost}; "
                                  "nothing was committed")
    body = json.loads(_refreshed_state(after, chosen.parsed, scope))
    try:
        answer = client.commit(run_id, holder=request.actor, state=body, slice_addresses=list(chosen.addresses),
                               prune_outputs=False)
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
