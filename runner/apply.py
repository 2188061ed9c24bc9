"""``kl apply kl-plan.json``: reserve the plan's addresses, re-plan in a private workspace over the
trunk slice the configuration describes, apply, and commit the write set row by row. ``kl apply -f``
hands over the workspace it planned in, whose saved plan is applied without re-planning when nothing was
committed between the plan and the reservations (``saved_plan_refusal``).

The server re-checks every invariant at commit; the checks here only fail earlier and clearer.
A post-apply state that could not be committed is kept under KL_DATA_DIR/runs/RUN_ID for
``kl recover RUN_ID``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analyzer.drift import keep_trunk_rows
from analyzer.plan import analyze_plan
from analyzer.state import ParsedState, parse_state
from app.domain.commit import commit_delta, is_data_source, parse_globs, unreserved_read
from app.domain.reservations import DEFAULT_LEASE, LIVE_STATUSES
from runner import workspace
from runner.counts import counts_line
from runner.engine_client import EngineClient, EngineError
from runner.errors import REFUSALS, RUN_LOST, EngineCode, Failed, InvalidInput, KlExit, StalePlan, refusal
from runner.plan import (
    TerraformContext,
    described_part,
    fetch_snapshot,
    incidental_writes,
    plan_in_workspace,
    terraform,
    var_flags,
)
from runner.spec import PlanSpec
from runner.terraform import TerraformBinary


@dataclass(frozen=True, slots=True)
class ApplyOptions:
    actor: str
    wait_seconds: float | None
    dry_run: bool
    data_dir: Path
    supplied_vars: Mapping[str, str]  # sensitive values given again at apply time
    lease_seconds: float = DEFAULT_LEASE.total_seconds()


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


@dataclass(frozen=True, slots=True)
class ApplyOutcome:
    run_id: str
    serial: int | None
    changed: tuple[str, ...]
    rows: Mapping[str, int] = field(default_factory=dict)  # the commit's created/updated/deleted row counts


def check_spec(spec: PlanSpec, config_dir: Path, env: Mapping[str, str], supplied: Mapping[str, str]) -> None:
    """Refuse (exit 2: re-plan) when the configuration or the pinned inputs moved since kl plan."""
    if workspace.config_hash(config_dir) != spec.config_hash:
        raise StalePlan(f"the configuration in {config_dir} changed since kl plan: re-run kl plan")
    pinned_env = {v.name for v in spec.variables if v.kind == "env"}
    for key in sorted(k for k in env if k.startswith("TF_VAR_") and k not in pinned_env):
        raise StalePlan(f"{key} is set but was not when kl plan ran: re-run kl plan")
    for var in spec.variables:
        if var.kind in ("var-file", "auto-var-file"):
            path = Path(var.name)
            if not path.is_file() or workspace.file_hash(path) != var.sha256:
                raise StalePlan(f"{var.name} changed or vanished since kl plan (the variable values differ): "
                                "re-run kl plan")
        elif var.kind == "env":
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
    """Renews the run's lease in the background; a failed renew is loud and sticky."""

    def __init__(self, client: EngineClient, run_id: str, holder: str, every: float, echo: Any) -> None:
        self._client, self._run_id, self._holder, self._every, self._echo = client, run_id, holder, every, echo
        self._stop = threading.Event()
        self.lost: str | None = None
        self._thread = threading.Thread(target=self._loop, name="kl-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.wait(self._every):
            try:
                self._client.run_action(self._run_id, "renew", {"holder": self._holder})
            except EngineError as exc:
                if exc.code in RUN_LOST:
                    self.lost = str(exc)
                    self._echo(f"kl: LOST the reservations of {self._run_id}: {exc}. Nothing will be committed.")
                    return
                self._echo(f"kl: warning: lease renewal failed ({exc}); retrying")


def _save_recovery(data_dir: Path, run_id: str, spec: PlanSpec, holder: str, result: bytes,
                   slice_addresses: list[str], reason: str) -> Path:
    where = data_dir / "runs" / run_id
    where.mkdir(parents=True, exist_ok=True)
    (where / "terraform.tfstate").write_bytes(result)
    where.chmod(0o700)
    (where / "recovery.json").write_text(json.dumps({
        "run_id": run_id, "state": spec.state, "address": spec.address, "holder": holder,
        "base_serial": spec.base_serial, "slice_addresses": slice_addresses,
        "reservations": [{"glob": g, "mode": m} for g, m in spec.reservations], "reason": reason,
        "prune_outputs": pruned_outputs(spec),
    }, indent=2))
    return where


def pruned_outputs(spec: PlanSpec) -> bool | list[str]:
    """Which trunk outputs the commit may remove when the post-apply state lacks them: every one for a
    workspace of the whole configuration; for a file-scoped one, the outputs it declares (reserved for
    writing): one it declares but Terraform left out of the state became null."""
    if spec.mode == "full":
        return True
    return sorted(g.removeprefix("output.") for g in spec.write_globs if g.startswith("output.") and g != "output.*")


def _fail(client: EngineClient, run_id: str, holder: str, summary: str) -> None:
    try:
        client.run_action(run_id, "close", {"holder": holder, "status": "failed", "error_summary": summary[-2000:]})
    except EngineError:
        pass  # the lease or an operator may have ended it already; the error below is what matters


def saved_plan_refusal(saved: SavedPlan, spec: PlanSpec, ctx: TerraformContext, opened: Mapping[str, Any]
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
    serial, lineage = opened.get("granted_at_serial"), opened.get("granted_at_lineage")
    if saved.spec != spec or saved.binary != ctx.binary:
        return "the saved plan is not this plan's"
    if opened["run"].get("base_serial") != spec.base_serial or not isinstance(serial, int):
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
            info={"config_hash": spec.config_hash, "dry_run": options.dry_run},
        )
    except EngineError as exc:
        if exc.code in REFUSALS:
            raise refusal(exc.code)(str(exc)) from exc
        raise
    run_id = opened["run"]["id"]
    echo(f"reserved for run {run_id} ({options.actor}):")
    for g, m in spec.reservations:
        echo(f"  {m:<5} {g}")
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
            options: ApplyOptions, run_id: str) -> None:
    """Plan again in the run's workspace; refuse (exit 2) when the write set differs from the spec's."""
    try:
        plan = plan_in_workspace(ctx, prepared.ws, var_flags(spec.variables, options.supplied_vars), spec.targets,
                                 refresh=spec.refresh)
    except KlExit as exc:
        _fail(client, run_id, options.actor, str(exc))
        raise
    rewritten = incidental_writes(plan, prepared.slice_raw, spec.write_globs)
    # Data sources are compared by neither side: what one reads may change between the plan and now, and the
    # commit takes whatever the apply read for those under the write globs.
    replanned_writes = {a for a in (analyze_plan(plan).write_set | rewritten) - set(spec.orphans)
                        if not is_data_source(a)}
    planned = {a for a in spec.write_set if not is_data_source(a)}
    if replanned_writes != planned:
        extra = sorted(replanned_writes - planned)
        missing = sorted(planned - replanned_writes)
        message = (f"the re-plan over the trunk slice differs from kl-plan.json (new: {extra[:10]}, gone: "
                   f"{missing[:10]}); nothing was applied: re-run kl plan")
        _fail(client, run_id, options.actor, message)
        raise StalePlan(message)


