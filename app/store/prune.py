"""Retention: removing the raw bytes of old state versions, never their rows.

A state's history is its lifecycle rows, its outputs and its version rows; the raw bytes of each version
are a copy Terraform's GET needs only for the head. ``prune`` empties ``raw_state`` of versions that are
beyond the newest ``keep_versions`` of their state and older than ``keep_age`` (either rule alone when
only one is set), and marks them ``pruned_at``. It never touches:

- the head of a state (what Terraform's GET serves and its next POST is compared against);
- the version every live apply run's base serial resolves to (what its commit and plan read);
- a version that holds no bytes (an apply version never read, or one already pruned).

A pruned version's splice base (``state_version_bases``, the assembly of a version Terraform wrote) is
removed with its bytes.

Rows, outputs, ``sha256`` and ``size_bytes`` stay, so ``kl state ls --serial N``, history and the
``assembled`` view work for every serial afterwards (``app.store.assembly`` rebuilds pruned apply versions
from the rows without caching them again).

Each state is pruned in short transactions of at most ``BATCH`` versions under the state's row lock (the
lock that opening a run takes), so a run opening on an old base at the same moment either sees its base
kept or was opened first and protects it. Pruning is idempotent: two processes pruning at once only
repeat each other's no-ops.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from app.store.db import LIVE_STATUSES_SQL, Database

BATCH = 50

_STATES = "SELECT id FROM states ORDER BY id"
_LOCK_STATE = "SELECT head_version_id FROM states WHERE id = %s FOR UPDATE"
# The version a run's base serial resolves to is the newest at or below it (states.version_at).
_CANDIDATES = f"""
WITH ranked AS (
    SELECT v.id, v.serial, v.created_at, coalesce(v.size_bytes, 0) AS size_bytes,
           v.raw_state IS NOT NULL AS has_bytes,
           row_number() OVER (ORDER BY v.serial DESC) AS newest
    FROM state_versions v WHERE v.state_id = %(state)s
), protected AS (
    SELECT (SELECT w.id FROM state_versions w
            WHERE w.state_id = %(state)s AND w.serial <= a.base_serial ORDER BY w.serial DESC LIMIT 1) AS id
    FROM apply_runs a
    WHERE a.state_id = %(state)s AND a.status IN {LIVE_STATUSES_SQL} AND a.base_serial IS NOT NULL
)
SELECT r.id, r.size_bytes FROM ranked r
WHERE r.has_bytes AND r.id <> %(head)s
  AND (%(keep)s::bigint IS NULL OR r.newest > %(keep)s)
  AND (%(before)s::timestamptz IS NULL OR r.created_at < %(before)s)
  AND r.id NOT IN (SELECT id FROM protected WHERE id IS NOT NULL)
ORDER BY r.serial
LIMIT %(batch)s
"""
_PRUNE = """
UPDATE state_versions SET raw_state = NULL, pruned_at = now()
WHERE id = ANY(%s) AND raw_state IS NOT NULL
"""
# A pruned version's splice base goes with its bytes (``app.store.splicebase``).
_PRUNE_BASES = "DELETE FROM state_version_bases WHERE version_id = ANY(%s)"


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """Which versions keep their bytes: the newest ``keep_versions`` of each state, and every version
    younger than ``keep_age``. None switches a rule off; with both off nothing is pruned."""

    keep_versions: int | None = None
    keep_age: timedelta | None = None

    @property
    def enabled(self) -> bool:
        return self.keep_versions is not None or self.keep_age is not None

    def describe(self) -> str:
        parts = []
        if self.keep_versions is not None:
            parts.append(f"beyond the newest {self.keep_versions} per state")
        if self.keep_age is not None:
            parts.append(f"older than {self.keep_age.days} days" if self.keep_age.days else
                         f"older than {int(self.keep_age.total_seconds())} seconds")
        return " and ".join(parts) if parts else "nothing (retention is off)"


@dataclass(frozen=True, slots=True)
class PruneReport:
    states: int  # states that had versions pruned
    versions: int
    bytes: int  # raw bytes removed (as stored before compression)
    dry_run: bool


def prune(db: Database, policy: RetentionPolicy, *, dry_run: bool = False, now: datetime | None = None) -> PruneReport:
    """Remove the raw bytes of the versions ``policy`` no longer keeps, in every state of every tenant."""
    if not policy.enabled:
        return PruneReport(0, 0, 0, dry_run)
    before = None if policy.keep_age is None else (now or datetime.now(UTC)) - policy.keep_age
    with db.transaction() as conn:
        state_ids = [row[0] for row in conn.execute(_STATES)]
    touched = versions = removed = 0
    for state_id in state_ids:
        count, size = _prune_state(db, state_id, policy.keep_versions, before, dry_run)
        touched += 1 if count else 0
        versions += count
        removed += size
    return PruneReport(touched, versions, removed, dry_run)


def _prune_state(db: Database, state_id: int, keep: int | None, before: datetime | None,
                 dry_run: bool) -> tuple[int, int]:
    count = size = 0
    while True:
        with db.transaction() as conn:
            head = conn.execute(_LOCK_STATE, (state_id,)).fetchone()
            if head is None:  # deleted meanwhile
                return count, size
            found = conn.execute(_CANDIDATES, {"state": state_id, "head": head[0] or 0, "keep": keep,
                                               "before": before, "batch": BATCH}).fetchall()
            if not found:
                return count, size
            if dry_run:
                # Without writing, the next batch would be this one again: report everything in one pass.
                rest = conn.execute(_CANDIDATES, {"state": state_id, "head": head[0] or 0, "keep": keep,
                                                  "before": before, "batch": None}).fetchall()
                return len(rest), sum(s for _, s in rest)
            conn.execute(_PRUNE, ([i for i, _ in found],))
            conn.execute(_PRUNE_BASES, ([i for i, _ in found],))
        count += len(found)
        size += sum(s for _, s in found)
