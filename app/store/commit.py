"""Row-level commit of a sliced apply: the one place where an apply run's result enters the trunk.

The run must be live, its caller's, and its lease unexpired; every changed address must lie inside its
write reservations; nothing it reserved may have changed since its base serial. Then only the write
set's rows change, a version row (source ``apply``) and its outputs are written at the next serial, the
run closes as committed and its reservations are released. Disjoint committers simply land at
consecutive serials.

Nothing here is proportional to the whole state, and little runs under the state's row lock. Before
the lock, without blocking anyone, the commit reads what cannot change under it: the run's base serial
and reservations, the trunk rows of the slice's addresses at the base serial and its outputs (rows at a
committed serial never change), and the rows changed since the base up to the head it saw (indexed by
serial); from those it computes the delta, the write-set check and the staleness of those changes.
Under the lock it costs two round trips: one pipeline that takes the lock and re-reads the run, its
reservations, the head, the head's outputs and the rows changed since the head it saw first (usually a
few other commits); then, after in-memory checks, one pipeline with the writes and COMMIT. The
version stores no raw bytes: its v4 state is assembled from the rows on first read and cached
(``app.store.assembly``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import class_row

from analyzer.globs import Mode, Reservation
from analyzer.state import EncryptedState, OutputRow, ParsedState
from app.domain import commit as rules
from app.domain import scopes
from app.domain.principal import Principal
from app.errors import BadRequestError, RunNotFoundError, StateLockedError, WriteOutsideReservationError
from app.store import events, history, reservation_rows, resources, runs, states
from app.store.db import Database

# Read before the lock: the run, its state and the head serial as of now (the staleness check re-reads
# only the changes after it under the lock).
_RUN = """
SELECT r.state_id, r.base_serial, coalesce(s.current_serial, 0)
FROM apply_runs r JOIN states s ON s.id = r.state_id
WHERE r.id = %s AND r.tenant_id = %s AND s.scope = %s
"""
_RUN_GLOBS = "SELECT glob, mode FROM resource_reservations WHERE run_id = %s ORDER BY glob, mode"
_BASE_ROWS = """
SELECT address, deposed, attributes_hash FROM resources
WHERE state_id = %s AND address = ANY(%s)
  AND create_serial <= %s AND (delete_serial IS NULL OR delete_serial > %s)
"""
_BASE_OUTPUTS = """
SELECT o.name, o.value::text AS value_json, o.type::text AS type_json, o.sensitive FROM outputs o
WHERE o.state_version_id = (SELECT id FROM state_versions WHERE state_id = %s AND serial <= %s
                            ORDER BY serial DESC LIMIT 1)
ORDER BY o.name
"""
# Under the lock, in one pipeline: the state row (the lock every writer of the state takes first), the
# run row, its reservations, the head, the head's outputs, and the rows changed after the head read above.
_LOCK_STATE = "SELECT name FROM states WHERE id = %s FOR UPDATE"
_LOCK_RUN = """
SELECT status, actor, state_id, credential FROM apply_runs WHERE id = %s AND tenant_id = %s FOR UPDATE
"""
_LOCKED_GLOBS = "SELECT glob, mode, expires_at FROM resource_reservations WHERE run_id = %s ORDER BY glob, mode"
_STATE_HEAD = """
SELECT s.lock_id, s.lock_info, coalesce(s.current_serial, 0), s.lineage, s.head_version_id, v.terraform_version,
       clock_timestamp()
FROM states s LEFT JOIN state_versions v ON v.id = s.head_version_id WHERE s.id = %s
"""
_HEAD_OUTPUTS = """
SELECT o.name, o.value::text AS value_json, o.type::text AS type_json, o.sensitive FROM outputs o
WHERE o.state_version_id = (SELECT head_version_id FROM states WHERE id = %s)
ORDER BY o.name
"""
_CLOSE_KEYS = """
UPDATE resources SET delete_serial = %s
FROM unnest(%s::text[], %s::text[]) AS k(address, deposed)
WHERE resources.state_id = %s AND resources.delete_serial IS NULL
  AND resources.address = k.address AND resources.deposed = k.deposed