def _apply_run(client: EngineClient, ctx: TerraformContext, spec: PlanSpec, builder: Builder,
               options: ApplyOptions, run_id: str, heartbeat: Heartbeat, saved: Prepared | None) -> ApplyOutcome:
    """Apply ``saved`` (the plan phase's workspace, its plan already checked to hold) as it is, or build the
    run's workspace and re-plan; then apply kl.tfplan and commit."""
    echo, holder = ctx.echo, options.actor
    tmp = Path(tempfile.mkdtemp(prefix=f"kl-apply-{run_id}-"))
    try:
        prepared = saved or builder(tmp / "ws")
        ws, slice_raw, slice_addresses = prepared.ws, prepared.slice_raw, prepared.slice_addresses
        if saved is None:
            _replan(client, ctx, spec, prepared, options, run_id)
        client.run_action(run_id, "running", {"holder": holder})
        echo(f"applying {len(spec.write_set)} change(s)...")
        try:
            terraform(ctx, ws, ["apply", "-input=false", "-lock=false", "-auto-approve", "-no-color",
                                "kl.tfplan"])
        except KlExit as exc:
            result = ws.read_state()
            where = _save_recovery(options.data_dir, run_id, spec, holder, result, slice_addresses,
                                   "apply failed") if result else None
            _fail(client, run_id, holder, str(exc))
            kept = (f"\nthe partial post-apply state is kept in {where}: if Terraform changed real infrastructure, "
                    f"kl recover {run_id} commits it") if where else ""
            raise Failed(f"{exc}\nnothing was committed; the trunk is unchanged{kept}") from exc
        result = ws.read_state() or b""
        if spec.refresh:
            result = _written_rows_only(result, slice_raw, spec)
        return _commit(client, spec, options, run_id, heartbeat, result, slice_raw, slice_addresses, echo)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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
        reason = (f"the apply changed addresses outside the plan's write set: {', '.join(surprise[:20])}"
                  if surprise else f"the reservations were lost during the apply: {heartbeat.lost}")
        where = _save_recovery(options.data_dir, run_id, spec, holder, result, slice_addresses, reason)
        _fail(client, run_id, holder, reason)
        raise Failed(f"{reason}; nothing was committed; the post-apply state is kept in {where}: run "
                        f"kl recover {run_id} to commit it")
    try:
        answer = client.commit(run_id, holder=holder, state=json.loads(result), slice_addresses=slice_addresses,
                               prune_outputs=pruned_outputs(spec))
    except EngineError as exc:
        where = _save_recovery(options.data_dir, run_id, spec, holder, result, slice_addresses, str(exc))
        if exc.code not in (EngineCode.LEASE_EXPIRED, EngineCode.RUN_CLOSED):
            _fail(client, run_id, holder, str(exc))
        raise refusal(exc.code)(f"commit refused: {exc}\nthe post-apply state is kept in {where}: run kl recover "
                           f"{run_id} to commit it (the infrastructure already changed; do not re-apply)") from exc
    serial = answer["commit"]["serial"]
    ctx_line = f"committed at serial {serial} (run {run_id})" if serial is not None else \
        f"nothing changed on the trunk (run {run_id})"
    c = answer["commit"]
    # Counted as Terraform counts them (a replace is one added and one destroyed), from the plan's actions.
    echo(f"apply complete: {counts_line(spec.actions)}")
    echo(ctx_line)
    return ApplyOutcome(run_id, serial, tuple(c["addresses"]), _rows(c))


