"""Apply runs and their reservations: open (acquire all-or-nothing, optionally waiting in a fair
queue), acquire more, renew, release, close, abort, and the listings.

Every operation is one short transaction serialised on the state row. The server never sleeps on
a request's behalf: a request that asks to wait and meets a conflict gets a queue ``Ticket`` at
once (a row of ``reservation_waiters``), and the client asks again with it. Each ask is one
all-or-nothing attempt; a ticket not presented again within ``ticket_window`` loses its place and
can never be granted (nothing is granted without the holder asking).

A run is bound to the credential that opened it (``Principal.credential``): every later call but an
operator's abort must come from that credential, and the holder name must match too.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import class_row

from analyzer.globs import parse_glob
from app.domain import scopes
from app.domain.locking import stored_lock
from app.domain.principal import Principal
from app.domain.reservations import Mode, RunStatus, Wanted, terraform_lock_hold
from app.errors import (
    BadRequestError,
    LeaseExpiredError,
    NotRunHolderError,
    RunClosedError,
    RunNotFoundError,
)
from app.store import events, reservation_rows, states
from app.store.acquire import (
    CONFLICT_SCAN_LIMIT,
    POLL_SECONDS,
    WAITER_STALE,
    Attempt,
    Clock,
    Ticket,
    WaitPolicy,
    acquire,
    cancel_ticket,
    insert_reservations,
)
from app.store.db import Database

__all__ = ["CONFLICT_SCAN_LIMIT", "POLL_SECONDS", "WAITER_STALE", "Clock", "Run", "ReservationView", "Ticket",
           "WaitPolicy", "abort", "acquire_more", "cancel_ticket", "close_run", "get_run", "list_reservations",
           "list_runs", "open_run", "release", "renew", "utcnow"]

_INSERT_RUN = """
INSERT INTO apply_runs (id, tenant_id, state_id, status, actor, base_serial, lease_seconds, created_at,
                        started_at, info, credential)
VALUES (%s, %s, %s, 'reserved', %s, %s, %s, %s, %s, %s, %s)
"""
_RUN_FIELDS = """
r.id, s.name AS state, r.status, r.actor, r.base_serial, r.committed_serial, r.lease_seconds,
r.created_at, r.started_at, r.finished_at, r.counters, r.error_summary, r.info, r.state_id,
(SELECT min(x.expires_at) FROM resource_reservations x WHERE x.run_id = r.id) AS expires_at
"""
_GET_RUN = f"""
SELECT {_RUN_FIELDS} FROM apply_runs r JOIN states s ON s.id = r.state_id
WHERE r.id = %s AND r.tenant_id = %s AND s.scope = %s
"""
_LIST_RUNS = f"""
SELECT {_RUN_FIELDS} FROM apply_runs r JOIN states s ON s.id = r.state_id
WHERE r.tenant_id = %(tenant)s AND s.scope = %(scope)s AND (%(state)s::text IS NULL OR s.name = %(state)s)
  AND (%(status)s::text IS NULL OR r.status = %(status)s)
ORDER BY r.created_at DESC, r.id LIMIT %(limit)s
"""
_LIST_RESERVATIONS = """
SELECT s.name AS state, r.glob, r.mode, r.holder, r.run_id, r.acquired_at, r.expires_at
FROM resource_reservations r JOIN states s ON s.id = r.state_id
WHERE r.tenant_id = %(tenant)s AND s.scope = %(scope)s AND (%(state)s::text IS NULL OR s.name = %(state)s)
  AND r.expires_at > %(now)s
ORDER BY s.name, r.acquired_at, r.id LIMIT %(limit)s
"""
_LOCKS = """
SELECT s.name AS state, s.lock_info, s.locked_at FROM states s
WHERE s.tenant_id = %(tenant)s AND s.scope = %(scope)s AND (%(state)s::text IS NULL OR s.name = %(state)s)
  AND s.lock_id IS NOT NULL
