"""``kl apply kl-plan.json``: reserve the plan's addresses, re-plan in a private workspace over the
trunk slice the configuration describes, apply, and commit the write set row by row. ``kl apply -f``
hands over the workspace it planned in, whose saved plan is applied without re-planning when nothing was
committed between the plan and the reservations (``saved_plan_refusal``).

Before Terraform applies, the server's dry commit checks the plan's changes by the commit's own rules
(write reservations, staleness, the run's liveness), so every refusal the plan makes knowable comes
before the infrastructure changes; the server re-checks every invariant at commit. What ``kl recover``
needs is kept under KL_DATA_DIR/runs/RUN_ID from before the apply until the commit (``runner.core.recovery``).
An operator's abort of an applying run reaches the heartbeat, which stops Terraform before the run is
closed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from analyzer.plan import analyze_plan
from analyzer.plan_drift import keep_trunk_rows
from analyzer.state import ParsedState, parse_state
from app.domain.commit import commit_delta, is_data_source, parse_globs, unreserved_read
from app.domain.reservations import DEFAULT_LEASE, LIVE_STATUSES, RunStatus
from runner.core import workspace
from runner.core.counts import counts_line
from runner.core.engine_client import EngineClient, EngineError, OpenedRun
from runner.core.errors import REFUSALS, RUN_LOST, EngineCode, Failed, InvalidInput, KlExit, StalePlan, refusal
from runner.core.plan import (
    TerraformContext,
    changed_outputs,
    described_part,
    fetch_snapshot,
    incidental_writes,
    plan_in_workspace,
    terraform,
    var_flags,
)
from runner.core.recovery import ApplyOutcome, forget, has_kept_state, pruned_outputs, save_recovery
from runner.core.spec import PinKind, PlanMode, PlanSpec
from runner.core.terraform import TerraformBinary


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


@dataclass(frozen=True, slots=True)
class Prepared:
    """A workspace ready to re-plan, with the slice it starts from."""

    ws: workspace.Workspace
    slice_raw: bytes | None
    slice_addresses: list[str]


@dataclass(frozen=True, slots=True)
class SavedPlan:
    """The plan phase's workspace, kept for the apply of the same ``kl apply -f`` invocation: ``prepared``
    holds the saved plan (kl.tfplan) beside the slice it was made over; ``spec`` is what that plan produced
    and ``binary`` the Terraform that made it."""

    prepared: Prepared
    spec: PlanSpec
    binary: TerraformBinary


# Where a command's account of what it did goes (the TerraformContext's echo).
Echo = Callable[[str], None]

# Builds the run's workspace under the given directory (it must not exist yet).
Builder = Callable[[Path], Prepared]


def check_spec(spec: PlanSpec, config_dir: Path, env: Mapping[str, str], supplied: Mapping[str, str]) -> None:
    """Refuse (exit 2: re-plan) when the configuration or the pinned inputs moved since kl plan."""
    if workspace.config_hash(config_dir) != spec.config_hash:
        raise StalePlan(f"the configuration in {config_dir} changed since kl plan: re-run kl plan")
    pinned_env = {v.name for v in spec.variables if v.kind == PinKind.ENV}
    for key in sorted(k for k in env if k.startswith("TF_VAR_") and k not in pinned_env):
        raise StalePlan(f"{key} is set but was not when kl plan ran: re-run kl plan")
    for var in spec.variables:
        if var.kind in (PinKind.VAR_FILE, PinKind.AUTO_VAR_FILE):
            path = Path(var.name)
            if not path.is_file() or workspace.file_hash(path) != var.sha256:
                raise StalePlan(f"{var.name} changed or vanished since kl plan (the variable values differ): "
                                "re-run kl plan")
        elif var.kind == PinKind.ENV:
            if hashlib.sha256(env.get(var.name, "").encode()).hexdigest() != var.sha256:
                raise StalePlan(f"{var.name} differs from what kl plan saw: re-run kl plan")
        elif var.value is None:
            given = supplied.get(var.name)
            if given is None:
                raise InvalidInput(f"variable {var.name} is sensitive and not stored in the plan file: pass it "
                                f"again with -var {var.name}=... or TF_VAR_{var.name}")
            if hashlib.sha256(given.encode()).hexdigest() != var.sha256:
                raise StalePlan(f"variable {var.name} differs from what kl plan used: re-run kl plan")


class Heartbeat:
    """Renews the run's lease in the background and watches the run's status between renewals. A failed
    renew is loud and sticky; while ``watching``, a run an operator is aborting, or one whose reservations
    are lost, sets ``stop``, which interrupts the Terraform command running under it
    (``TerraformContext.stop``)."""

    def __init__(self, client: EngineClient, run_id: str, holder: str, every: float, echo: Any,
                 poll: float = 2.0) -> None:
        self._client, self._run_id, self._holder, self._every, self._echo = client, run_id, holder, every, echo
        self._poll = min(poll, every)
        self._stop = threading.Event()
        self.stop = threading.Event()
        self.watching = threading.Event()  # set while Terraform applies: the run's status is watched
        self.lost: str | None = None
        self.aborted: str | None = None  # who aborted the run, and why (the run's error summary)
        self._thread = threading.Thread(target=self._loop, name="kl-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        waited = 0.0
        while not self._stop.wait(self._poll):
            waited += self._poll
            renew = waited >= self._every
            if not renew and not self.watching.is_set():
                continue
            try:
                if renew:
                    run = self._client.renew(self._run_id, self._holder)
                    waited = 0.0
                else:
                    run = self._client.run(self._run_id)
            except EngineError as exc:
                if exc.code in RUN_LOST:
                    self._lose(str(exc))
                    return
                self._echo(f"kl: warning: {'lease renewal' if renew else 'the run status check'} failed ({exc}); "
                           "retrying")
                continue
            if not self.watching.is_set():
                continue  # before and after the apply the caller itself moves the run on
            status = run.status
            if status == RunStatus.ABORTING and self.aborted is None:
                self.aborted = run.error_summary or "aborted"
                self._echo(f"kl: run {self._run_id} is being aborted ({self.aborted}): stopping Terraform")
                self.stop.set()
            elif status not in LIVE_STATUSES:
                self._lose(f"the run is {status}")
                return

    def _lose(self, why: str) -> None:
        self.lost = why
        self._echo(f"kl: LOST the reservations of {self._run_id}: {why}. Stopping Terraform; nothing will be "
                   "committed.")
        self.stop.set()


def _fail(client: EngineClient, run_id: str, holder: str, summary: str, status: str = "failed") -> None:
    try:
        client.run_action(run_id, "close", {"holder": holder, "status": status, "error_summary": summary[-2000:]})
    except EngineError:
        pass  # the lease or an operator may have ended it already; the error below is what matters


def saved_plan_refusal(saved: SavedPlan, spec: PlanSpec, ctx: TerraformContext, opened: OpenedRun
                       ) -> str | None:
    """Why the saved plan may not be applied as it is (None: it may), given the answer that opened the run.

    A re-plan would see exactly the saved plan's inputs, so applying the saved plan is what it would apply:
    - the configuration: the kept workspace was cut from the files the spec pins, and the caller has
      checked them (check_files, check_spec) since; the variables, refresh mode and Terraform binary are
      the plan's own (same spec, same binary);
    - the trunk: the plan's slice was read at ``spec.base_serial`` (and ``spec.lineage``). The run was opened
      at that base serial, and the server read the head serial (``granted_at_serial``) under the state's
      row lock in the very transaction that granted the reservations, then the lineage of that serial's
      version (``granted_at_lineage``; a committed version never changes). Every write of a new state
      content (a row-level commit, a Terraform POST) takes that lock and raises the serial strictly in its
      own transaction, so an equal serial means nothing landed between the slice read and the grant — a
      commit racing the slice read itself (the slice's rows are read after its serial) raised it too. The
      lineage also tells a state deleted and created again apart (its serials start over): lineage and
      serial are what Terraform itself checks before it applies a saved plan. After the grant the
      reservations cover every slice glob (the write globs and the read and validation globs), and the
      server refuses any other writer on them until this run ends. The rows a rebuild would fetch are
      therefore the rows the plan was made over.
    Anything else (a server that does not say, a commit in between) takes the re-plan."""
    serial, lineage = opened.granted_at_serial, opened.granted_at_lineage
    if saved.spec != spec or saved.binary != ctx.binary:
        return "the saved plan is not this plan's"
    if opened.run.base_serial != spec.base_serial or not isinstance(serial, int):
        return "the server did not say where the trunk stood when the reservations were granted"
    if serial != spec.base_serial:
        return f"the trunk moved since the plan (serial {spec.base_serial}, now {serial})"
    if lineage != spec.lineage:
        return "the state was replaced since the plan (its lineage differs)"
    return None


def full_builder(client: EngineClient, spec: PlanSpec, config_dir: Path) -> Builder:
    """The whole configuration over the trunk instances it describes (kl apply kl-plan.json)."""
    def build(dest: Path) -> Prepared:
        # The trunk as the plan saw it. The reserved addresses cannot have changed since (the stale
        # check guarantees it), and every other address is this checkout's business only if it
        # writes it: starting from the head would re-plan, and revert, other runs' commits the
        # checkout does not know about. The server diffs against the same base serial.
        snapshot = fetch_snapshot(client, spec.state, serial=spec.base_serial or None)
        part = described_part(snapshot, frozenset(spec.described_resources))
        return Prepared(workspace.build(config_dir, dest, part.raw), part.raw, part.addresses)

    return build


def apply_spec(client: EngineClient, ctx: TerraformContext, spec: PlanSpec, config_dir: Path,
               options: ApplyOptions, *, builder: Builder | None = None, checked: bool = False,
               saved: SavedPlan | None = None) -> ApplyOutcome:
    """Reserve, re-plan, apply and commit ``spec``. ``builder`` makes the workspace (default: the whole
    configuration); ``checked`` says the caller already verified the configuration against the spec;
    ``saved`` is the plan phase's kept workspace, applied without re-planning when ``saved_plan_refusal``
    allows it."""
    if not checked:
        check_spec(spec, config_dir, ctx.env, options.supplied_vars)
    builder = builder or full_builder(client, spec, config_dir)
    echo = ctx.echo
    if not spec.write_set and not spec.output_changes:
        echo("kl apply: the plan has no changes; nothing to do")
        return ApplyOutcome("", None, ())
    try:
        opened = client.open_run(
            spec.state, actor=options.actor, reservations=spec.reservations, wait_seconds=options.wait_seconds,
            lease_seconds=options.lease_seconds, base_serial=spec.base_serial,
            info={**run_info(spec.config_hash, options.dry_run, config_dir),
                  **({"bot": dict(options.origin)} if options.origin else {})},
        )
    except EngineError as exc:
        if exc.code in REFUSALS:
            raise refusal(exc.code)(str(exc)) from exc
        raise
    run_id = opened.id
    echo(f"reserved for run {run_id} ({options.actor}):")
    for r in spec.reservations:
        echo(f"  {r.mode:<5} {r.glob}")
    if options.dry_run:
        client.run_action(run_id, "close", {"holder": options.actor, "status": "aborted",
                                            "error_summary": "dry run: reservations released"})
        echo(f"dry run: would apply {len(spec.write_set)} change(s) to {spec.state!r} at serial "
             f"{spec.base_serial}; reservations released")
        return ApplyOutcome(run_id, None, ())
    reuse: Prepared | None = None
    if saved is not None:
        refused = saved_plan_refusal(saved, spec, ctx, opened)
        if refused is None:
            reuse = saved.prepared
            echo(f"the trunk has not moved since the plan (serial {spec.base_serial}): applying the saved plan")
        else:
            echo(f"{refused}: re-planning over a fresh slice")
    with Heartbeat(client, run_id, options.actor, max(options.lease_seconds / 3, 1.0), echo) as heartbeat:
        return _apply_run(client, ctx, spec, builder, options, run_id, heartbeat, reuse)


def _replan(client: EngineClient, ctx: TerraformContext, spec: PlanSpec, prepared: Prepared,
            options: ApplyOptions, run_id: str) -> Planned:
    """Plan again in the run's workspace; refuse (exit 2) when the write set differs from the spec's.
    Returns what the new plan changes."""
    try:
        plan = plan_in_workspace(ctx, prepared.ws, var_flags(spec.variables, options.supplied_vars), spec.targets,
                                 refresh=spec.refresh)
    except KlExit as exc:
        _fail(client, run_id, options.actor, str(exc))
        raise
    analysis = analyze_plan(plan)
    rewritten = incidental_writes(plan, prepared.slice_raw, spec.write_globs)
    writes = (analysis.write_set | rewritten) - set(spec.orphans)
    # Data sources are compared by neither side: what one reads may change between the plan and now, and the
    # commit takes whatever the apply read for those under the write globs.
    replanned_writes = {a for a in writes if not is_data_source(a)}
    planned = {a for a in spec.write_set if not is_data_source(a)}
    if replanned_writes != planned:
        extra = sorted(replanned_writes - planned)
        missing = sorted(planned - replanned_writes)
        message = (f"the re-plan over the trunk slice differs from kl-plan.json (new: {extra[:10]}, gone: "
                   f"{missing[:10]}); nothing was applied: re-run kl plan")
        _fail(client, run_id, options.actor, message)
        raise StalePlan(message)
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


def _dry_commit(client: EngineClient, run_id: str, holder: str, planned: Planned, echo: Echo) -> None:
    """Ask the server whether the commit of these changes would be refused, before Terraform applies them;
    a refusal closes the run and stops here, with the infrastructure untouched."""
    try:
        client.dry_commit(run_id, holder=holder, addresses=list(planned.addresses), outputs=list(planned.outputs))
    except EngineError as exc:
        message = f"{exc}\nrefused before apply: Terraform applied nothing, the infrastructure and the trunk are " \
                  "unchanged"
        if exc.code not in RUN_LOST:
            _fail(client, run_id, holder, message)
        raise refusal(exc.code)(message) from exc
    echo("the server's dry commit accepts the plan's changes")


def _apply_run(client: EngineClient, ctx: TerraformContext, spec: PlanSpec, builder: Builder,
               options: ApplyOptions, run_id: str, heartbeat: Heartbeat, saved: Prepared | None) -> ApplyOutcome:
    """Apply ``saved`` (the plan phase's workspace, its plan already checked to hold) as it is, or build the
    run's workspace and re-plan; dry-commit what the plan changes; then apply kl.tfplan and commit."""
    echo, holder = ctx.echo, options.actor
    tmp = Path(tempfile.mkdtemp(prefix=f"kl-apply-{run_id}-"))
    try:
        prepared = saved or builder(tmp / "ws")
        ws, slice_addresses = prepared.ws, prepared.slice_addresses
        planned = _replan(client, ctx, spec, prepared, options, run_id) if saved is None else \
            Planned(spec.write_set, tuple(sorted(spec.output_changes)))
        _dry_commit(client, run_id, holder, planned, echo)
        client.run_action(run_id, "running", {"holder": holder})
        # From here Terraform may change infrastructure: keep what kl recover needs even if kl is killed.
        pending = save_recovery(options.data_dir, run_id, spec, holder, None, slice_addresses,
                                "kl ended while Terraform was applying", workspace_state=ws.state_file)
        try:
            outcome = _apply_and_commit(client, ctx, spec, options, run_id, heartbeat, prepared)
        except BaseException:
            if not has_kept_state(pending):
                forget(pending)  # Terraform wrote no state: nothing to recover
            raise
        forget(pending)
        return outcome
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _apply_and_commit(client: EngineClient, ctx: TerraformContext, spec: PlanSpec, options: ApplyOptions,
                      run_id: str, heartbeat: Heartbeat, prepared: Prepared) -> ApplyOutcome:
    echo, holder, ws = ctx.echo, options.actor, prepared.ws
    echo(f"applying {len(spec.write_set)} change(s)...")
    heartbeat.watching.set()
    try:
        terraform(replace(ctx, stop=heartbeat.stop), ws, ["apply", "-input=false", "-lock=false", "-auto-approve",
                                                          "-no-color", "kl.tfplan"])
    except BaseException as exc:
        heartbeat.watching.clear()
        # Terraform has stopped (run() returns or raises only then): its reservations may end now.
        result = ws.read_state()
        why = f"an abort stopped Terraform ({heartbeat.aborted})" if heartbeat.aborted else \
            f"the reservations were lost: {heartbeat.lost}" if heartbeat.lost else str(exc)
        where = save_recovery(options.data_dir, run_id, spec, holder, result, prepared.slice_addresses,
                              why) if result else None
        _fail(client, run_id, holder, why, "aborted" if heartbeat.aborted else "failed")
        if not isinstance(exc, KlExit):
            raise
        kept = (f"\nthe partial post-apply state is kept in {where}: if Terraform changed real infrastructure, "
                f"kl recover {run_id} commits it") if where else ""
        head = f"{why}\n{exc}" if heartbeat.aborted or heartbeat.lost else str(exc)
        raise Failed(f"{head}\nnothing was committed; the trunk is unchanged{kept}") from exc
    heartbeat.watching.clear()
    result = ws.read_state() or b""
    if spec.refresh:
        result = _written_rows_only(result, prepared.slice_raw, spec)
    return _commit(client, spec, options, run_id, heartbeat, result, prepared.slice_raw, prepared.slice_addresses,
                   echo)


def _written_rows_only(result: bytes, slice_raw: bytes | None, spec: PlanSpec) -> bytes:
    """kl plan --refresh refreshed the whole workspace; only the write set's rows are this run's to commit."""
    after, before = parse_state(result), parse_state(slice_raw) if slice_raw else None
    if not isinstance(after, ParsedState):
        return result
    written = set(spec.write_set)
    return keep_trunk_rows(after, before if isinstance(before, ParsedState) else None,
                           lambda row: row.address in written)


def _commit(client: EngineClient, spec: PlanSpec, options: ApplyOptions, run_id: str, heartbeat: Heartbeat,
            result: bytes, slice_raw: bytes | None, slice_addresses: list[str], echo: Echo) -> ApplyOutcome:
    holder = options.actor
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
        _fail(client, run_id, holder, reason)
        raise Failed(f"{reason}; nothing was committed; the post-apply state is kept in {where}: run "
                        f"kl recover {run_id} to commit it")
    try:
        commit = client.commit(run_id, holder=holder, state=json.loads(result), slice_addresses=slice_addresses,
                               prune_outputs=pruned_outputs(spec))
    except EngineError as exc:
        where = save_recovery(options.data_dir, run_id, spec, holder, result, slice_addresses, str(exc))
        if exc.code not in (EngineCode.LEASE_EXPIRED, EngineCode.RUN_CLOSED):
            _fail(client, run_id, holder, str(exc))
        # The dry commit accepted the plan's changes: a refusal now means Terraform did what the plan did not
        # say (or the run was lost meanwhile).
        cause = "Terraform changed what its plan did not show, which the dry commit could not foresee" \
            if exc.code == EngineCode.WRITE_OUTSIDE_RESERVATION else "the run changed hands during the apply" \
            if exc.code in RUN_LOST else "the commit's checks no longer hold after the apply"
        raise refusal(exc.code)(f"commit refused after apply ({cause}): {exc}\nthe post-apply state is kept in "
                                f"{where}: run kl recover {run_id} to commit it (the infrastructure already "
                                "changed; do not re-apply)") from exc
    serial = commit.serial
    ctx_line = f"committed at serial {serial} (run {run_id})" if serial is not None else \
        f"nothing changed on the trunk (run {run_id})"
    # Counted as Terraform counts them (a replace is one added and one destroyed), from the plan's actions.
    echo(f"apply complete: {counts_line(spec.actions)}")
    echo(ctx_line)
    return ApplyOutcome(run_id, serial, commit.addresses, commit.rows)


def run_info(config_hash: str, dry_run: bool, config_dir: Path) -> dict[str, Any]:
    """What a run records about its plan: the configuration's hash, whether it is a dry run, and the git
    commit checked out where the configuration lives (none outside git)."""
    from runner.core.behind import config_commit

    commit = config_commit(config_dir)
    return {"config_hash": config_hash, "dry_run": dry_run, **({"git_commit": commit} if commit else {})}