def _rows(commit: Mapping[str, Any]) -> dict[str, int]:
    return {k: int(commit.get(k) or 0) for k in ("created", "updated", "deleted")}


def recover(client: EngineClient, data_dir: Path, run_id: str, actor: str | None, echo: Echo) -> ApplyOutcome:
    """Commit the post-apply state kept for a run: through the run itself while it is live, else
    through a new run holding the same reservations and checked against the same base serial."""
    where = data_dir / "runs" / run_id
    try:
        meta = json.loads((where / "recovery.json").read_text())
        result = (where / "terraform.tfstate").read_bytes()
    except FileNotFoundError as exc:
        raise InvalidInput(f"nothing kept for {run_id} in {where}") from exc
    holder = meta["holder"]
    target = run_id
    status = client.get_run(run_id)["run"]["status"]
    if status not in LIVE_STATUSES:
        holder = actor or holder
        try:
            opened = client.open_run(meta["state"], actor=holder, reservations=[
                (r["glob"], r["mode"]) for r in meta["reservations"]], base_serial=meta["base_serial"],
                info={"recovers": run_id})
        except EngineError as exc:
            raise refusal(exc.code)(f"cannot recover {run_id}: {exc}") from exc
        target = opened["run"]["id"]
    try:
        answer = client.commit(target, holder=holder, state=json.loads(result),
                               slice_addresses=meta["slice_addresses"], prune_outputs=meta.get("prune_outputs", True))
    except EngineError as exc:
        raise refusal(exc.code)(f"recovery commit refused: {exc}") from exc
    shutil.rmtree(where, ignore_errors=True)
    serial = answer["commit"]["serial"]
    echo(f"recovered {run_id}: committed at serial {serial} (run {target})")
    return ApplyOutcome(target, serial, tuple(answer["commit"]["addresses"]), _rows(answer["commit"]))