"""
_FIND_RUN = """
SELECT r.state_id, r.status, r.actor, r.credential FROM apply_runs r JOIN states s ON s.id = r.state_id
WHERE r.id = %s AND r.tenant_id = %s AND s.scope = %s
"""
_LOCK_RUN = """
SELECT status, actor, state_id, credential FROM apply_runs WHERE id = %s AND tenant_id = %s FOR UPDATE
"""
_RUN_GLOB_COUNT = "SELECT count(*) FROM resource_reservations WHERE run_id = %s"
_STATE_NAME_FOR_UPDATE = "SELECT name FROM states WHERE id = %s FOR UPDATE"
_RUN_RESERVATIONS = "SELECT glob, mode, expires_at FROM resource_reservations WHERE run_id = %s"
_RENEW = "UPDATE resource_reservations SET expires_at = %s WHERE run_id = %s"
_RELEASE_SOME = "DELETE FROM resource_reservations WHERE run_id = %s AND glob = ANY(%s)"
_SET_STATUS = """
UPDATE apply_runs SET status = %s, finished_at = %s, error_summary = coalesce(%s, error_summary),
       counters = counters || %s
WHERE id = %s
"""
_LEASE_OF = "SELECT lease_seconds FROM apply_runs WHERE id = %s"
_MARK_RUNNING = "UPDATE apply_runs SET status = 'running' WHERE id = %s"
@dataclass(frozen=True, slots=True)
class Run:
    id: str
    state: str
    status: str
    actor: str
    base_serial: int | None
    committed_serial: int | None
    lease_seconds: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    counters: dict[str, Any]
    error_summary: str | None
    info: dict[str, Any]
    state_id: int
    expires_at: datetime | None
    # The trunk's head serial when the reservations were granted (read under the state's row lock, in the
    # granting transaction) and the lineage of that serial's version: known only to the answer of the call
    # that opened the run; None elsewhere.
    granted_at_serial: int | None = None
    granted_at_lineage: str | None = None


@dataclass(frozen=True, slots=True)
class ReservationView:
    state: str
    glob: str
    mode: str
    holder: str
    run_id: str | None
    acquired_at: datetime
    expires_at: datetime | None


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_run_id() -> str:
    return "ar_" + secrets.token_hex(8)


def open_run(
    db: Database, principal: Principal, state_name: str, *, actor: str, wanted: tuple[Wanted, ...],
    lease: timedelta, wait: timedelta | None = None, base_serial: int | None = None,
    info: dict[str, Any] | None = None, clock: Clock = utcnow, run_id: str | None = None,
    policy: WaitPolicy | None = None,
) -> Run | Ticket:
    """Open an apply run holding all of ``wanted`` (all-or-nothing). With a wait (``policy`` or
    ``wait``), a request that meets a conflict is queued and gets a Ticket to ask again with. Raises
    ReservationConflictError (nothing is created then) or TicketExpiredError."""
    policy = policy or WaitPolicy(wait=wait)
    if not actor:
        raise BadRequestError("actor is required: say who is applying (e.g. --actor alice)")
    run_id = run_id or new_run_id()
    attempt = Attempt(state_name=state_name, holder=actor, wanted=wanted, lease=lease)
    details = dict(info or {})
    granted_at: list[int] = []

    def grant(conn: psycopg.Connection, row: states.StateRow) -> None:
        now = clock()
        # ``row`` was read under the state's row lock, which every write of a new serial (a commit, a POST)
        # takes too and holds until it commits: no serial can land between this read and our COMMIT.
        granted_at.append(row.current_serial or 0)
        if base_serial is not None:
            if base_serial > (row.current_serial or 0):
                raise BadRequestError(f"base_serial {base_serial} is ahead of the trunk (serial {row.current_serial})")
            # A plan that is already stale would only fail at commit, after Terraform ran: refuse now.
            reservation_rows.check_stale(conn, row.id, base_serial, [w.text for w in wanted])
        conn.execute(_INSERT_RUN, (run_id, principal.tenant_id, row.id, actor, base_serial,
                                   int(lease.total_seconds()), now, now, json.dumps(details), principal.credential))
        insert_reservations(conn, principal, row, run_id, attempt, now, details)
        events.record(conn, principal, "run_open", state_id=row.id, state_name=state_name, run_id=run_id,
                      holder=actor, base_serial=base_serial)

    ticket = acquire(db, principal, attempt, policy=policy, clock=clock, grant=grant)
    if ticket is not None:
        return ticket
    serial = granted_at[-1]
    with db.transaction() as conn:
        run = get_run_in(conn, principal, run_id)
        # The version at a committed serial never changes: read after the lock, it is the granted head's.
        version = states.version_at(conn, run.state_id, serial) if serial else None
    return replace(run, granted_at_serial=serial, granted_at_lineage=version.lineage if version else None)


def _lock_run(conn: psycopg.Connection, principal: Principal, run_id: str) -> tuple[str, str, int, str, str]:
    """Lock a run's state row, then the run (the order every writer uses, so no deadlocks).
    Returns (status, actor, state id, state name, credential)."""
    found = conn.execute(_FIND_RUN, (run_id, principal.tenant_id, principal.scope)).fetchone()
    if found is None:
        raise RunNotFoundError(f"no apply run {run_id!r}: list runs with kl runs")
    (state_name,) = conn.execute(_STATE_NAME_FOR_UPDATE, (found[0],)).fetchone() or ("",)
    status, actor, state_id, credential = conn.execute(_LOCK_RUN, (run_id, principal.tenant_id)).fetchone() or found
    return status, actor, state_id, state_name, credential


def locked_live_run(
    conn: psycopg.Connection, principal: Principal, run_id: str, holder: str | None, now: datetime, *,
    may_start: bool = False,
) -> tuple[str, int]:
    """Lock a live run the caller holds; returns (state name, state id). A lapsed lease fails
    loudly: the holder must stop, because someone else may now hold its addresses. ``may_start``: the
    caller is about to start (or widen) work, which an aborting run refuses."""
    status, actor, state_id, state_name, credential = _lock_run(conn, principal, run_id)
    expiries = [e for _, _, e in conn.execute(_RUN_RESERVATIONS, (run_id,)).fetchall()]
    check_live(conn, principal, run_id, holder, now, status=status, actor=actor, state_id=state_id,
               state_name=state_name, credential=credential, expiries=expiries)
    if may_start and status == RunStatus.ABORTING:
        raise RunClosedError(f"apply run {run_id} is being aborted: it may not start applying or take more "
                             "reservations; stop, and close it", status=status)
    return state_name, state_id


def check_live(
    conn: psycopg.Connection, principal: Principal, run_id: str, holder: str | None, now: datetime, *,
    status: str, actor: str, state_id: int, state_name: str, credential: str, expiries: list[datetime],
) -> None:
    """The checks of ``locked_live_run`` on a run already read under its state's row lock (``expiries``:
    its reservations' ends). A lapsed lease is reclaimed and committed before the refusal."""
    if credential != principal.credential:
        raise NotRunHolderError(
            f"apply run {run_id} was opened with another credential: only the credential that opened a run "
            "may commit, renew, release or close it (an operator can end it with kl abort)"
        )
    if holder is not None and holder != actor:
        raise NotRunHolderError(f"apply run {run_id} is held by {actor}, not {holder}")
    lapsed = status == RunStatus.EXPIRED or any(e <= now for e in expiries)
    if lapsed:
        if RunStatus(status).is_live:
            reservation_rows.reclaim(conn, principal, state_id=state_id, state_name=state_name, run_ids=[run_id],
                                     now=now)
            conn.commit()  # the reclaim stands although the caller is refused
        raise LeaseExpiredError(
            f"the lease of apply run {run_id} expired; its reservations were released and someone else may "
            "now hold those addresses: stop, and re-plan",
        )
    if not RunStatus(status).is_live:
        raise RunClosedError(f"apply run {run_id} is {status} and can no longer commit: if it changed "
                             f"infrastructure, kl recover {run_id} commits its kept state through a new run",
                             status=status)


