"""Drift reports per state (table ``drift_reports``): record a check, read the latest and the history,
and the per-state counts ``/metrics`` exposes.

A report holds addresses and attribute names only. Recording serialises on the state's row, so two
checks finishing together fold their findings into ``outstanding`` one after the other.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from analyzer.globs import parse_glob
from app.domain import drift_reports as rules
from app.domain import scopes
from app.domain.principal import Principal
from app.domain.reservations import Mode
from app.errors import StateNotFoundError
from app.store import events, history, states
from app.store.db import Database

# /metrics labels drift series by state: at most this many states (the most recently checked) get their
# own series; the rest are summed under state="_other", so the series count stays bounded.
METRIC_STATES = 200

_LATEST = """
SELECT id, serial, checked_at, source, outcome, actor, run_id, globs, checked, drifted, outstanding
FROM drift_reports WHERE state_id = %s ORDER BY id DESC LIMIT %s
"""
_INSERT = """
INSERT INTO drift_reports (tenant_id, state_id, serial, checked_at, source, outcome, actor, run_id, globs, checked,
                           drifted, outstanding, outstanding_count)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
RETURNING id
"""
_COUNTS = """
SELECT s.scope, s.name, t.slug, latest.outstanding_count, checks.outcome, checks.n, latest.checked_at
FROM (SELECT DISTINCT ON (state_id) state_id, outstanding_count, checked_at
      FROM drift_reports ORDER BY state_id, id DESC) latest
JOIN states s ON s.id = latest.state_id
JOIN tenants t ON t.id = s.tenant_id
JOIN (SELECT state_id, outcome, count(*) AS n FROM drift_reports GROUP BY state_id, outcome) checks
  ON checks.state_id = latest.state_id
"""
_DRIFTED_BY_STATE = """
SELECT DISTINCT ON (r.state_id) s.name, r.outstanding_count
FROM drift_reports r JOIN states s ON s.id = r.state_id
WHERE s.tenant_id = %s AND s.scope = %s ORDER BY r.state_id, r.id DESC
"""


@dataclass(frozen=True, slots=True)
class Report:
    id: int
    state: str
    serial: int
    checked_at: datetime
    source: str
    outcome: str
    actor: str
    run_id: str | None
    globs: tuple[str, ...]
    checked: int
    found: tuple[rules.DriftEntry, ...]        # what this check found inside its globs
    drifted: tuple[rules.DriftEntry, ...]      # the state's outstanding drift after it
    # The last change Kilolock recorded for each drifted address, in words (history.describe).
    last_changes: dict[str, str] = field(default_factory=dict)

    def entry_json(self, entry: rules.DriftEntry) -> dict[str, Any]:
        return {**entry.to_json(), "last_change": self.last_changes.get(entry.address)}

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "state": self.state, "serial": self.serial, "checked_at": self.checked_at.isoformat(),
                "source": self.source, "outcome": self.outcome, "actor": self.actor, "run_id": self.run_id,
                "globs": list(self.globs), "checked": self.checked, "found": [self.entry_json(e) for e in self.found],
                "drifted": [self.entry_json(e) for e in self.drifted]}


def _with_last_changes(conn: Any, state_id: int, report: Report) -> Report:
    """``report`` naming, for each drifted instance, the last change Kilolock recorded for it."""
    addresses = [e.address for e in (*report.found, *report.drifted)]
    if not addresses:
        return report
    now = datetime.now(UTC)
    found = history.last_changes(conn, state_id=state_id, addresses=addresses)
    return replace(report, last_changes={a: history.describe(c, now) for a, c in found.items()})


def _report(state: str, row: tuple[Any, ...]) -> Report:
    rid, serial, checked_at, source, outcome, actor, run_id, globs, checked, found, outstanding = row
    return Report(int(rid), state, int(serial), checked_at, source, outcome, actor, run_id, tuple(globs),
                  int(checked), rules.entries_from_json(found), rules.entries_from_json(outstanding))


def record(db: Database, principal: Principal, name: str, submitted: rules.Submitted, *, refreshed: int,
           now: datetime) -> Report:
    """Store a check of ``name`` and fold it into the state's outstanding drift. Raises StateNotFoundError, or
    AddressScopeError when the token may not read every glob the report covers."""
    scopes.check_requested(principal.scopes, name, ((parse_glob(g), Mode.READ) for g in submitted.globs))
    with db.transaction() as conn:
        row = states.locked_row(conn, principal, name, create=False)
        if row is None:
            raise StateNotFoundError(f"no state named {name!r}")
        previous = conn.execute(_LATEST, (row.id, 1)).fetchone()
        before = rules.entries_from_json(previous[10]) if previous else ()
        after = rules.outstanding(before, submitted.globs, submitted.drifted)
        serial = submitted.serial if submitted.serial is not None else (row.current_serial or 0)
        outcome = rules.outcome(submitted, refreshed > 0)
        conn.execute(_INSERT, (
            principal.tenant_id, row.id, serial, now, submitted.source.value, outcome.value,
            submitted.actor or principal.actor, submitted.run_id, json.dumps(list(submitted.globs)), submitted.checked,
            json.dumps([e.to_json() for e in submitted.drifted]), json.dumps([e.to_json() for e in after]), len(after)))
        events.record(conn, principal, "drift_check", state_id=row.id, state_name=name, serial=serial,
                      source=submitted.source.value, outcome=outcome.value, checked=submitted.checked,
                      drifted=len(submitted.drifted), outstanding=len(after), outstanding_before=len(before),
                      run_id=submitted.run_id, addresses=[e.address for e in submitted.drifted[:200]])
        latest = conn.execute(_LATEST, (row.id, 1)).fetchone()
        assert latest is not None
        report = readable_part(principal, _report(name, latest))
        return _with_last_changes(conn, row.id, report)


def reports(db: Database, principal: Principal, name: str, *, limit: int = 1) -> list[Report]:
    """The newest ``limit`` reports of ``name``, newest first (empty when it was never checked)."""
    with db.transaction() as conn:
        row = states.find_state(conn, principal, name)
        found = conn.execute(_LATEST, (row.id, limit)).fetchall()
        return [_with_last_changes(conn, row.id, readable_part(principal, _report(name, r))) for r in found]


def readable_part(principal: Principal, report: Report) -> Report:
    """What a scoped token may see of a report: the entries and globs its read scopes cover."""
    if principal.scopes is None:
        return report
    readable = principal.scopes

    def entries(found: tuple[rules.DriftEntry, ...]) -> tuple[rules.DriftEntry, ...]:
        return tuple(e for e in found if scopes.can_read(readable, e.address))

    globs = tuple(g for g in report.globs if readable.allows(parse_glob(g), Mode.READ))
    return replace(report, globs=globs, found=entries(report.found), drifted=entries(report.drifted))


def drifted_by_state(db: Database, principal: Principal) -> dict[str, int]:
    """Outstanding drifted instances per state name of the caller's scope (never-checked states are absent)."""
    with db.transaction() as conn:
        return {str(n): int(c) for n, c in conn.execute(_DRIFTED_BY_STATE, (principal.tenant_id, principal.scope))}