"""
# The version row (no raw_state, sha256 or size_bytes: the first read assembles and caches them), its
# outputs, and the state's head, in one statement.
_INSERT_VERSION = """
WITH v AS (
    INSERT INTO state_versions (tenant_id, state_id, serial, lineage, terraform_version, encrypted, source, actor,
                                run_id, token_name)
    VALUES (%s, %s, %s, %s, %s, false, 'apply', %s, %s, %s)
    RETURNING id, tenant_id, state_id
), o AS (
    INSERT INTO outputs (state_version_id, state_id, tenant_id, name, value, type, sensitive)
    SELECT v.id, v.state_id, v.tenant_id, x.name, x.value::jsonb, x.type::jsonb, x.sensitive
    FROM v, unnest(%s::text[], %s::text[], %s::text[], %s::boolean[]) AS x(name, value, type, sensitive)
)
UPDATE states SET current_serial = %s, head_version_id = v.id, updated_at = now()
FROM v WHERE states.id = %s
"""
_FINISH = """
UPDATE apply_runs SET status = 'committed', committed_serial = %s, finished_at = %s, counters = counters || %s
WHERE id = %s
"""
_KEEP_GLOBS = "UPDATE apply_runs SET info = info || %s::jsonb WHERE id = %s"


@dataclass(frozen=True, slots=True)
class CommitResult:
    run_id: str
    serial: int | None  # None: nothing changed, no new version
    created: int
    updated: int
    deleted: int
    addresses: tuple[str, ...]
    outputs_changed: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DryCommit:
    """A dry commit's answer: the planned changes would be committed, were they applied now."""

    run_id: str
    base_serial: int
    head_serial: int
    addresses: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Before:
    """What the commit reads before taking the state's row lock; none of it can change under the lock
    except the reservations, which the locked read compares."""

    state_id: int
    base_serial: int | None
    seen_serial: int  # the head serial when these were read
    reserved: tuple[Reservation, ...]  # sorted by (glob, mode)
    base: dict[tuple[str, str], str]  # (address, deposed) -> attributes hash at the base serial
    base_outputs: list[OutputRow]
    changed: list[tuple[str, int]]  # rows changed after the base serial, up to seen_serial at least


@dataclass(frozen=True, slots=True)
class Locked:
    """What the commit reads under the state's row lock, and when it got the lock (the database's clock)."""

    state_name: str
    status: str
    actor: str
    credential: str
    reserved: tuple[Reservation, ...]
    expiries: list[datetime]
    lock_id: str | None
    lock_info: bytes | None
    head_serial: int
    lineage: str | None
    head_version_id: int | None
    terraform_version: str | None
    head_outputs: list[OutputRow]
    changed: list[tuple[str, int]]  # rows changed after _Before.seen_serial
    locked_at: datetime


@dataclass(frozen=True, slots=True)
class _Verdict:
    """The write-set check of one change against one set of reservations."""

    written: tuple[str, ...]  # the instance addresses it writes (unreserved data sources left out)
    outside: list[str]  # addresses and output.NAME outside the write globs
    stale: list[tuple[str, int]]  # of _Before.changed: reserved addresses changed after the base serial
    outputs_written: tuple[str, ...] = ()  # root outputs it adds, changes or removes


@dataclass(frozen=True, slots=True)
class _Checked:
    """The delta and its verdict, for one set of reservations."""

    reserved: tuple[Reservation, ...]
    delta: rules.CommitDelta
    verdict: _Verdict


def commit_run(
    db: Database, principal: Principal, run_id: str, *, holder: str, state_body: bytes,
    slice_addresses: Sequence[str], prune_outputs: rules.Prune = True, clock: runs.Clock = runs.utcnow,
) -> CommitResult:
    """Commit the post-apply state of a run's slice. Raises AddressScopeError, WriteOutsideReservationError,
    StalePlanError, LeaseExpiredError, RunClosedError, NotRunHolderError; refusals write nothing."""
    slice_addresses = rules.check_addresses(slice_addresses, "slice_addresses")
    parsed = states.parse_body(state_body)
    if isinstance(parsed, EncryptedState):
        raise BadRequestError("an encrypted state cannot be committed row by row")
    now = clock()
    with db.transaction() as conn:
        addresses = sorted({r.address for r in parsed.instances} | set(slice_addresses))
        before = _read_before(conn, principal, run_id, addresses)
        checked = _check(before, before.reserved, parsed, slice_addresses, prune_outputs)
        locked = read_locked(conn, principal, run_id, before)
        if locked.reserved != checked.reserved:  # the run's reservations changed meanwhile: check against these
            checked = _check(before, locked.reserved, parsed, slice_addresses, prune_outputs)
        _refuse(conn, principal, run_id, holder, now, before, locked, checked.verdict)
        return _write(conn, principal, run_id, now, parsed, before, locked, checked, prune_outputs)