def acquire_more(
    db: Database, principal: Principal, run_id: str, *, holder: str, wanted: tuple[Wanted, ...],
    wait: timedelta | None = None, clock: Clock = utcnow, policy: WaitPolicy | None = None,
    max_globs: int | None = None,
) -> Run | Ticket:
    """Add reservations to a live run, all-or-nothing (its own reservations never conflict). A run
    holds at most ``max_globs`` globs in all. Waits like ``open_run``."""
    policy = policy or WaitPolicy(wait=wait)
    run = get_run(db, principal, run_id)
    _refuse_manual_hold(run.info, run_id, "widened")
    attempt = Attempt(state_name=run.state, holder=holder, wanted=wanted, lease=timedelta(seconds=run.lease_seconds),
                      run_id=run_id)

    def check_cap(conn: psycopg.Connection) -> None:
        if max_globs is None:
            return
        (held,) = conn.execute(_RUN_GLOB_COUNT, (run_id,)).fetchone() or (0,)
        if held + len(wanted) > max_globs:
            raise BadRequestError(
                f"apply run {run_id} would hold {held + len(wanted)} reservation globs; a run holds at most "
                f"{max_globs}: reserve module or resource prefixes instead of many instances"
            )

    def grant(conn: psycopg.Connection, row: states.StateRow) -> None:
        now = clock()
        locked_live_run(conn, principal, run_id, holder, now, may_start=True)
        check_cap(conn)
        insert_reservations(conn, principal, row, run_id, attempt, now, run.info)

    with db.transaction() as conn:
        locked_live_run(conn, principal, run_id, holder, clock(), may_start=True)
        check_cap(conn)
    ticket = acquire(db, principal, attempt, policy=policy, clock=clock, grant=grant, exclude_run=run_id)
    return ticket if ticket is not None else get_run(db, principal, run_id)