@dataclass(frozen=True, slots=True)
class DriftMetrics:
    drifted: tuple[tuple[str, int], ...]              # (state label, outstanding drifted instances)
    checks: tuple[tuple[str, str, int], ...]          # (state label, outcome, checks recorded)


def _label(scope: str, name: str, tenant: str) -> str:
    where = "/".join(p for p in (tenant if tenant != "default" else "", scope) if p)
    return f"{where}/{name}" if where else name


def read_metrics(db: Database) -> DriftMetrics:
    """Per-state drift counts for /metrics, bounded to METRIC_STATES labels (the rest as ``_other``)."""
    with db.transaction() as conn:
        rows = conn.execute(_COUNTS).fetchall()
    by_state: dict[str, tuple[int, datetime, dict[str, int]]] = {}
    for scope, name, tenant, outstanding_count, outcome, n, checked_at in rows:
        label = _label(scope, name, tenant)
        _, _, outcomes = by_state.setdefault(label, (int(outstanding_count), checked_at, {}))
        outcomes[outcome] = int(n)
    ranked = sorted(by_state.items(), key=lambda item: item[1][1], reverse=True)
    drifted: dict[str, int] = {}
    checks: dict[tuple[str, str], int] = {}
    for index, (label, (count, _, outcomes)) in enumerate(ranked):
        shown = label if index < METRIC_STATES else "_other"
        drifted[shown] = drifted.get(shown, 0) + count
        for kind in rules.DriftVerdict:
            checks[(shown, kind.value)] = checks.get((shown, kind.value), 0) + outcomes.get(kind.value, 0)
    return DriftMetrics(tuple(sorted(drifted.items())), tuple(sorted((s, o, n) for (s, o), n in checks.items())))
