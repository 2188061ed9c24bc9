"""The failed-authentication counters (``auth_throttle``) and their aggregated audit events."""

from __future__ import annotations

from datetime import datetime, timedelta

from app.domain.principal import Principal
from app.domain.throttle import Counter, Verdict, after_failure, retry_after
from app.store import events
from app.store.db import Database

_GET = "SELECT window_started, failures FROM auth_throttle WHERE key = ANY(%s)"
_GET_ONE_FOR_UPDATE = "SELECT window_started, failures FROM auth_throttle WHERE key = %s FOR UPDATE"
_ENSURE = """
INSERT INTO auth_throttle (key, window_started, failures) VALUES (%s, %s, 0) ON CONFLICT (key) DO NOTHING
"""
_SET = "UPDATE auth_throttle SET window_started = %s, failures = %s, updated_at = %s WHERE key = %s"
_PRUNE = "DELETE FROM auth_throttle WHERE updated_at < %s"


def blocked_for(db: Database, keys: list[str], now: datetime, *, limit: int, window: int) -> int | None:
    """Seconds until every key may try again (the longest wait), or None when none is blocked."""
    with db.transaction() as conn:
        rows = conn.execute(_GET, (keys,)).fetchall()
    waits = [w for w in (retry_after(Counter(*row), now, limit=limit, window=window) for row in rows) if w]
    return max(waits) if waits else None


def record_failure(db: Database, keys: list[str], now: datetime, *, limit: int, window: int, reason: str,
                   username: str, path: str, remote: str) -> int | None:
    """Count a failure against every key; audit it when the rules say so. Returns the Retry-After
    seconds when a key is now blocked, else None. The presented secret is never recorded."""
    wait: int | None = None
    with db.transaction() as conn:
        for key in keys:
            conn.execute(_ENSURE, (key, now))
            row = conn.execute(_GET_ONE_FOR_UPDATE, (key,)).fetchone()
            current = Counter(*row) if row and row[1] else None
            verdict: Verdict = after_failure(current, now, limit=limit, window=window)
            conn.execute(_SET, (verdict.counter.window_started, verdict.counter.failures, now, key))
            if verdict.audit:
                detail: dict[str, object] = {"reason": reason, "path": path[:300], "remote": remote, "key": key,
                                             "window_seconds": window}
                if verdict.previous_failures:
                    detail["previous_window_failures"] = verdict.previous_failures
                kind = "auth_throttled" if verdict.blocked else "auth_failed"
                events.record(conn, Principal(tenant_id=0, actor=username[:100] or "anonymous"), kind,
                              state_id=None, state_name="", **detail)
            if verdict.blocked:
                wait = max(wait or 0, verdict.retry_after)
        conn.execute(_PRUNE, (now - timedelta(seconds=window * 10),))  # counters that can block no one
    return wait


def prune(db: Database, before: datetime) -> int:
    """Forget counters untouched since ``before`` (they can no longer block anyone)."""
    with db.transaction() as conn:
        return conn.execute(_PRUNE, (before,)).rowcount
