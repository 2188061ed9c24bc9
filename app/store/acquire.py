"""Acquiring reservations: one all-or-nothing attempt per request, and the wait-ticket queue.

A request first looks at the state without its row lock: if it meets live conflicts or an earlier
waiter it is refused or queued from that snapshot (safe: that grants and changes no reservation), so
requests that conflict anyway never hold the lock Terraform's LOCK and every grant wait for. Only a
request that might be granted takes the state's row lock and decides there, re-checking everything.

Waiting never holds a worker: a request that asks to wait and meets a conflict gets a ``Ticket``
(a row of ``reservation_waiters``) at once and asks again with it; a ticket not presented again
within its window stops blocking others and can never be granted. Conflict checks go through
``find_conflicts``'s glob index, never requested × held.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from analyzer.globs import parse_glob
from app.domain import scopes
from app.domain.locking import lock_created
from app.domain.principal import Principal
from app.domain.reservations import (
    SHOWN_WAITERS,
    Conflict,
    Held,
    Mode,
    Waiter,
    Wanted,
    blocks,
    describe,
    describe_waiting,
    find_conflicts,
    glob_root,
    shown_conflicts,
    terraform_lock_hold,
    waiting_ahead,
)
from app.errors import ReservationConflictError, StateNotFoundError, TicketExpiredError
from app.store import events, reservation_rows, states
from app.store.db import Database

Clock = Callable[[], datetime]
# How soon a waiting client should ask again, and how long a ticket keeps its place without being
# presented again (KL_WAIT_TICKET_SECONDS overrides the window per call).
POLL_SECONDS = 1.0
WAITER_STALE = timedelta(seconds=10)
# A conflict check stops collecting after this many conflicts: the answer lists the first few and
# says how many more there are ("at least" once the scan stopped).
CONFLICT_SCAN_LIMIT = 1000
_TICKET = re.compile(r"wt_([1-9][0-9]{0,17})")
# A waiter named in a refusal shows this many of the globs it wants.
SHOWN_WANTED = 5

_INSERT_RESERVATION = """
INSERT INTO resource_reservations (tenant_id, state_id, run_id, glob, root, mode, holder, info,
                                   acquired_at, expires_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (run_id, glob, mode) DO UPDATE SET expires_at = EXCLUDED.expires_at
"""
_WAITER_INSERT = """
INSERT INTO reservation_waiters (state_id, holder, wanted, enqueued_at, seen_at, credential, wait_until, run_id)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
RETURNING id
"""
_WAITER_TOUCH = "UPDATE reservation_waiters SET seen_at = %s WHERE id = %s"
_WAITER_DELETE = "DELETE FROM reservation_waiters WHERE id = %s"
_WAITER_FIND = """
SELECT state_id, wanted, credential, seen_at, wait_until, enqueued_at FROM reservation_waiters WHERE id = %s
"""
_WAITER_PURGE = "DELETE FROM reservation_waiters WHERE state_id = %s AND seen_at <= %s"
_EARLIER_WAITERS = """
SELECT wanted, holder, run_id, enqueued_at FROM reservation_waiters
WHERE state_id = %s AND id < %s AND seen_at > %s ORDER BY id
"""
# A waiter leaves the queue with the kl process that waits: only its own credential and holder can do that.
_WAITER_CANCEL = """
DELETE FROM reservation_waiters WHERE id = %s AND credential = %s AND holder = %s
RETURNING state_id, (SELECT name FROM states WHERE states.id = reservation_waiters.state_id)
"""


@dataclass(frozen=True, slots=True)
class Ticket:
    """A waiting request's place in the queue: present ``id`` again (with the same reservations)
    within ``expires_in`` seconds, after about ``poll_after`` seconds, to keep it."""

    id: str
    poll_after: float
    expires_in: int
    wait_until: datetime
    conflicts: list[dict[str, object]]
    conflicts_total: int


@dataclass(frozen=True, slots=True)
class WaitPolicy:
    """How a request waits: ``wait`` is how long it may stay queued in all (None: not at all),
    ``ticket`` the place it already holds, ``window`` how long a ticket lives unpresented."""

    wait: timedelta | None = None
    ticket: str | None = None
    window: timedelta = WAITER_STALE
    poll_after: float = POLL_SECONDS


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
class Attempt:
    """The state of one acquisition: what it wants and the queue place it holds, if any."""

    state_name: str
    holder: str
    wanted: tuple[Wanted, ...]
    lease: timedelta
    waiter_id: int | None = None
    wait_until: datetime | None = None
    enqueued_at: datetime | None = None
    run_id: str | None = None  # the live run that asks for more reservations, if any
    earlier: list[tuple[Any, ...]] = field(default_factory=list)  # the queue ahead when it last blocked us


def _is_queued(attempt: Attempt, earlier: list[tuple[Any, ...]]) -> bool:
    """Whether earlier waiters compete for our addresses (then they go first); keeps the queue for a refusal."""
    queued = bool(earlier) and blocks(attempt.wanted, [_wanted_from_json(row[0]) for row in earlier])
    attempt.earlier = earlier if queued else []
    return queued


def _ahead(attempt: Attempt) -> list[Waiter]:
    """The earlier waiters that each compete with ``attempt`` (at most one conflict scan's worth)."""
    earlier = [Waiter(holder=h, run_id=r, enqueued_at=at, wanted=tuple(_wanted_from_json(doc)))
               for doc, h, r, at in attempt.earlier[:CONFLICT_SCAN_LIMIT]]
    return waiting_ahead(attempt.wanted, earlier)


def _waiter_payload(w: Waiter, now: datetime) -> dict[str, object]:
    return {"holder": w.holder, "run_id": w.run_id, "enqueued_at": w.enqueued_at.isoformat(),
            "waiting_seconds": max(int((now - w.enqueued_at).total_seconds()), 0),
            "wanted": [{"glob": x.text, "mode": x.mode.value} for x in w.wanted[:SHOWN_WANTED]],
            "wanted_total": len(w.wanted)}


def cancel_ticket(db: Database, principal: Principal, ticket: str, holder: str) -> bool:
    """Give up the queue place ``ticket`` names (its waiter stopped waiting); False when there is no such
    place of this credential and holder (lapsed, granted, refused, or never theirs)."""
    found = _TICKET.fullmatch(ticket)
    if found is None:
        return False
    with db.transaction() as conn:
        row = conn.execute(_WAITER_CANCEL, (int(found.group(1)), principal.credential, holder)).fetchone()
        if row is not None:
            events.record(conn, principal, "reservation_wait_cancelled", state_id=row[0], state_name=row[1] or "",
                          holder=holder, ticket=ticket)
    return row is not None


def _held_by_terraform_lock(row: states.StateRow) -> list[Held]:
    held = row.held_lock
    if held is None:
        return []
    return [terraform_lock_hold(held, lock_created(held, datetime.now(UTC)))]


def _try_grant(
    conn: psycopg.Connection, principal: Principal, attempt: Attempt, now: datetime, *, waiting: bool,
    grant: Callable[[psycopg.Connection, states.StateRow], None], window: timedelta,
    exclude_run: str | None = None, state_id: int | None = None,
) -> tuple[list[Conflict], bool]:
    """One all-or-nothing attempt under the state row lock. Returns (conflicts, blocked_by_queue);
    both empty means granted (``grant`` ran in this transaction). The work is one indexed walk per
    requested glob (``find_conflicts``), never requested × held.

    With ``state_id`` (the state as the first look found it), taking the lock and every read under it are
    one pipelined round trip, and so are the grant's writes with COMMIT: the lock is held for two round
    trips and the in-memory checks between them, plus whatever the grant reads (an open run's early
    staleness check: one more). A state that is new, or was replaced since, takes the sequential path."""
    roots = {glob_root(w.text) for w in attempt.wanted}
    mine = attempt.waiter_id if attempt.waiter_id is not None else 2**62
    locked = _locked_reads(conn, principal, attempt, state_id, roots, now, window, mine) if state_id else None
    if locked is None:
        row = states.locked_row(conn, principal, attempt.state_name, create=True)
        assert row is not None  # create=True
        held = reservation_rows.candidates(conn, row.id, roots)
        earlier: list[tuple[Any, ...]] | None = None
    else:
        row, held, earlier = locked
    candidates = [h for h in held if h.run_id != exclude_run]
    expired = [h for h in candidates if h.is_expired(now)]
    if expired:
        met = find_conflicts(attempt.wanted, expired, now=None, limit=CONFLICT_SCAN_LIMIT)
        if met:
            reservation_rows.reclaim(conn, principal, state_id=row.id, state_name=attempt.state_name,
                          run_ids=[c.held.run_id for c in met], now=now)
    live = [h for h in candidates if not h.is_expired(now)] + _held_by_terraform_lock(row)
    conflicts = find_conflicts(attempt.wanted, live, now, limit=CONFLICT_SCAN_LIMIT)
    queued = False
    if not conflicts:
        # Queued requests that compete for our addresses go first, whether or not we wait.
        if earlier is None:
            conn.execute(_WAITER_PURGE, (row.id, now - window))
            earlier = conn.execute(_EARLIER_WAITERS, (row.id, mine, now - window)).fetchall()
        queued = _is_queued(attempt, earlier)
    if conflicts or queued:
        if waiting:
            _enqueue(conn, principal, attempt, row.id, now)
        return conflicts, queued
    with conn.pipeline():  # the grant's writes and COMMIT in one round trip (its reads sync on their own)
        if attempt.waiter_id is not None:
            conn.execute(_WAITER_DELETE, (attempt.waiter_id,))
        grant(conn, row)
        conn.commit()
    return [], False


def _locked_reads(
    conn: psycopg.Connection, principal: Principal, attempt: Attempt, state_id: int, roots: set[str],
    now: datetime, window: timedelta, mine: int,
) -> tuple[states.StateRow, list[Held], list[tuple[Any, ...]]] | None:
    """Take the state's row lock and read its candidate reservations and earlier waiters (purging the
    lapsed ones first) in one pipeline; None when the state is no longer the one ``state_id`` names."""
    with conn.pipeline():
        row_read = states.lock_row_read(conn, principal, attempt.state_name)
        held_read = reservation_rows.candidates_read(conn, state_id, roots)
        conn.execute(_WAITER_PURGE, (state_id, now - window))
        earlier_read = conn.execute(_EARLIER_WAITERS, (state_id, mine, now - window))
    row = row_read.fetchone()
    if row is None or row.id != state_id:
        return None
    return row, reservation_rows.candidates_of(held_read), earlier_read.fetchall()


def _first_look(
    conn: psycopg.Connection, principal: Principal, attempt: Attempt, now: datetime, *, window: timedelta,
    exclude_run: str | None,
) -> tuple[int, list[Conflict], bool] | int | None:
    """The live conflicts and earlier waiters a request meets, read without the state's row lock:
    (state id, conflicts, blocked by the queue), or None when it might be granted, which only the
    locked attempt decides. Refusing or queueing on this snapshot is safe (it grants and changes no
    reservation), and it keeps requests that conflict anyway — a hostile 1,000-glob request included —
    from ever holding the lock that Terraform's LOCK and every grant wait for. A request that might be
    granted gets the state's id instead (None for a state that does not exist yet)."""
    row = _peek_state(conn, principal, attempt.state_name)
    if row is None:
        return None
    roots = {glob_root(w.text) for w in attempt.wanted}
    live = [h for h in reservation_rows.candidates(conn, row.id, roots)
            if h.run_id != exclude_run and not h.is_expired(now)]
    conflicts = find_conflicts(attempt.wanted, live + _held_by_terraform_lock(row), now, limit=CONFLICT_SCAN_LIMIT)
    queued = False
    if not conflicts:
        mine = attempt.waiter_id if attempt.waiter_id is not None else 2**62
        earlier = conn.execute(_EARLIER_WAITERS, (row.id, mine, now - window)).fetchall()
        queued = _is_queued(attempt, earlier)
    if not conflicts and not queued:
        return row.id
    return row.id, conflicts, queued


def _peek_state(conn: psycopg.Connection, principal: Principal, name: str) -> states.StateRow | None:
    try:
        return states.find_state(conn, principal, name)
    except StateNotFoundError:
        return None


def _enqueue(conn: psycopg.Connection, principal: Principal, attempt: Attempt, state_id: int,
             now: datetime) -> None:
    if attempt.waiter_id is None:
        (attempt.waiter_id,) = conn.execute(_WAITER_INSERT, (
            state_id, attempt.holder, _wanted_json(attempt.wanted), now, now, principal.credential,
            attempt.wait_until, attempt.run_id)).fetchone() or (0,)
        events.record(conn, principal, "reservation_wait", state_id=state_id, state_name=attempt.state_name,
                      holder=attempt.holder, run_id=attempt.run_id,
                      globs=[[w.text, w.mode.value] for w in attempt.wanted[:200]],
                      wait_until=attempt.wait_until.isoformat() if attempt.wait_until else None)
    else:
        conn.execute(_WAITER_TOUCH, (now, attempt.waiter_id))


def _redeem(conn: psycopg.Connection, principal: Principal, attempt: Attempt, ticket: str, now: datetime,
            window: timedelta) -> None:
    """Take up the queue place ``ticket`` names, or raise TicketExpiredError: it must be this
    caller's, for the same state and reservations, and presented within its window."""
    found = _TICKET.fullmatch(ticket)
    row = conn.execute(_WAITER_FIND, (int(found.group(1)),)).fetchone() if found else None
    state = _peek_state(conn, principal, attempt.state_name)
    mine = (row is not None and state is not None and row[0] == state.id and row[2] == principal.credential
            and _wanted_from_json(row[1]) == list(attempt.wanted))
    if row is not None and mine and row[3] > now - window:
        attempt.waiter_id = int(found.group(1)) if found else None
        attempt.wait_until = row[4]
        attempt.enqueued_at = row[5]
        return
    if row is not None and mine:
        conn.execute(_WAITER_DELETE, (int(found.group(1)) if found else 0,))
        conn.commit()  # the lapsed place is gone although the caller is refused
    raise TicketExpiredError(
        f"wait ticket {ticket[:40]!r} is not a live place in this state's queue (tickets lapse when not "
        f"presented again within {int(window.total_seconds())} s, and belong to the credential and "
        "reservations that took them): ask again without a ticket to queue anew"
    )


def acquire(
    db: Database, principal: Principal, attempt: Attempt, *, policy: WaitPolicy, clock: Clock,
    grant: Callable[[psycopg.Connection, states.StateRow], None], exclude_run: str | None = None,
) -> Ticket | None:
    """One attempt: None when granted, a Ticket when the request waits, else ReservationConflictError
    (or AddressScopeError, before anything is read, when the token's address scopes do not cover it)."""
    scopes.check_requested(principal.scopes, attempt.state_name, ((w.glob, w.mode) for w in attempt.wanted))
    now = clock()
    with db.transaction() as conn:
        if policy.ticket:
            _redeem(conn, principal, attempt, policy.ticket, now, policy.window)
        elif policy.wait:
            attempt.wait_until = now + policy.wait
        waiting = bool(policy.wait) and attempt.wait_until is not None and now < attempt.wait_until
        seen = _first_look(conn, principal, attempt, now, window=policy.window, exclude_run=exclude_run)
        if isinstance(seen, tuple):
            state_id, conflicts, queued = seen
            if waiting:
                _enqueue(conn, principal, attempt, state_id, now)
    if not isinstance(seen, tuple):
        with db.transaction() as conn:
            conflicts, queued = _try_grant(conn, principal, attempt, now, waiting=waiting, grant=grant,
                                           window=policy.window, exclude_run=exclude_run, state_id=seen)
    if not conflicts and not queued:
        return None
    if not waiting:
        _refuse(db, principal, attempt, conflicts, now)
    assert attempt.waiter_id is not None and attempt.wait_until is not None
    shown, more = shown_conflicts(conflicts)
    return Ticket(id=f"wt_{attempt.waiter_id}", poll_after=_poll_after(policy, attempt, now),
                  expires_in=int(policy.window.total_seconds()), wait_until=attempt.wait_until,
                  conflicts=[_conflict_payload(c, now) for c in shown], conflicts_total=len(shown) + more)


def _poll_after(policy: WaitPolicy, attempt: Attempt, now: datetime) -> float:
    """How soon to ask again: ``poll_after`` for a fresh ticket, backing off to three times that for
    one queued a minute or more (never beyond a third of the ticket's window), so many long waiters
    cost the server a few requests per second."""
    queued_for = 0.0
    if attempt.enqueued_at is not None:
        queued_for = (now - attempt.enqueued_at).total_seconds()
    factor = 1.0 if queued_for < 10 else 2.0 if queued_for < 60 else 3.0
    return round(min(policy.poll_after * factor, policy.window.total_seconds() / 3), 2)


def _refuse(db: Database, principal: Principal, attempt: Attempt, conflicts: list[Conflict], now: datetime) -> None:
    shown, more = shown_conflicts(conflicts)
    at_least = " (at least)" if len(conflicts) >= CONFLICT_SCAN_LIMIT else ""
    payload = [_conflict_payload(c, now) for c in shown]
    ahead = [] if conflicts else _ahead(attempt)
    waiting = [_waiter_payload(w, now) for w in ahead[:SHOWN_WAITERS]]
    with db.transaction() as conn:
        if attempt.waiter_id is not None:
            conn.execute(_WAITER_DELETE, (attempt.waiter_id,))
        row = _peek_state(conn, principal, attempt.state_name)
        wanted_shown, wanted_more = attempt.wanted[:20], max(len(attempt.wanted) - 20, 0)
        events.record(conn, principal, "reservation_conflict", state_id=row.id if row else None,
                      state_name=attempt.state_name,
                      holder=attempt.holder, wanted=[[w.text, w.mode.value] for w in wanted_shown],
                      wanted_more=wanted_more, conflicts=payload, conflicts_more=more,
                      **({"waiting": waiting, "waiting_total": len(ahead)} if ahead else {}))
    if conflicts:
        message = "\n".join(describe(c, now) for c in shown)
        if more:
            message += f"\nand {more}{at_least} more conflicts"
    else:
        message = describe_waiting(ahead, now)
    raise ReservationConflictError(message, payload, total=len(shown) + more,
                                   **({"waiting": waiting, "waiting_total": len(ahead)} if not conflicts else {}))


def insert_reservations(
    conn: psycopg.Connection, principal: Principal, row: states.StateRow, run_id: str, attempt: Attempt,
    now: datetime, info: dict[str, Any],
) -> None:
    expires = now + attempt.lease
    detail = json.dumps(info)
    with conn.cursor() as cur:  # one pipelined batch, not a round trip per glob under the row lock
        cur.executemany(_INSERT_RESERVATION, [
            (principal.tenant_id, row.id, run_id, w.text, glob_root(w.text), w.mode.value, attempt.holder, detail,
             now, expires) for w in attempt.wanted])
    events.record(conn, principal, "reservation_acquire", state_id=row.id, state_name=attempt.state_name,
                  run_id=run_id, holder=attempt.holder,
                  globs=[[w.text, w.mode.value] for w in attempt.wanted[:200]],
                  globs_more=max(len(attempt.wanted) - 200, 0), expires_at=expires.isoformat())