def renew(db: Database, principal: Principal, run_id: str, *, holder: str, clock: Clock = utcnow) -> Run:
    """Extend every reservation of the run by its lease. Fails loudly once the lease has lapsed."""
    now = clock()
    with db.transaction() as conn:
        state_name, state_id = locked_live_run(conn, principal, run_id, holder, now)
        _refuse_manual_hold(get_run_in(conn, principal, run_id).info, run_id, "renewed")
        (lease_seconds,) = conn.execute(_LEASE_OF, (run_id,)).fetchone() or (0,)
        expires = now + timedelta(seconds=lease_seconds)
        conn.execute(_RENEW, (expires, run_id))
        events.record(conn, principal, "reservation_renew", state_id=state_id, state_name=state_name,
                      run_id=run_id, holder=holder, expires_at=expires.isoformat())
    return get_run(db, principal, run_id)


def _refuse_manual_hold(info: dict[str, Any], run_id: str, what: str) -> None:
    """A manual hold keeps the globs and expiry it was taken with (its bounds were checked then)."""
    if "manual_hold" in info:
        raise BadRequestError(f"{run_id} is a manual hold: it is not {what}; release it and take a new one "
                              "(kl release, kl hold)")


def release(
    db: Database, principal: Principal, run_id: str, *, holder: str, globs: Sequence[str] | None = None,
    clock: Clock = utcnow,
) -> Run:
    """Drop some (or all) of a live run's reservations; the run stays open."""
    with db.transaction() as conn:
        state_name, state_id = locked_live_run(conn, principal, run_id, holder, clock())
        if globs is None:
            reservation_rows.drop_run_reservations(conn, run_id)
        else:
            conn.execute(_RELEASE_SOME, (run_id, list(globs)))
        events.record(conn, principal, "reservation_release", state_id=state_id, state_name=state_name,
                      run_id=run_id, holder=holder, globs=list(globs) if globs is not None else "all")
    return get_run(db, principal, run_id)


def mark_running(db: Database, principal: Principal, run_id: str, *, holder: str, clock: Clock = utcnow) -> Run:
    """Record that the run's Terraform starts changing infrastructure. An aborting run may not start."""
    with db.transaction() as conn:
        state_name, state_id = locked_live_run(conn, principal, run_id, holder, clock(), may_start=True)
        conn.execute(_MARK_RUNNING, (run_id,))
        events.record(conn, principal, "run_running", state_id=state_id, state_name=state_name, run_id=run_id)
    return get_run(db, principal, run_id)


def close_run(
    db: Database, principal: Principal, run_id: str, *, holder: str, status: RunStatus,
    error_summary: str | None = None, counters: dict[str, Any] | None = None, clock: Clock = utcnow,
) -> Run:
    """End a run as failed (or aborted by its holder), releasing its reservations."""
    if status not in (RunStatus.FAILED, RunStatus.ABORTED):
        raise BadRequestError("a run is closed as failed or aborted; committed runs close through a commit")
    now = clock()
    with db.transaction() as conn:
        state_name, state_id = locked_live_run(conn, principal, run_id, holder, now)
        reservation_rows.drop_run_reservations(conn, run_id)
        conn.execute(_SET_STATUS, (status.value, now, (error_summary or "")[:4000] or None,
                                   json.dumps(counters or {}), run_id))
        events.record(conn, principal, f"run_{status.value}", state_id=state_id, state_name=state_name,
                      run_id=run_id, holder=holder)
    return get_run(db, principal, run_id)


