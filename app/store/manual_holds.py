"""Manual holds (app.domain.manual_holds): take, list and release them, within the operator's bounds.

A hold is an apply run holding write reservations (the run's id is the hold's id), with
``{"manual_hold": {...}}`` in its info and the hold's lease: the acquisition, its conflicts, waiting, scope
checks, Terraform's LOCK 423 and expiry are the reservation paths' own. This module adds the caps (per
credential and per state, re-checked under the state's row lock after the grant, so concurrent takers never
pass them), the audit events ``hold_taken`` and ``hold_released`` (``hold_expired`` is recorded where
expired reservations are reclaimed, app.store.reservation_rows), and the listing.

Must not: parse request bodies (app.web.manual_holds) or decide bounds (app.domain.manual_holds).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import class_row

from analyzer.globs import footprint_reservations
from app.domain import scopes
from app.domain.manual_holds import UNTIL_RELEASED, HoldPolicy, holder_text
from app.domain.principal import Principal
from app.domain.reservations import RunStatus, Wanted, parse_wanted
from app.errors import BadRequestError, HoldLimitError, HoldNotFoundError, RunClosedError, StateNotFoundError
from app.store import events, runs, states
from app.store.db import LIVE_STATUSES_SQL, Database

_LIVE_HOLD = f"""
r.tenant_id = %(tenant)s AND r.status IN {LIVE_STATUSES_SQL} AND r.info ? 'manual_hold'
AND EXISTS (SELECT 1 FROM resource_reservations x WHERE x.run_id = r.id AND x.expires_at > %(now)s)
"""
_COUNTS = f"""
SELECT count(*) FILTER (WHERE r.credential = %(credential)s), count(*) FILTER (WHERE r.state_id = %(state_id)s)
FROM apply_runs r WHERE {_LIVE_HOLD}
"""
_LIST = f"""
SELECT r.id, s.name AS state, r.info->'manual_hold'->>'holder' AS holder,
       r.info->'manual_hold'->>'reason' AS reason,
       ARRAY(SELECT jsonb_array_elements_text(r.info->'manual_hold'->'globs')) AS globs,
       r.created_at, (r.info->'manual_hold'->>'until')::timestamptz AS until, r.actor AS held_as
FROM apply_runs r JOIN states s ON s.id = r.state_id
WHERE {_LIVE_HOLD} AND s.scope = %(scope)s AND (%(state)s::text IS NULL OR s.name = %(state)s)
  AND (%(id)s::text IS NULL OR r.id = %(id)s)
ORDER BY r.created_at, r.id LIMIT %(limit)s
"""


@dataclass(frozen=True, slots=True)
class Hold:
    """A live manual hold. ``until`` is None for a hold until released; ``held_as`` is the holder text its
    reservations carry (what conflicts name)."""

    id: str
    state: str
    holder: str
    reason: str
    globs: list[str]
    created_at: datetime
    until: datetime | None
    held_as: str

    def payload(self) -> dict[str, Any]:
        return {"id": self.id, "state": self.state, "holder": self.holder, "reason": self.reason,
                "globs": list(self.globs), "created_at": self.created_at.isoformat(),
                "until": self.until.isoformat() if self.until else None, "held_as": self.held_as,
                "release": f"kl release {self.id}"}


def _detail(hold: Hold) -> dict[str, Any]:
    """The audit events' fields (the same for taken, released and expired)."""
    return {"hold_id": hold.id, "globs": list(hold.globs), "reason": hold.reason, "holder": hold.holder,
            "until": hold.until.isoformat() if hold.until else None}


def _counts(conn: psycopg.Connection, principal: Principal, state_id: int | None, now: datetime) -> tuple[int, int]:
    row = conn.execute(_COUNTS, {"tenant": principal.tenant_id, "credential": principal.credential,
                                 "state_id": state_id or 0, "now": now}).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def _check_caps(counts: tuple[int, int], policy: HoldPolicy, state_name: str, *, taken: int) -> None:
    """``taken`` is 1 when ``counts`` include the hold being taken (the check after the grant)."""
    per_token, per_state = counts
    if per_token - taken >= policy.max_per_token:
        raise HoldLimitError(f"this token already has {per_token - taken} live holds, the most it may have "
                             f"(KL_MAX_HOLDS_PER_TOKEN={policy.max_per_token}): release one with kl release ID",
                             limit=policy.max_per_token)
    if per_state - taken >= policy.max_per_state:
        raise HoldLimitError(f"state {state_name!r} already has {per_state - taken} live holds, the most it may "
                             f"have (KL_MAX_HOLDS_PER_STATE={policy.max_per_state})", limit=policy.max_per_state)


