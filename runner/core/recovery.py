"""What an apply keeps on disk for ``kl recover``, and ``kl recover`` itself.

Before Terraform applies, ``kl apply`` writes KL_DATA_DIR/runs/RUN_ID/recovery.json (the state, the
reservations, the base serial, and where the workspace's state file is), so that even a ``kill -9`` of kl
leaves enough to commit what Terraform did. An apply that stops without committing copies the post-apply
state beside it (terraform.tfstate); a successful commit removes both. ``kl recover`` always ends: it
commits, or it says exactly why not and closes any run it opened itself.

Must not: run Terraform or decide what an apply may write (the server does, at commit).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from analyzer.globs import Mode, Reservation, canonical, matches_output, parse_glob
from analyzer.state import InstanceRow, ParsedState, parse_state
from analyzer.state_assembly import assemble_state
from app import atomic
from app.domain.reservations import LIVE_STATUSES
from runner.core.engine_client import Commit, EngineClient, EngineError
from runner.core.errors import REFUSALS, EngineCode, Failed, InvalidInput, KlExit, NothingToDo, refusal
from runner.core.run import ApplyRun, recovery_refused
from runner.core.spec import PlanMode, PlanSpec

Echo = Callable[[str], None]

_META, _STATE, _DONE = "recovery.json", "terraform.tfstate", "recovered.json"


@dataclass(frozen=True, slots=True)
class ApplyOutcome:
    run_id: str
    serial: int | None
    changed: tuple[str, ...]
    rows: Mapping[str, int] = field(default_factory=dict)  # the commit's created/updated/deleted row counts


def kept_dir(data_dir: Path, run_id: str) -> Path:
    return data_dir / "runs" / run_id


def pruned_outputs(spec: PlanSpec) -> bool | list[str]:
    """Which trunk outputs the commit may remove when the post-apply state lacks them: every one for a
    workspace of the whole configuration; for a file-scoped one, the outputs it declares (reserved for
    writing): one it declares but Terraform left out of the state became null."""
    if spec.mode == PlanMode.FULL:
        return True
    return sorted(g.removeprefix("output.") for g in spec.write_globs if g.startswith("output.") and g != "output.*")


def save_recovery(data_dir: Path, run_id: str, spec: PlanSpec, holder: str, result: bytes | None,
                  slice_addresses: list[str], reason: str, *, workspace_state: Path | None = None) -> Path:
    """Keep what ``kl recover`` needs: ``result`` (the post-apply state) when there is one, else the path of
    the workspace's state file Terraform is writing (``workspace_state``)."""
    where = kept_dir(data_dir, run_id)
    where.mkdir(parents=True, exist_ok=True)
    where.chmod(0o700)
    if result is not None:
        atomic.write_bytes(where / _STATE, result)
    meta: dict[str, Any] = {
        "run_id": run_id, "state": spec.state, "address": spec.address, "holder": holder,
        "base_serial": spec.base_serial, "slice_addresses": slice_addresses,
        "reservations": [r.to_json() for r in spec.reservations], "reason": reason,
        "prune_outputs": pruned_outputs(spec),
    }
    if workspace_state is not None:
        meta["workspace_state"] = str(workspace_state)
    atomic.write_text(where / _META, json.dumps(meta, indent=2))
    return where


def has_kept_state(where: Path) -> bool:
    return (where / _STATE).is_file()


def forget(where: Path) -> None:
    """Drop what was kept for a run (it committed, or Terraform changed nothing)."""
    shutil.rmtree(where, ignore_errors=True)


def _done(where: Path, run_id: str, target: str, serial: int | None) -> None:
    """Replace the kept state by a note of the commit, so a second ``kl recover`` can say what happened."""
    forget(where)
    where.mkdir(parents=True, exist_ok=True)
    atomic.write_text(where / _DONE, json.dumps({"run_id": run_id, "committed_by": target, "serial": serial}))


def _load(client: EngineClient, where: Path, run_id: str) -> tuple[dict[str, Any], bytes]:
    done = where / _DONE
    if done.is_file():
        note = json.loads(done.read_text())
        raise NothingToDo(f"{run_id} was already recovered: committed at serial {note.get('serial')} "
                          f"(run {note.get('committed_by')}); nothing left to recover")
    try:
        meta: dict[str, Any] = json.loads((where / _META).read_text())
    except FileNotFoundError as exc:
        _raise_nothing_kept(client, where, run_id, exc)
    path = where / _STATE
    if not path.is_file() and meta.get("workspace_state"):
        path = Path(meta["workspace_state"])  # kl ended while Terraform applied: its own state file
    try:
        return meta, path.read_bytes()
    except FileNotFoundError as exc:
        raise InvalidInput(f"nothing kept for {run_id}: {path} is gone (Terraform wrote no state); run a vanilla "
                           "terraform plan to see what the trunk lacks") from exc


def _raise_nothing_kept(client: EngineClient, where: Path, run_id: str, cause: Exception) -> NoReturn:
    try:
        run = client.get_run(run_id)["run"]
    except EngineError:
        raise InvalidInput(f"nothing kept for {run_id} in {where}") from cause
    if run.get("status") == "committed":
        raise NothingToDo(f"{run_id} already committed at serial {run.get('committed_serial')}; nothing to recover")
    raise InvalidInput(f"nothing kept for {run_id} in {where} (the run is {run.get('status')})") from cause