def dry_commit_run(
    db: Database, principal: Principal, run_id: str, *, holder: str, addresses: Sequence[str],
    outputs: Sequence[str], clock: runs.Clock = runs.utcnow,
) -> DryCommit:
    """Check a run's planned changes (the instance addresses and root output names its plan writes) by
    the very rules ``commit_run`` applies to a post-apply state — the run is live and the caller's, the
    changes lie inside its write reservations, nothing it reserved moved since its base serial — before
    Terraform applies anything. Raises what ``commit_run`` raises; changes no row either way (but for
    the reclaim of a lapsed lease, which every call on a run performs)."""
    planned = rules.check_addresses(addresses, "addresses")
    names = rules.check_output_names(outputs)
    now = clock()
    with db.transaction() as conn:
        before = _read_before(conn, principal, run_id, [])
        locked = read_locked(conn, principal, run_id, before)
        verdict = _judge(before, locked.reserved, planned, names)
        base_serial = _refuse(conn, principal, run_id, holder, now, before, locked, verdict, dry=True)
        conn.rollback()  # nothing was written; release the row locks at once
    return DryCommit(run_id, base_serial, locked.head_serial, verdict.written, tuple(sorted(set(names))))


def _refuse(
    conn: psycopg.Connection, principal: Principal, run_id: str, holder: str, now: datetime, before: _Before,
    locked: Locked, verdict: _Verdict, *, dry: bool = False,
) -> int:
    """Every refusal of a commit, in order (shared by the commit and its dry run, which ``dry`` words as
    the plan's); returns the base serial."""
    runs.check_live(conn, principal, run_id, holder, now, status=locked.status, actor=locked.actor,
                    state_id=before.state_id, state_name=locked.state_name, credential=locked.credential,
                    expiries=locked.expiries)
    if locked.lock_id is not None:
        raise StateLockedError(f"state {locked.state_name!r} is locked by Terraform; the commit must wait",
                               lock_info=bytes(locked.lock_info or b"{}"))
    base_serial = before.base_serial
    if base_serial is None:
        raise BadRequestError(f"apply run {run_id} has no base serial: open runs that commit with the serial "
                              "their plan was made against (0 for a state with no versions yet)")
    check_scopes(principal, locked.state_name, verdict)
    if verdict.outside:
        outside = verdict.outside
        shown = ", ".join(outside[:20]) + (f" and {len(outside) - 20} more" if len(outside) > 20 else "")
        raise WriteOutsideReservationError(
            f"{'the plan changes' if dry else 'the apply changed'} addresses outside its write reservations: "
            f"{shown}; nothing was {'applied' if dry else 'committed'} (reserve root outputs with 'output.NAME' or "
            "'output.*')",
            addresses=outside[:200],
        )
    _check_stale(before, locked, verdict, base_serial)
    return base_serial


def _read_before(conn: psycopg.Connection, principal: Principal, run_id: str, addresses: list[str]) -> _Before:
    """Two round trips, no lock: the run, then its reservations and the trunk's rows of ``addresses`` and
    outputs at its base serial."""
    found = conn.execute(_RUN, (run_id, principal.tenant_id, principal.scope)).fetchone()
    if found is None:
        raise RunNotFoundError(f"no apply run {run_id!r}: list runs with kl runs")
    state_id, base_serial, seen_serial = found
    with conn.pipeline():
        globs_read = conn.execute(_RUN_GLOBS, (run_id,))
        if base_serial is not None:
            rows_read = conn.execute(_BASE_ROWS, (state_id, addresses, base_serial, base_serial))
            outputs_read = conn.cursor(row_factory=class_row(OutputRow)).execute(
                _BASE_OUTPUTS, (state_id, base_serial))
            changed_read = conn.execute(reservation_rows.CHANGED_SINCE, (state_id, base_serial, base_serial))
    reserved = tuple(Reservation.of(g, m) for g, m in globs_read.fetchall())
    if base_serial is None:
        return _Before(state_id, None, seen_serial, reserved, {}, [], [])
    return _Before(
        state_id=state_id, base_serial=base_serial, seen_serial=seen_serial, reserved=reserved,
        base={(a, d): h for a, d, h in rows_read.fetchall()}, base_outputs=outputs_read.fetchall(),
        changed=reservation_rows.changes_after(changed_read.fetchall(), base_serial))