def take(db: Database, principal: Principal, state_name: str, *, globs: Sequence[str], reason: str,
         policy: HoldPolicy, until_seconds: float | None, until_released: bool, max_globs: int,
         clock: runs.Clock = runs.utcnow) -> Hold:
    """Hold ``globs`` (write) on the state for the caller, all-or-nothing and without waiting. Raises
    ReservationConflictError naming whoever holds an intersecting glob, AddressScopeError outside the
    token's write scopes, HoldLimitError past a cap, HoldForbiddenError for an until-released hold the
    caller may not take, BadRequestError for bad input; nothing is held then."""
    lease = policy.lease(until_seconds=until_seconds, until_released=until_released,
                         token_name=principal.token_name, actor=principal.actor)
    wanted: tuple[Wanted, ...] = parse_wanted(footprint_reservations(sorted(set(globs)), ()))
    if not wanted:
        raise BadRequestError("name at least one address glob to hold")
    scopes.check_requested(principal.scopes, state_name, ((w.glob, w.mode) for w in wanted))
    if len(wanted) > max_globs:
        raise BadRequestError(f"a hold of {len(wanted)} globs is more than a run may hold ({max_globs}, "
                              "KL_MAX_GLOBS_PER_RUN): hold module or resource prefixes instead")
    now = clock()
    with db.transaction() as conn:
        known = _state_id(conn, principal, state_name)
        _check_caps(_counts(conn, principal, known, now), policy, state_name, taken=0)
    run_id = runs.new_run_id()
    until = None if lease is None else now + lease
    info = {"manual_hold": {"holder": principal.actor, "reason": reason, "globs": [w.text for w in wanted],
                            "until": until.isoformat() if until else None}}
    held_as = holder_text(principal.actor, reason, run_id)
    run = runs.open_run(db, principal, state_name, actor=held_as, wanted=wanted, lease=lease or UNTIL_RELEASED,
                        info=info, clock=clock, run_id=run_id)
    assert isinstance(run, runs.Run)  # no wait asked: granted or refused
    hold = Hold(id=run.id, state=state_name, holder=principal.actor, reason=reason,
                globs=[w.text for w in wanted], created_at=run.created_at, until=until, held_as=held_as)
    try:
        with db.transaction() as conn:
            # The state row lock serializes concurrent takers' re-checks.
            row = states.locked_row(conn, principal, state_name, create=False)
            assert row is not None
            _check_caps(_counts(conn, principal, row.id, clock()), policy, state_name, taken=1)
            events.record(conn, principal, "hold_taken", state_id=row.id, state_name=state_name, run_id=run.id,
                          **_detail(hold))
    except Exception:
        _end(db, principal, run.id, held_as, "the hold passed a cap or could not be recorded")
        raise
    return hold


def _state_id(conn: psycopg.Connection, principal: Principal, state_name: str) -> int | None:
    try:
        return states.find_state(conn, principal, state_name).id
    except StateNotFoundError:  # a state that does not exist yet has no holds; open_run creates it
        return None


def _end(db: Database, principal: Principal, run_id: str, holder: str, reason: str) -> None:
    try:
        runs.close_run(db, principal, run_id, holder=holder, status=RunStatus.ABORTED, error_summary=reason)
    except RunClosedError:
        pass


def list_holds(db: Database, principal: Principal, *, state: str | None = None, hold_id: str | None = None,
               limit: int = 500, clock: runs.Clock = runs.utcnow) -> list[Hold]:
    """The live manual holds in the caller's tenant and scope, oldest first."""
    params = {"tenant": principal.tenant_id, "scope": principal.scope, "state": state, "id": hold_id,
              "now": clock(), "limit": limit}
    with db.transaction() as conn, conn.cursor(row_factory=class_row(Hold)) as cur:
        return cur.execute(_LIST, params).fetchall()


def release(db: Database, principal: Principal, hold_id: str, clock: runs.Clock = runs.utcnow) -> Hold:
    """End a live manual hold: its run is aborted (its reservations go now) and ``hold_released`` is
    recorded; the audit log keeps the hold. Only the credential that took it may (NotRunHolderError);
    HoldNotFoundError when there is no such live hold."""
    found = list_holds(db, principal, hold_id=hold_id, limit=1, clock=clock) if len(hold_id) <= 40 else []
    if not found:
        raise HoldNotFoundError(f"no live manual hold {hold_id[:40]!r}: kl reservations lists the holds "
                                "(it may have expired or been released)")
    hold = found[0]
    try:
        run = runs.close_run(db, principal, hold.id, holder=hold.held_as, status=RunStatus.ABORTED,
                             error_summary=f"manual hold released by {principal.actor}", clock=clock)
    except RunClosedError as exc:
        raise HoldNotFoundError(f"manual hold {hold.id} has ended already") from exc
    with db.transaction() as conn:
        events.record(conn, principal, "hold_released", state_id=run.state_id, state_name=hold.state,
                      run_id=hold.id, released_by=principal.actor, **_detail(hold))
    return hold
