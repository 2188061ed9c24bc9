"""``kl apply kl-plan.json``: reserve the plan's addresses, re-plan in a private workspace over the
trunk slice the configuration describes, apply, and commit the write set row by row. ``kl apply -f``
hands over the workspace it planned in, whose saved plan is applied without re-planning when nothing was
committed between the plan and the reservations (``runner.core.run.saved_plan_refusal``).

Before Terraform applies, the server's dry commit checks the plan's changes by the commit's own rules
(write reservations, staleness, the run's liveness), so every refusal the plan makes knowable comes
before the infrastructure changes; the server re-checks every invariant at commit. What ``kl recover``
needs is kept under KL_DATA_DIR/runs/RUN_ID from before the apply until the commit (``runner.core.recovery``).
An operator's abort of an applying run reaches the heartbeat, which stops Terraform before the run is
closed.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from analyzer.plan import analyze_plan
from analyzer.plan_drift import keep_trunk_rows
from analyzer.state import ParsedState, parse_state
from app.domain.commit import commit_delta, is_data_source, parse_globs, unreserved_read
from app.domain.reservations import DEFAULT_LEASE, RunStatus
from runner.core import pins
from runner.core.counts import counts_line
from runner.core.engine_client import EngineClient, EngineError
from runner.core.errors import RUN_LOST, EngineCode, Failed, KlExit, StalePlan, refusal
from runner.core.plan import changed_outputs, incidental_writes
from runner.core.recovery import ApplyOutcome, forget, has_kept_state, pruned_outputs, save_recovery
from runner.core.run import ApplyRun, Heartbeat, saved_plan_refusal
from runner.core.session import TerraformContext, apply_plan, plan_in_workspace, read_state, var_flags
from runner.core.spec import PlanMode, PlanSpec
from runner.core.workbuild import Builder, Prepared, SavedPlan, rebuild


@dataclass(frozen=True, slots=True)
class ApplyOptions:
    actor: str
    wait_seconds: float | None
    dry_run: bool
    data_dir: Path
    supplied_vars: Mapping[str, str]  # sensitive values given again at apply time
    lease_seconds: float = DEFAULT_LEASE.total_seconds()
    # Where a bot apply comes from (repository, pull_request, merge_commit), kept in the run's info as "bot".
    origin: Mapping[str, Any] | None = None


# Where a command's account of what it did goes (the TerraformContext's echo).
Echo = Callable[[str], None]


def apply_spec(client: EngineClient, ctx: TerraformContext, spec: PlanSpec, config_dir: Path,
               options: ApplyOptions, *, builder: Builder | None = None, saved: SavedPlan | None = None
               ) -> ApplyOutcome:
    """Check the spec's pins, then reserve, re-plan, apply and commit ``spec``. ``builder`` makes the
    workspace (default: the whole configuration); ``saved`` is the plan phase's kept workspace, applied
    without re-planning when ``saved_plan_refusal`` allows it."""
    pins.verify(spec, config_dir, ctx.env, options.supplied_vars)
    info = {**run_info(spec.config_hash, options.dry_run, config_dir),
            **({"bot": dict(options.origin)} if options.origin else {})}
    builder = builder or rebuild(client, spec, config_dir, data_dir=options.data_dir)
    echo = ctx.echo
    if not spec.write_set and not spec.output_changes:
        echo("kl apply: the plan has no changes; nothing to do")
        return ApplyOutcome("", None, ())
    run = ApplyRun.open(client, spec.state, holder=options.actor, reservations=spec.reservations,
                        wait_seconds=options.wait_seconds, lease_seconds=options.lease_seconds,
                        base_serial=spec.base_serial, info=info)
    echo(f"reserved for run {run.id} ({options.actor}):")
    for r in spec.reservations:
        echo(f"  {r.mode:<5} {r.glob}")
    if options.dry_run:
        not_closed = run.close(RunStatus.ABORTED, "dry run: reservations released")
        if not_closed is not None:
            raise not_closed
        echo(f"dry run: would apply {len(spec.write_set)} change(s) to {spec.state!r} at serial "
             f"{spec.base_serial}; reservations released")
        return ApplyOutcome(run.id, None, ())
    reuse: Prepared | None = None
    if saved is not None:
        refused = saved_plan_refusal(saved, spec, ctx, run.opened)
        if refused is None:
            reuse = saved.prepared
            echo(f"the trunk has not moved since the plan (serial {spec.base_serial}): applying the saved plan")
        else:
            echo(f"{refused}: re-planning over a fresh slice")
    with run.heartbeat(options.lease_seconds, echo) as heartbeat:
        return _apply_run(run, ctx, spec, builder, options, heartbeat, reuse)


def _replan(run: ApplyRun, ctx: TerraformContext, spec: PlanSpec, prepared: Prepared,
            options: ApplyOptions) -> Planned:
    """Plan again in the run's workspace; refuse (exit 2) when the write set differs from the spec's.
    Returns what the new plan changes."""
    try:
        plan = plan_in_workspace(ctx, prepared.ws, var_flags(spec.variables, options.supplied_vars), spec.targets,
                                 refresh=spec.refresh)
    except KlExit as exc:
        run.close_failed(str(exc))
        raise
    analysis = analyze_plan(plan)
    rewritten = incidental_writes(plan, prepared.slice_raw, spec.write_globs)
    writes = (analysis.write_set | rewritten) - set(spec.orphans)
    try:
        pins.verify_replan(spec, writes)
    except StalePlan as exc:
        run.close_failed(str(exc))
        raise
    # A file-scoped workspace lacks the other files' outputs, which Terraform plans as deletes: only the deletes
    # the plan file itself names (outputs its files declare or deleted) are changes of this apply.
    outputs = {name for name, action in changed_outputs(analysis).items()
               if spec.mode == PlanMode.FULL or action != "delete" or name in spec.output_changes}
    return Planned(tuple(sorted(writes)), tuple(sorted(outputs)))


@dataclass(frozen=True, slots=True)
class Planned:
    """What the plan about to be applied changes: instance addresses and root output names."""

    addresses: tuple[str, ...]
    outputs: tuple[str, ...]


def _dry_commit(run: ApplyRun, planned: Planned, echo: Echo) -> None:
    """Ask the server whether the commit of these changes would be refused, before Terraform applies them;
    a refusal closes the run and stops here, with the infrastructure untouched."""
    try:
        run.dry_commit(list(planned.addresses), list(planned.outputs))
    except EngineError as exc:
        message = f"{exc}\nrefused before apply: Terraform applied nothing, the infrastructure and the trunk are " \
                  "unchanged"
        if exc.code not in RUN_LOST:
            run.close_failed(message)
        raise refusal(exc.code)(message) from exc
    echo("the server's dry commit accepts the plan's changes")


def _apply_run(run: ApplyRun, ctx: TerraformContext, spec: PlanSpec, builder: Builder,
               options: ApplyOptions, heartbeat: Heartbeat, saved: Prepared | None) -> ApplyOutcome:
    """Apply ``saved`` (the plan phase's workspace, its plan already checked to hold) as it is, or build the
    run's workspace and re-plan; dry-commit what the plan changes; then apply kl.tfplan and commit."""
    echo, holder, run_id = ctx.echo, options.actor, run.id
    tmp = Path(tempfile.mkdtemp(prefix=f"kl-apply-{run_id}-"))
    try:
        prepared = saved or builder(tmp / "ws")
        ws, slice_addresses = prepared.ws, prepared.slice_addresses
        planned = _replan(run, ctx, spec, prepared, options) if saved is None else \
            Planned(spec.write_set, tuple(sorted(spec.output_changes)))
        _dry_commit(run, planned, echo)
        run.running()
        # From here Terraform may change infrastructure: keep what kl recover needs even if kl is killed.
        pending = save_recovery(options.data_dir, run_id, spec, holder, None, slice_addresses,
                                "kl ended while Terraform was applying", workspace_state=ws.state_file)
        try:
            outcome = _apply_and_commit(run, ctx, spec, options, heartbeat, prepared)
        except BaseException:
            if not has_kept_state(pending):
                forget(pending)  # Terraform wrote no state: nothing to recover
            raise
        forget(pending)
        return outcome
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _apply_and_commit(run: ApplyRun, ctx: TerraformContext, spec: PlanSpec, options: ApplyOptions,
                      heartbeat: Heartbeat, prepared: Prepared) -> ApplyOutcome:
    echo, holder, ws, run_id = ctx.echo, options.actor, prepared.ws, run.id
    echo(f"applying {len(spec.write_set)} change(s)...")
    heartbeat.watching.set()
    try:
        apply_plan(replace(ctx, stop=heartbeat.stop), ws)
    except BaseException as exc:
        heartbeat.watching.clear()
        # Terraform has stopped (run() returns or raises only then): its reservations may end now.
        result = read_state(ws)
        why = f"an abort stopped Terraform ({heartbeat.aborted})" if heartbeat.aborted else \
            f"the reservations were lost: {heartbeat.lost}" if heartbeat.lost else str(exc)
        where = save_recovery(options.data_dir, run_id, spec, holder, result, prepared.slice_addresses,
                              why) if result else None
        run.close(RunStatus.ABORTED if heartbeat.aborted else RunStatus.FAILED, why)
        if not isinstance(exc, KlExit):
            raise
        kept = (f"\nthe partial post-apply state is kept in {where}: if Terraform changed real infrastructure, "
                f"kl recover {run_id} commits it") if where else ""
        head = f"{why}\n{exc}" if heartbeat.aborted or heartbeat.lost else str(exc)
        raise Failed(f"{head}\nnothing was committed; the trunk is unchanged{kept}") from exc
    heartbeat.watching.clear()
    result = read_state(ws) or b""
    if spec.refresh:
        result = _written_rows_only(result, prepared.slice_raw, spec)
    return _commit(run, spec, options, heartbeat, result, prepared.slice_raw, prepared.slice_addresses, echo)


def _written_rows_only(result: bytes, slice_raw: bytes | None, spec: PlanSpec) -> bytes:
    """kl plan --refresh refreshed the whole workspace; only the write set's rows are this run's to commit."""
    after, before = parse_state(result), parse_state(slice_raw) if slice_raw else None
    if not isinstance(after, ParsedState):
        return result
    written = set(spec.write_set)
    return keep_trunk_rows(after, before if isinstance(before, ParsedState) else None,
                           lambda row: row.address in written)


def _commit(run: ApplyRun, spec: PlanSpec, options: ApplyOptions, heartbeat: Heartbeat,
            result: bytes, slice_raw: bytes | None, slice_addresses: list[str], echo: Echo) -> ApplyOutcome:
    holder, run_id = options.actor, run.id
    parsed = parse_state(result)
    before = parse_state(slice_raw) if slice_raw else None
    if not isinstance(parsed, ParsedState):
        raise Failed("terraform left no readable state behind; nothing was committed")
    base = {(r.address, r.deposed): r.attributes_hash for r in before.instances} \
        if isinstance(before, ParsedState) else {}
    delta = commit_delta(base, parsed.instances, slice_addresses,
                         skip=unreserved_read(parse_globs(spec.write_globs)))
    # Data sources no write glob covers are skipped (the trunk keeps its copy); those it covers are re-read and
    # committed, whatever they read.
    surprise = sorted(a for a in set(delta.addresses) - set(spec.write_set) if not is_data_source(a))
    if surprise or heartbeat.lost:
        reason = (f"Terraform changed addresses its plan did not show (the plan passed the dry commit): "
                  f"{', '.join(surprise[:20])}" if surprise
                  else f"the reservations were lost during the apply: {heartbeat.lost}")
        where = save_recovery(options.data_dir, run_id, spec, holder, result, slice_addresses, reason)
        run.close_failed(reason)
        raise Failed(f"{reason}; nothing was committed; the post-apply state is kept in {where}: run "
                        f"kl recover {run_id} to commit it")
    try:
        commit = run.commit(json.loads(result), slice_addresses, pruned_outputs(spec))
    except EngineError as exc:
        where = save_recovery(options.data_dir, run_id, spec, holder, result, slice_addresses, str(exc))
        if exc.code not in (EngineCode.LEASE_EXPIRED, EngineCode.RUN_CLOSED):
            run.close_failed(str(exc))
        # The dry commit accepted the plan's changes: a refusal now means Terraform did what the plan did not
        # say (or the run was lost meanwhile).
        cause = "Terraform changed what its plan did not show, which the dry commit could not foresee" \
            if exc.code == EngineCode.WRITE_OUTSIDE_RESERVATION else "the run changed hands during the apply" \
            if exc.code in RUN_LOST else "the commit's checks no longer hold after the apply"
        raise refusal(exc.code)(f"commit refused after apply ({cause}): {exc}\nthe post-apply state is kept in "
                                f"{where}: run kl recover {run_id} to commit it (the infrastructure already "
                                "changed; do not re-apply)") from exc
    serial, rows = commit.serial, commit.rows
    ctx_line = f"committed at serial {serial} (run {run_id})" if serial is not None else \
        f"nothing changed on the trunk (run {run_id})"
    # Counted as Terraform counts them (a replace is one added and one destroyed), from the plan's actions.
    echo(f"apply complete: {counts_line(spec.actions)}")
    echo(ctx_line)
    return ApplyOutcome(run_id, serial, commit.addresses, rows)


def run_info(config_hash: str, dry_run: bool, config_dir: Path) -> dict[str, Any]:
    """What a run records about its plan: the configuration's hash, whether it is a dry run, and the git
    commit checked out where the configuration lives (none outside git)."""
    from runner.core.behind import config_commit

    commit = config_commit(config_dir)
    return {"config_hash": config_hash, "dry_run": dry_run, **({"git_commit": commit} if commit else {})}
