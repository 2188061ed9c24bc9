"""Low-level reads and reclaims of reservations, shared by the state lock and the reservation
operations. Callers hold the state row lock (``FOR UPDATE``) of the state they pass."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import psycopg

from analyzer.globs import Glob
from app.domain import commit as rules
from app.domain.principal import Principal
from app.domain.reservations import Held, Mode, RunStatus
from app.errors import StalePlanError
from app.store import events, resources
from app.store.db import LIVE_STATUSES_SQL

_CANDIDATES = """
SELECT r.glob, r.mode, r.holder, r.run_id, r.acquired_at, r.expires_at
FROM resource_reservations r
WHERE r.state_id = %s AND (r.root = ANY(%s) OR r.root = '*' OR %s)
"""
_LIVE_FOR_STATE = """
SELECT r.glob, r.mode, r.holder, r.run_id, r.acquired_at, r.expires_at
FROM resource_reservations r WHERE r.state_id = %s AND r.expires_at > %s
ORDER BY r.acquired_at, r.id LIMIT %s
"""
_EXPIRED_RUNS = """
SELECT DISTINCT run_id FROM resource_reservations WHERE state_id = %s AND expires_at <= %s
"""
_EXPIRE_RUN = f"""
UPDATE apply_runs SET status = 'expired', finished_at = %s,
       error_summary = coalesce(error_summary, 'lease expired; reservations reclaimed')
WHERE id = %s AND status IN {LIVE_STATUSES_SQL}
RETURNING actor, info->'manual_hold'
"""
_DROP_RUN_RESERVATIONS = "DELETE FROM resource_reservations WHERE run_id = %s"


_MODES = {m.value: m for m in Mode}


def _held(rows: Iterable[tuple[str, str, str, str, datetime, datetime]]) -> list[Held]:
    modes = _MODES  # a dict lookup, not an enum call per row: a busy state has thousands of rows
    return [Held(glob=g, mode=modes[m], holder=h, run_id=r, acquired_at=a, expires_at=e) for g, m, h, r, a, e in rows]


def drop_run_reservations(conn: psycopg.Connection, run_id: str) -> None:
    """Free every address ``run_id`` holds: the one statement behind a commit, a close, an abort and a reclaim."""
    conn.execute(_DROP_RUN_RESERVATIONS, (run_id,))


def candidates(conn: psycopg.Connection, state_id: int, roots: set[str]) -> list[Held]:
    """Reservations of the state that could intersect globs with these roots (expired included)."""
    return candidates_of(candidates_read(conn, state_id, roots))


def candidates_read(
    conn: psycopg.Connection, state_id: int, roots: set[str],
) -> psycopg.Cursor[tuple[str, str, str, str, datetime, datetime]]:
    """``candidates``'s query, sent but not yet fetched (so it can share a pipeline)."""
    # Never prepared: a prepared statement may fall back to a generic plan that cannot use the root
    # index (it must serve the '*' case too) and scans every reservation of the state.
    cur: psycopg.Cursor[tuple[str, str, str, str, datetime, datetime]] = conn.cursor()
    return cur.execute(_CANDIDATES, (state_id, sorted(roots), "*" in roots), prepare=False)


def candidates_of(read: psycopg.Cursor[tuple[str, str, str, str, datetime, datetime]]) -> list[Held]:
    return _held(read.fetchall())


def reclaim(
    conn: psycopg.Connection, principal: Principal, *, state_id: int, state_name: str, run_ids: Iterable[str],
    now: datetime,
) -> None:
    """Expire runs whose leases ran out and drop their reservations (the acquirer that meets an
    expired reservation reclaims it)."""
    for run_id in sorted(set(run_ids)):
        expired = conn.execute(_EXPIRE_RUN, (now, run_id)).fetchone()
        drop_run_reservations(conn, run_id)
        if expired is not None:
            events.record(conn, principal, "reservation_expired", state_id=state_id, state_name=state_name,
                          run_id=run_id, holder=expired[0], status=RunStatus.EXPIRED.value)
            if expired[1] is not None:  # a manual hold (app.store.manual_holds) ran out
                hold = expired[1]
                events.record(conn, principal, "hold_expired", state_id=state_id, state_name=state_name,
                              run_id=run_id, hold_id=run_id, globs=hold.get("globs", []),
                              reason=hold.get("reason", ""), holder=hold.get("holder", ""),
                              until=hold.get("until"))


