"""Counts for ``/metrics``, read at scrape time: live reservations, lapsed leases, live and
finished apply runs (pull-request holds apart), Terraform locks and queued waiters.

These are the store's only reads across tenants. They return bare numbers and ages — no tenant,
state, address or holder — so the metrics endpoint can never leak one tenant's data to another.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from app.store.db import LIVE_STATUSES_SQL, Database

_RESERVATIONS = """
SELECT count(*) FILTER (WHERE expires_at > %(now)s), count(*) FILTER (WHERE expires_at <= %(now)s)
FROM resource_reservations
"""
# apply_runs is read whole: runs are few compared with resource rows, and a scrape every 15 s or
# so is cheap next to the writes that create them.
# A pull-request hold is a run that lives until its pull request is merged or closed (app.store.pr_holds):
# it is counted apart, so that a days-old hold never looks like a stuck apply.
_RUNS = f"""
SELECT status, count(*), min(created_at) FILTER (WHERE status IN {LIVE_STATUSES_SQL})
FROM apply_runs WHERE NOT info ? 'pr_hold' AND NOT info ? 'manual_hold' GROUP BY status
"""
# Manual holds (app.store.manual_holds) are counted apart too: a freeze is no stuck apply.
_MANUAL_HOLDS = f"SELECT count(*) FROM apply_runs WHERE info ? 'manual_hold' AND status IN {LIVE_STATUSES_SQL}"
_HOLDS = "SELECT count(*), min(created_at) FROM pull_request_holds"
_LOCKS = "SELECT count(*), min(locked_at) FROM states WHERE lock_id IS NOT NULL"
_WAITERS = "SELECT count(*) FROM reservation_waiters WHERE seen_at > %(fresh)s"
_STATES = "SELECT count(*) FROM states"


@dataclass(frozen=True, slots=True)
class Gauges:
    states: int
    live_reservations: int
    lapsed_reservations: int
    runs_by_status: tuple[tuple[str, int], ...]
    oldest_live_run_seconds: float
    state_locks: int
    oldest_state_lock_seconds: float
    waiters: int
    pr_holds: int = 0
    oldest_pr_hold_seconds: float = 0.0
    manual_holds: int = 0


def _age(since: datetime | None, now: datetime) -> float:
    return 0.0 if since is None else max((now - since).total_seconds(), 0.0)


def read_gauges(db: Database, *, now: datetime, waiter_fresh: datetime) -> Gauges:
    """One consistent snapshot of the counts (a single transaction)."""
    with db.transaction() as conn:
        live, lapsed = conn.execute(_RESERVATIONS, {"now": now}).fetchone() or (0, 0)
        runs = conn.execute(_RUNS).fetchall()
        locks, oldest_lock = conn.execute(_LOCKS).fetchone() or (0, None)
        (waiters,) = conn.execute(_WAITERS, {"fresh": waiter_fresh}).fetchone() or (0,)
        (state_count,) = conn.execute(_STATES).fetchone() or (0,)
        holds, oldest_hold = conn.execute(_HOLDS).fetchone() or (0, None)
        (manual,) = conn.execute(_MANUAL_HOLDS).fetchone() or (0,)
    oldest_runs = [started for _, _, started in runs if started is not None]
    return Gauges(
        states=int(state_count), live_reservations=int(live), lapsed_reservations=int(lapsed),
        runs_by_status=tuple(sorted((status, int(count)) for status, count, _ in runs)),
        oldest_live_run_seconds=_age(min(oldest_runs) if oldest_runs else None, now),
        state_locks=int(locks), oldest_state_lock_seconds=_age(oldest_lock, now), waiters=int(waiters),
        pr_holds=int(holds), oldest_pr_hold_seconds=_age(oldest_hold, now), manual_holds=int(manual),
    )