def recover(client: EngineClient, data_dir: Path, run_id: str, actor: str | None, echo: Echo) -> ApplyOutcome:
    """Commit the post-apply state kept for a run: through the run itself while it is live, else through a
    new run holding the same reservations, checked against the same base serial. Changes Terraform made
    outside the reservations are reserved too when they can be granted. On any refusal the new run is
    closed (failed) before the error, which names it; the kept state stays for another try."""
    where = kept_dir(data_dir, run_id)
    meta, result = _load(client, where, run_id)
    try:
        state = json.loads(result)
    except ValueError as exc:
        raise Failed(f"the state kept for {run_id} is not JSON (is its Terraform still stopping?): "
                     "try again in a moment") from exc
    run, opened = ApplyRun(client, run_id, meta["holder"]), None
    if client.run(run_id).status not in LIVE_STATUSES:
        run = opened = ApplyRun.open(
            client, meta["state"], holder=actor or run.holder, base_serial=meta["base_serial"],
            reservations=[Reservation.of(r["glob"], r["mode"]) for r in meta["reservations"]],
            info={"recovers": run_id}, refused=recovery_refused(run_id))
    try:
        commit = _commit_widening(run, state, meta, echo)
    except BaseException as exc:
        closed = _close_opened(opened, f"recovery of {run_id} refused: {exc}", run_id)
        if isinstance(exc, EngineError):
            raise refusal(exc.code)(f"recovery commit of {run_id} refused: {exc}{closed}; the kept state stays "
                                    f"in {where}") from exc
        if isinstance(exc, KlExit):
            raise type(exc)(f"{exc}{closed}") from exc
        raise
    _done(where, run_id, run.id, commit.serial)
    echo(f"recovered {run_id}: committed at serial {commit.serial} (run {run.id})")
    return ApplyOutcome(run.id, commit.serial, commit.addresses, commit.rows)


def _commit_widening(run: ApplyRun, state: dict[str, Any], meta: Mapping[str, Any], echo: Echo) -> Commit:
    """Commit; when the server names changes outside the write reservations (Terraform did what its plan
    did not say), ask for write reservations on exactly those, without waiting, and commit once more: all of
    it when they were granted, else only what lies inside the reservations (the rest keeps the trunk's copy)."""
    def commit() -> Commit:
        return run.commit(state, meta["slice_addresses"], meta.get("prune_outputs", True))

    try:
        return commit()
    except EngineError as exc:
        outside = exc.body.get("addresses") if exc.code == EngineCode.WRITE_OUTSIDE_RESERVATION else None
        if not outside or not all(isinstance(a, str) for a in outside):
            raise
        echo(f"Terraform changed {len(outside)} address(es) outside the reservations: {', '.join(outside[:10])}; "
             "reserving them to commit what it did")
        try:
            run.client.run_action(run.id, "reservations", {"holder": run.holder, "wait_seconds": 0, "reservations": [
                Reservation(a, Mode.WRITE).to_json() for a in outside]})
        except EngineError as more:
            if more.code not in REFUSALS:
                raise EngineError(f"{exc}; reserving them failed too: {more}", status=more.status, code=more.code,
                                  body=more.body) from more
            echo(f"kl: warning: they cannot be reserved ({more}); committing only what lies inside the "
                 f"reservations. The trunk keeps its old copy of {', '.join(outside[:10])}: once they are free, "
                 "kl drift and kl refresh with --target on them record what they are now")
            state = _inside_only(run.client, meta, state, outside)  # commit() reads it: it is this scope's
        return commit()


def _inside_only(client: EngineClient, meta: Mapping[str, Any], state: dict[str, Any], outside: list[str],
                 ) -> dict[str, Any]:
    """``state`` with the trunk's copy, at the base serial, of each outside instance address and root
    output (``output.NAME``): what is left for the commit is exactly what lies inside the reservations."""
    after = parse_state(json.dumps(state).encode())
    before = parse_state(client.assembled(meta["state"], serial=meta["base_serial"] or None))
    if not isinstance(after, ParsedState) or not isinstance(before, ParsedState):
        raise Failed("the kept state or the trunk cannot be read row by row; nothing was committed")
    globs = [parse_glob(text) for text in outside]
    named = [g for g in globs if g.is_output]
    addresses = {canonical(g) for g in globs if not g.is_output}

    def is_outside(row: InstanceRow) -> bool:
        return row.address in addresses

    instances = [r for r in after.instances if not is_outside(r)] + [r for r in before.instances if is_outside(r)]

    def outside_output(name: str) -> bool:
        return any(matches_output(g, name) for g in named)

    outputs = ([o for o in after.outputs if not outside_output(o.name)]
               + [o for o in before.outputs if outside_output(o.name)])
    doc: dict[str, Any] = json.loads(assemble_state(serial=after.serial, lineage=after.lineage,
                                                    terraform_version=after.terraform_version, instances=instances,
                                                    outputs=sorted(outputs, key=lambda o: o.name)))
    return doc


def _close_opened(opened: ApplyRun | None, summary: str, original: str) -> str:
    """Close the run recovery opened itself (failed); returns the words the refusal adds about it."""
    if opened is None:
        return (f"; run {original} is still live and holds its reservations until its lease lapses "
                f"(kl abort {original} ends it)")
    not_closed = opened.close_failed(summary)
    if not_closed is not None:
        return f"; the recovery run {opened.id} could not be closed ({not_closed}): kl abort {opened.id} ends it"
    return f"; the recovery run {opened.id} is closed and its reservations released"