def read_locked(conn: psycopg.Connection, principal: Principal, run_id: str, before: _Before) -> Locked:
    """Take the state's row lock, then the run's, and read what may have changed before they were
    granted: one round trip."""
    state_id = before.state_id
    after = max(before.seen_serial, before.base_serial or 0)
    with conn.pipeline():
        name_read = conn.execute(_LOCK_STATE, (state_id,))
        run_read = conn.execute(_LOCK_RUN, (run_id, principal.tenant_id))
        globs_read = conn.execute(_LOCKED_GLOBS, (run_id,))
        head_read = conn.execute(_STATE_HEAD, (state_id,))
        outputs_read = conn.cursor(row_factory=class_row(OutputRow)).execute(_HEAD_OUTPUTS, (state_id,))
        changed_read = conn.execute(reservation_rows.CHANGED_SINCE, (state_id, after, after))
    (state_name,) = name_read.fetchone() or ("",)
    run = run_read.fetchone()
    if run is None:  # deleted with its state since the first read
        raise RunNotFoundError(f"no apply run {run_id!r}: list runs with kl runs")
    status, actor, _, credential = run
    globs = globs_read.fetchall()
    lock_id, lock_info, head_serial, lineage, head_version_id, tf_version, locked_at = head_read.fetchone() or (
        None, None, 0, None, None, None, None)
    return Locked(
        state_name=state_name, status=status, actor=actor, credential=credential,
        reserved=tuple(Reservation.of(g, m) for g, m, _ in globs), expiries=[e for _, _, e in globs],
        lock_id=lock_id, lock_info=lock_info, head_serial=head_serial, lineage=lineage,
        head_version_id=head_version_id, terraform_version=tf_version, head_outputs=outputs_read.fetchall(),
        changed=reservation_rows.changes_after(changed_read.fetchall(), before.base_serial or 0), locked_at=locked_at,
    )


def _check(
    before: _Before, reserved: tuple[Reservation, ...], parsed: ParsedState, slice_addresses: list[str],
    prune_outputs: rules.Prune,
) -> _Checked:
    """The delta against the base rows, judged by ``_judge``."""
    write_globs = rules.parse_globs(r.glob for r in reserved if r.mode is Mode.WRITE)
    delta = rules.commit_delta(before.base, parsed.instances, slice_addresses,
                               skip=rules.unreserved_read(write_globs))
    changed_outputs = rules.changed_outputs(before.base_outputs, parsed.outputs, prune=prune_outputs)
    return _Checked(reserved, delta, _judge(before, reserved, delta.addresses, changed_outputs))


def _judge(
    before: _Before, reserved: tuple[Reservation, ...], addresses: Sequence[str], changed_outputs: Sequence[str],
) -> _Verdict:
    """The addresses and outputs a change writes outside the write globs (data sources no write glob covers
    are reads, as in the delta), and which of the changes read before the lock touch a reserved address.
    The one write-set rule of the commit and of its dry run."""
    write_globs = rules.parse_globs(r.glob for r in reserved if r.mode is Mode.WRITE)
    skip = rules.unreserved_read(write_globs)
    written = tuple(sorted({a for a in addresses if not skip(a)}))
    outside = rules.outside(written, write_globs) + [
        f"output.{n}" for n in rules.outputs_outside(changed_outputs, write_globs)]
    return _Verdict(written, outside, rules.stale(before.changed, rules.parse_globs(r.glob for r in reserved)),
                    tuple(changed_outputs))


def check_scopes(principal: Principal, state_name: str, verdict: _Verdict) -> None:
    """AddressScopeError when the token's address scopes lack a write scope for an address or root output
    the change writes, whatever its reservations cover (a token without scopes writes anywhere). The
    commit and its dry run both run it."""
    scopes.check_written(principal.scopes, state_name, verdict.written, verdict.outputs_written)