def live_for_state(
    conn: psycopg.Connection, principal: Principal, *, state_id: int, state_name: str, now: datetime,
    limit: int = 20,
) -> list[Held]:
    """The oldest unexpired reservations of a state (at most ``limit``), after reclaiming every
    expired one: Terraform's whole-state lock meets all of them."""
    expired = [row[0] for row in conn.execute(_EXPIRED_RUNS, (state_id, now))]
    if expired:
        reclaim(conn, principal, state_id=state_id, state_name=state_name, run_ids=expired, now=now)
    return _held(conn.execute(_LIVE_FOR_STATE, (state_id, now, limit)).fetchall())


CHANGED_SINCE = """
SELECT address, create_serial, delete_serial FROM resources
WHERE state_id = %s AND (create_serial > %s OR delete_serial > %s)
"""


def changed_since(conn: psycopg.Connection, state_id: int, base_serial: int) -> list[tuple[str, int]]:
    """(address, serial) of every row opened or closed after ``base_serial``."""
    return changes_after(conn.execute(CHANGED_SINCE, (state_id, base_serial, base_serial)), base_serial)


def changes_after(
    rows: Iterable[tuple[str, int, int | None]], base_serial: int,
) -> list[tuple[str, int]]:
    """(address, serial of the change after ``base_serial``) of rows read as (address, create_serial,
    delete_serial)."""
    return [(a, c if c > base_serial else (d or 0)) for a, c, d in rows]


_HEAD_VERSION = "SELECT head_version_id, coalesce(current_serial, 0) FROM states WHERE id = %s"
_VERSION_AT = """
SELECT id FROM state_versions WHERE state_id = %s AND serial <= %s ORDER BY serial DESC LIMIT 1
"""


def _output_moves(
    conn: psycopg.Connection, state_id: int, base_serial: int, globs: list[Glob], head: tuple[int | None, int],
) -> list[str]:
    """Reserved root outputs whose head value differs from their value at ``base_serial``; ``head`` is the
    state's (head version id, serial)."""
    head_version_id, head_serial = head
    if head_version_id is None or head_serial <= base_serial or not any(
            g.is_output or g.is_everything for g in globs):
        return []
    version = conn.execute(_VERSION_AT, (state_id, base_serial)).fetchone()
    base = resources.outputs_of(conn, version_id=version[0]) if version else []
    return rules.stale_outputs(base, resources.outputs_of(conn, version_id=head_version_id), globs)


def check_stale(conn: psycopg.Connection, state_id: int, base_serial: int, globs: Iterable[str]) -> None:
    """Raise StalePlanError when any address or root output under ``globs`` changed after
    ``base_serial`` (the last writer never silently wins over a reservation's base)."""
    parsed = rules.parse_globs(globs)
    with conn.pipeline():  # one round trip: callers hold the state's row lock
        changed_read = conn.execute(CHANGED_SINCE, (state_id, base_serial, base_serial))
        head_read = conn.execute(_HEAD_VERSION, (state_id,))
    found = rules.stale(changes_after(changed_read.fetchall(), base_serial), parsed)
    head = head_read.fetchone() or (None, 0)
    raise_if_stale(base_serial, found, _output_moves(conn, state_id, base_serial, parsed, head))


def raise_if_stale(base_serial: int, found: list[tuple[str, int]], outputs: list[str]) -> None:
    """Raise StalePlanError naming the reserved addresses (with the serial that changed them) and root
    outputs that moved after ``base_serial``, if there are any."""
    if found or outputs:
        items = [f"{a} (serial {s})" for a, s in found] + [f"output.{n}" for n in outputs]
        shown = ", ".join(items[:10])
        more = f" and {len(items) - 10} more" if len(items) > 10 else ""
        raise StalePlanError(
            f"stale plan: reserved addresses changed after base serial {base_serial}: {shown}{more}; "
            "re-run kl plan",
            stale=[{"address": a, "serial": s} for a, s in found[:200]]
            + [{"address": f"output.{n}", "serial": None} for n in outputs[:200]],
        )