def abort(
    db: Database, principal: Principal, run_id: str, *, reason: str = "", force: bool = False, clock: Clock = utcnow,
) -> Run:
    """Operator escape hatch: end any live run and free its addresses, whoever holds it. A run whose
    Terraform is applying (``running``) only becomes ``aborting``: it keeps its reservations until its
    client has stopped Terraform and closed it, or its lease lapses. ``force`` frees them at once (for a
    run whose Terraform is known to have stopped). A token with address scopes ends only a run whose every
    glob its write scopes cover (AddressScopeError otherwise)."""
    now = clock()
    with db.transaction() as conn:
        status, actor, state_id, state_name, _ = _lock_run(conn, principal, run_id)
        if not RunStatus(status).is_live:
            raise RunClosedError(f"apply run {run_id} is already {status}", status=status)
        if principal.scopes is not None:  # a scoped token ends only runs whose globs it may write
            held = conn.execute(_RUN_RESERVATIONS, (run_id,)).fetchall()
            scopes.check_requested(principal.scopes, state_name, ((parse_glob(g), Mode.WRITE) for g, _, _ in held))
        summary = f"aborted by {principal.actor}" + (f": {reason}" if reason else "")
        if status in (RunStatus.RUNNING, RunStatus.ABORTING) and not force:
            conn.execute(_SET_STATUS, (RunStatus.ABORTING.value, None, summary, "{}", run_id))
            events.record(conn, principal, "run_aborting", state_id=state_id, state_name=state_name, run_id=run_id,
                          holder=actor, reason=reason)
        else:
            reservation_rows.drop_run_reservations(conn, run_id)
            conn.execute(_SET_STATUS, ("aborted", now, summary, "{}", run_id))
            events.record(conn, principal, "run_abort", state_id=state_id, state_name=state_name, run_id=run_id,
                          holder=actor, reason=reason, forced=force)
    return get_run(db, principal, run_id)


def get_run(db: Database, principal: Principal, run_id: str) -> Run:
    with db.transaction() as conn:
        return get_run_in(conn, principal, run_id)


def get_run_in(conn: psycopg.Connection, principal: Principal, run_id: str) -> Run:
    with conn.cursor(row_factory=class_row(Run)) as cur:
        run = cur.execute(_GET_RUN, (run_id, principal.tenant_id, principal.scope)).fetchone()
    if run is None:
        raise RunNotFoundError(f"no apply run {run_id!r}")
    return run


def list_runs(
    db: Database, principal: Principal, *, state: str | None = None, status: str | None = None, limit: int = 100,
) -> list[Run]:
    params = {"tenant": principal.tenant_id, "scope": principal.scope, "state": state, "status": status,
              "limit": limit}
    with db.transaction() as conn, conn.cursor(row_factory=class_row(Run)) as cur:
        return cur.execute(_LIST_RUNS, params).fetchall()


_RUN_RESERVATION_VIEWS = """
SELECT s.name AS state, r.glob, r.mode, r.holder, r.run_id, r.acquired_at, r.expires_at
FROM resource_reservations r JOIN states s ON s.id = r.state_id
WHERE r.run_id = %s AND r.tenant_id = %s AND s.scope = %s ORDER BY r.id
"""


def run_reservations(db: Database, principal: Principal, run_id: str) -> list[ReservationView]:
    with db.transaction() as conn, conn.cursor(row_factory=class_row(ReservationView)) as cur:
        found = cur.execute(_RUN_RESERVATION_VIEWS, (run_id, principal.tenant_id, principal.scope)).fetchall()
    return _visible(principal, found)


def _visible(principal: Principal, found: list[ReservationView]) -> list[ReservationView]:
    """A scoped token sees the reservations whose globs meet its read scopes: the ones that can block it."""
    if principal.scopes is None:
        return found
    return [r for r in found if scopes.can_see_reservation(principal.scopes, r.glob)]


def list_reservations(
    db: Database, principal: Principal, *, state: str | None = None, limit: int = 1000, clock: Clock = utcnow,
) -> list[ReservationView]:
    """Live reservations, with Terraform's state locks shown as write reservations on ``*``."""
    params = {"tenant": principal.tenant_id, "scope": principal.scope, "state": state, "now": clock(),
              "limit": limit}
    with db.transaction() as conn:
        with conn.cursor(row_factory=class_row(ReservationView)) as cur:
            found = cur.execute(_LIST_RESERVATIONS, params).fetchall()
        locks = conn.execute(_LOCKS, params).fetchall()
    for name, info, locked_at in locks:
        held = terraform_lock_hold(stored_lock("", bytes(info or b"{}")), locked_at)
        found.append(ReservationView(state=name, glob=held.glob, mode=held.mode.value, holder=held.holder,
                                     run_id=None, acquired_at=held.acquired_at, expires_at=held.expires_at))
    return sorted(_visible(principal, found), key=lambda r: (r.state, r.acquired_at))