def _check_stale(before: _Before, locked: Locked, verdict: _Verdict, base_serial: int) -> None:
    """StalePlanError when a reserved address or root output changed after the base serial: the changes
    read before the lock were checked already; the few read under it are checked here."""
    globs = rules.parse_globs(r.glob for r in locked.reserved)
    found = sorted(set(verdict.stale) | set(rules.stale(locked.changed, globs)))
    moved: list[str] = []
    if locked.head_version_id is not None and locked.head_serial > base_serial and any(
            g.is_output or g.is_everything for g in globs):
        moved = rules.stale_outputs(before.base_outputs, locked.head_outputs, globs)
    reservation_rows.raise_if_stale(base_serial, found, moved)


def _write(
    conn: psycopg.Connection, principal: Principal, run_id: str, now: datetime, parsed: ParsedState,
    before: _Before, locked: Locked, checked: _Checked, prune_outputs: rules.Prune,
) -> CommitResult:
    """The writes and COMMIT, in one pipeline: one round trip."""
    delta, state_id, state_name = checked.delta, before.state_id, locked.state_name
    outputs = rules.merge_outputs(locked.head_outputs, before.base_outputs, parsed.outputs, prune=prune_outputs)
    previous, following = {o.name: o for o in locked.head_outputs}, {o.name: o for o in outputs}
    outputs_changed = tuple(sorted(n for n in previous.keys() | following.keys()
                                   if not rules.same_output(previous.get(n), following.get(n))))
    counters = {"created": delta.created, "updated": delta.updated, "deleted": len(delta.deletes)}
    if delta.is_empty and not outputs_changed:
        with conn.pipeline():
            conn.execute(_FINISH, (None, now, json.dumps(counters), run_id))
            reservation_rows.drop_run_reservations(conn, run_id)
            events.record(conn, principal, "run_commit", state_id=state_id, state_name=state_name, run_id=run_id,
                          holder=locked.actor, **counters, serial_written=False)
            conn.commit()
        return CommitResult(run_id, None, 0, 0, 0, (), ())

    serial = locked.head_serial + 1
    closing = [(a, d) for a, d in delta.deletes] + [(r.address, r.deposed) for r in delta.upserts]
    with conn.pipeline():
        if closing:
            conn.execute(_CLOSE_KEYS, (serial, [a for a, _ in closing], [d for _, d in closing], state_id))
        if delta.upserts:
            resources.insert_rows_at(conn, tenant_id=principal.tenant_id, state_id=state_id, serial=serial,
                                     rows=delta.upserts)
        conn.execute(_INSERT_VERSION, (
            principal.tenant_id, state_id, serial, locked.lineage or parsed.lineage,
            parsed.terraform_version or locked.terraform_version or "", locked.actor, run_id, principal.token_name,
            *resources.output_columns(outputs), serial, state_id))
        conn.execute(_FINISH, (serial, now, json.dumps(counters), run_id))
        conn.execute(_KEEP_GLOBS, (json.dumps(_written_globs(locked.reserved)), run_id))
        reservation_rows.drop_run_reservations(conn, run_id)
        events.record(conn, principal, "run_commit", state_id=state_id, state_name=state_name, run_id=run_id,
                      serial=serial, holder=locked.actor, **counters, addresses=list(delta.addresses)[:200])
        conn.commit()  # in the pipeline: the writes and COMMIT are one round trip
    if closing:
        history.record_changed_names_after_commit(conn, state_id=state_id, serial=serial)
    return CommitResult(run_id, serial, delta.created, delta.updated, len(delta.deletes), delta.addresses,
                        outputs_changed)


_KEPT_GLOBS = 200


def _written_globs(reserved: tuple[Reservation, ...]) -> dict[str, Any]:
    """The write globs a committed run held, kept on the run (the first 200, and how many more) so a plan
    from a checkout that lacks the run's commit can say which of its changes it would undo."""
    write = sorted(r.glob for r in reserved if r.mode is Mode.WRITE)
    return {"write_globs": write[:_KEPT_GLOBS], "write_globs_more": max(len(write) - _KEPT_GLOBS, 0)}
