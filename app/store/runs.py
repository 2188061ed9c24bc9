"""Apply runs and their reservations: open (acquire all-or-nothing, optionally waiting in a fair
queue), acquire more, renew, release, close, abort, and the listings.

Every operation is one transaction serialised on the state row. Waiting is a loop of short
transactions: each attempt either grants everything or nothing, and between attempts the
request keeps its place in ``reservation_waiters``.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import class_row

from analyzer.globs import parse_glob
from app.domain.principal import Principal
from app.domain.reservations import (
    Conflict,
    Held,
    Mode,
    RunStatus,
    Wanted,
    blocks,
    describe,
    find_conflicts,
    glob_root,
)
from app.errors import (
    BadRequestError,
    LeaseExpiredError,
    NotRunHolderError,
    ReservationConflictError,
    RunClosedError,
    RunNotFoundError,
)
from app.store import events, holds, states
from app.store.db import Database

Clock = Callable[[], datetime]
POLL_SECONDS = 0.2
# A waiter that has not polled for this long has gone away and no longer holds its place.
WAITER_STALE = timedelta(seconds=10)

_INSERT_RUN = """
INSERT INTO apply_runs (id, tenant_id, state_id, status, actor, base_serial, lease_seconds, created_at,
                        started_at, info)
VALUES (%s, %s, %s, 'reserved', %s, %s, %s, %s, %s, %s)
"""
_INSERT_RESERVATION = """
INSERT INTO resource_reservations (tenant_id, state_id, run_id, glob, root, mode, holder, info,
                                   acquired_at, expires_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (run_id, glob, mode) DO UPDATE SET expires_at = EXCLUDED.expires_at
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
SELECT r.state_id, r.status, r.actor FROM apply_runs r JOIN states s ON s.id = r.state_id
WHERE r.id = %s AND r.tenant_id = %s AND s.scope = %s
"""
_LOCK_RUN = "SELECT status, actor, state_id FROM apply_runs WHERE id = %s AND tenant_id = %s FOR UPDATE"
_STATE_NAME_FOR_UPDATE = "SELECT name FROM states WHERE id = %s FOR UPDATE"
_RUN_RESERVATIONS = "SELECT glob, mode, expires_at FROM resource_reservations WHERE run_id = %s"
_RENEW = "UPDATE resource_reservations SET expires_at = %s WHERE run_id = %s"
_RELEASE_ALL = "DELETE FROM resource_reservations WHERE run_id = %s"
_RELEASE_SOME = "DELETE FROM resource_reservations WHERE run_id = %s AND glob = ANY(%s)"
_SET_STATUS = """
UPDATE apply_runs SET status = %s, finished_at = %s, error_summary = coalesce(%s, error_summary),
       counters = counters || %s
WHERE id = %s
"""
_LEASE_OF = "SELECT lease_seconds FROM apply_runs WHERE id = %s"
_MARK_RUNNING = "UPDATE apply_runs SET status = 'running' WHERE id = %s"
_WAITER_INSERT = """
INSERT INTO reservation_waiters (state_id, holder, wanted, enqueued_at, seen_at) VALUES (%s, %s, %s, %s, %s)
RETURNING id
"""
_WAITER_TOUCH = "UPDATE reservation_waiters SET seen_at = %s WHERE id = %s"
_WAITER_DELETE = "DELETE FROM reservation_waiters WHERE id = %s"
_EARLIER_WAITERS = """
SELECT wanted FROM reservation_waiters WHERE state_id = %s AND id < %s AND seen_at > %s ORDER BY id
"""


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


def _conflict_payload(c: Conflict, now: datetime) -> dict[str, object]:
    h = c.held
    return {
        "wanted": c.wanted.text, "wanted_mode": c.wanted.mode.value, "glob": h.glob, "mode": h.mode.value,
        "holder": h.holder, "run_id": h.run_id or None, "acquired_at": h.acquired_at.isoformat(),
        "expires_at": h.expires_at.isoformat() if h.expires_at else None,
        "expires_in": None if h.expires_at is None else max(int((h.expires_at - now).total_seconds()), 0),
    }


def _wanted_json(wanted: Sequence[Wanted]) -> str:
    return json.dumps([[w.text, w.mode.value] for w in wanted])


def _wanted_from_json(doc: list[list[str]]) -> list[Wanted]:
    return [Wanted(glob=parse_glob(g), mode=Mode(m)) for g, m in doc]


@dataclass
class _Attempt:
    """The state of one acquisition across its attempts."""

    state_name: str
    holder: str
    wanted: tuple[Wanted, ...]
    lease: timedelta
    waiter_id: int | None = None


def _held_by_terraform_lock(row: states.StateRow) -> list[Held]:
    held = row.held_lock
    if held is None:
        return []
    try:
        created = datetime.fromisoformat(json.loads(held.raw).get("Created", "").replace("Z", "+00:00")[:32])
    except (ValueError, AttributeError):
        created = utcnow()
    if created.tzinfo is None:
        created = created.replace(tzinfo=UTC)
    return [Held(glob="*", mode=Mode.WRITE, holder=held.who or "terraform", run_id="", acquired_at=created,
                 expires_at=None)]


def _try_grant(
    conn: psycopg.Connection, principal: Principal, attempt: _Attempt, now: datetime, *, waiting: bool,
    grant: Callable[[psycopg.Connection, states.StateRow], None], exclude_run: str | None = None,
) -> tuple[list[Conflict], bool]:
    """One all-or-nothing attempt under the state row lock. Returns (conflicts, blocked_by_queue);
    both empty means granted (``grant`` ran in this transaction)."""
    row = states.locked_row(conn, principal, attempt.state_name, create=True)
    assert row is not None  # create=True
    roots = {glob_root(w.text) for w in attempt.wanted}
    candidates = [h for h in holds.candidates(conn, row.id, roots) if h.run_id != exclude_run]
    met = find_conflicts(attempt.wanted, [h for h in candidates if h.is_expired(now)], now=None)
    if met:
        holds.reclaim(conn, principal, state_id=row.id, state_name=attempt.state_name,
                      run_ids=[c.held.run_id for c in met], now=now)
    live = [h for h in candidates if not h.is_expired(now)] + _held_by_terraform_lock(row)
    conflicts = find_conflicts(attempt.wanted, live, now)
    queued = False
    if not conflicts:
        # Queued requests that compete for our addresses go first, whether or not we wait.
        mine = attempt.waiter_id if attempt.waiter_id is not None else 2**62
        earlier = conn.execute(_EARLIER_WAITERS, (row.id, mine, now - WAITER_STALE)).fetchall()
        queued = blocks(attempt.wanted, [_wanted_from_json(doc) for (doc,) in earlier])
    if conflicts or queued:
        if waiting:
            if attempt.waiter_id is None:
                (attempt.waiter_id,) = conn.execute(
                    _WAITER_INSERT, (row.id, attempt.holder, _wanted_json(attempt.wanted), now, now)).fetchone() or (0,)
            else:
                conn.execute(_WAITER_TOUCH, (now, attempt.waiter_id))
        return conflicts, queued
    if attempt.waiter_id is not None:
        conn.execute(_WAITER_DELETE, (attempt.waiter_id,))
    grant(conn, row)
    return [], False


def _acquire(
    db: Database, principal: Principal, attempt: _Attempt, *, wait: timedelta | None, clock: Clock,
    grant: Callable[[psycopg.Connection, states.StateRow], None], exclude_run: str | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    deadline = clock() + (wait or timedelta(0))
    while True:
        now = clock()
        waiting = wait is not None and now < deadline
        with db.transaction() as conn:
            conflicts, queued = _try_grant(conn, principal, attempt, now, waiting=waiting, grant=grant,
                                           exclude_run=exclude_run)
        if not conflicts and not queued:
            return
        if not waiting:
            _refuse(db, principal, attempt, conflicts, now)
        sleep(min(POLL_SECONDS, max((deadline - clock()).total_seconds(), 0.01)))


def _refuse(db: Database, principal: Principal, attempt: _Attempt, conflicts: list[Conflict], now: datetime) -> None:
    with db.transaction() as conn:
        if attempt.waiter_id is not None:
            conn.execute(_WAITER_DELETE, (attempt.waiter_id,))
        row = states.locked_row(conn, principal, attempt.state_name, create=True)
        assert row is not None
        events.record(conn, principal, "reservation_conflict", state_id=row.id, state_name=attempt.state_name,
                      holder=attempt.holder, wanted=[[w.text, w.mode.value] for w in attempt.wanted],
                      conflicts=[_conflict_payload(c, now) for c in conflicts])
    if conflicts:
        message = "\n".join(describe(c, now) for c in conflicts)
    else:
        message = ("reservation conflict: earlier waiting requests for the same addresses go first; "
                   "retry with a longer wait")
    raise ReservationConflictError(message, [_conflict_payload(c, now) for c in conflicts])


def _insert_reservations(
    conn: psycopg.Connection, principal: Principal, row: states.StateRow, run_id: str, attempt: _Attempt,
    now: datetime, info: dict[str, Any],
) -> None:
    expires = now + attempt.lease
    for w in attempt.wanted:
        conn.execute(_INSERT_RESERVATION, (principal.tenant_id, row.id, run_id, w.text, glob_root(w.text),
                                           w.mode.value, attempt.holder, json.dumps(info), now, expires))
    events.record(conn, principal, "reservation_acquire", state_id=row.id, state_name=attempt.state_name,
                  run_id=run_id, holder=attempt.holder, globs=[[w.text, w.mode.value] for w in attempt.wanted],
                  expires_at=expires.isoformat())


def open_run(
    db: Database, principal: Principal, state_name: str, *, actor: str, wanted: tuple[Wanted, ...],
    lease: timedelta, wait: timedelta | None = None, base_serial: int | None = None,
    info: dict[str, Any] | None = None, clock: Clock = utcnow, run_id: str | None = None,
) -> Run:
    """Open an apply run holding all of ``wanted`` (all-or-nothing), waiting up to ``wait`` in a
    fair queue. Raises ReservationConflictError; nothing is created then."""
    if not actor:
        raise BadRequestError("actor is required: say who is applying (e.g. --actor alice)")
    run_id = run_id or new_run_id()
    attempt = _Attempt(state_name=state_name, holder=actor, wanted=wanted, lease=lease)
    details = dict(info or {})

    def grant(conn: psycopg.Connection, row: states.StateRow) -> None:
        now = clock()
        if base_serial is not None:
            if base_serial > (row.current_serial or 0):
                raise BadRequestError(f"base_serial {base_serial} is ahead of the trunk (serial {row.current_serial})")
            # A plan that is already stale would only fail at commit, after Terraform ran: refuse now.
            holds.check_stale(conn, row.id, base_serial, [w.text for w in wanted])
        conn.execute(_INSERT_RUN, (run_id, principal.tenant_id, row.id, actor, base_serial,
                                   int(lease.total_seconds()), now, now, json.dumps(details)))
        _insert_reservations(conn, principal, row, run_id, attempt, now, details)
        events.record(conn, principal, "run_open", state_id=row.id, state_name=state_name, run_id=run_id,
                      holder=actor, base_serial=base_serial)

    _acquire(db, principal, attempt, wait=wait, clock=clock, grant=grant)
    return get_run(db, principal, run_id)


def _lock_run(conn: psycopg.Connection, principal: Principal, run_id: str) -> tuple[str, str, int, str]:
    """Lock a run's state row, then the run (the order every writer uses, so no deadlocks).
    Returns (status, actor, state id, state name)."""
    found = conn.execute(_FIND_RUN, (run_id, principal.tenant_id, principal.scope)).fetchone()
    if found is None:
        raise RunNotFoundError(f"no apply run {run_id!r}: list runs with kl runs")
    (state_name,) = conn.execute(_STATE_NAME_FOR_UPDATE, (found[0],)).fetchone() or ("",)
    status, actor, state_id = conn.execute(_LOCK_RUN, (run_id, principal.tenant_id)).fetchone() or found
    return status, actor, state_id, state_name


def locked_live_run(
    conn: psycopg.Connection, principal: Principal, run_id: str, holder: str | None, now: datetime,
) -> tuple[str, int]:
    """Lock a live run the caller holds; returns (state name, state id). A lapsed lease fails
    loudly: the holder must stop, because someone else may now hold its addresses."""
    status, actor, state_id, state_name = _lock_run(conn, principal, run_id)
    if holder is not None and holder != actor:
        raise NotRunHolderError(f"apply run {run_id} is held by {actor}, not {holder}")
    expiries = [e for _, _, e in conn.execute(_RUN_RESERVATIONS, (run_id,)).fetchall()]
    lapsed = status == RunStatus.EXPIRED or any(e <= now for e in expiries)
    if lapsed:
        if RunStatus(status).is_live:
            holds.reclaim(conn, principal, state_id=state_id, state_name=state_name, run_ids=[run_id], now=now)
            conn.commit()  # the reclaim stands although the caller is refused
        raise LeaseExpiredError(
            f"the lease of apply run {run_id} expired; its reservations were released and someone else may "
            "now hold those addresses: stop, and re-plan",
        )
    if not RunStatus(status).is_live:
        raise RunClosedError(f"apply run {run_id} is {status} and can no longer commit: if it changed "
                             f"infrastructure, kl recover {run_id} commits its kept state through a new run",
                             status=status)
    return state_name, state_id


def acquire_more(
    db: Database, principal: Principal, run_id: str, *, holder: str, wanted: tuple[Wanted, ...],
    wait: timedelta | None = None, clock: Clock = utcnow,
) -> Run:
    """Add reservations to a live run, all-or-nothing (its own reservations never conflict)."""
    run = get_run(db, principal, run_id)
    attempt = _Attempt(state_name=run.state, holder=holder, wanted=wanted, lease=timedelta(seconds=run.lease_seconds))

    def grant(conn: psycopg.Connection, row: states.StateRow) -> None:
        now = clock()
        locked_live_run(conn, principal, run_id, holder, now)
        _insert_reservations(conn, principal, row, run_id, attempt, now, run.info)

    with db.transaction() as conn:
        locked_live_run(conn, principal, run_id, holder, clock())
    _acquire(db, principal, attempt, wait=wait, clock=clock, grant=grant, exclude_run=run_id)
    return get_run(db, principal, run_id)


def renew(db: Database, principal: Principal, run_id: str, *, holder: str, clock: Clock = utcnow) -> Run:
    """Extend every reservation of the run by its lease. Fails loudly once the lease has lapsed."""
    now = clock()
    with db.transaction() as conn:
        state_name, state_id = locked_live_run(conn, principal, run_id, holder, now)
        (lease_seconds,) = conn.execute(_LEASE_OF, (run_id,)).fetchone() or (0,)
        expires = now + timedelta(seconds=lease_seconds)
        conn.execute(_RENEW, (expires, run_id))
        events.record(conn, principal, "reservation_renew", state_id=state_id, state_name=state_name,
                      run_id=run_id, holder=holder, expires_at=expires.isoformat())
    return get_run(db, principal, run_id)


def release(
    db: Database, principal: Principal, run_id: str, *, holder: str, globs: Sequence[str] | None = None,
    clock: Clock = utcnow,
) -> Run:
    """Drop some (or all) of a live run's reservations; the run stays open."""
    with db.transaction() as conn:
        state_name, state_id = locked_live_run(conn, principal, run_id, holder, clock())
        if globs is None:
            conn.execute(_RELEASE_ALL, (run_id,))
        else:
            conn.execute(_RELEASE_SOME, (run_id, list(globs)))
        events.record(conn, principal, "reservation_release", state_id=state_id, state_name=state_name,
                      run_id=run_id, holder=holder, globs=list(globs) if globs is not None else "all")
    return get_run(db, principal, run_id)


def mark_running(db: Database, principal: Principal, run_id: str, *, holder: str, clock: Clock = utcnow) -> Run:
    with db.transaction() as conn:
        state_name, state_id = locked_live_run(conn, principal, run_id, holder, clock())
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
        conn.execute(_RELEASE_ALL, (run_id,))
        conn.execute(_SET_STATUS, (status.value, now, (error_summary or "")[:4000] or None,
                                   json.dumps(counters or {}), run_id))
        events.record(conn, principal, f"run_{status.value}", state_id=state_id, state_name=state_name,
                      run_id=run_id, holder=holder)
    return get_run(db, principal, run_id)


def abort(db: Database, principal: Principal, run_id: str, *, reason: str = "", clock: Clock = utcnow) -> Run:
    """Operator escape hatch: end any live run and free its addresses, whoever holds it."""
    now = clock()
    with db.transaction() as conn:
        status, actor, state_id, state_name = _lock_run(conn, principal, run_id)
        if not RunStatus(status).is_live:
            raise RunClosedError(f"apply run {run_id} is already {status}", status=status)
        conn.execute(_RELEASE_ALL, (run_id,))
        conn.execute(_SET_STATUS, ("aborted", now, f"aborted by {principal.actor}" + (f": {reason}" if reason else ""),
                                   "{}", run_id))
        events.record(conn, principal, "run_abort", state_id=state_id, state_name=state_name, run_id=run_id,
                      holder=actor, reason=reason)
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
        return cur.execute(_RUN_RESERVATION_VIEWS, (run_id, principal.tenant_id, principal.scope)).fetchall()


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
        try:
            who = str(json.loads(bytes(info)).get("Who") or "terraform")
        except ValueError:
            who = "terraform"
        found.append(ReservationView(state=name, glob="*", mode="write", holder=who, run_id=None,
                                     acquired_at=locked_at, expires_at=None))
    return sorted(found, key=lambda r: (r.state, r.acquired_at))
