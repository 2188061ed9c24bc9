"""Event endpoints and their delivery records (migrations/0020_event_delivery.sql). The audit trail is the
outbox: an endpoint's cursor names the last audit row it dealt with, so events reach it in audit order and
an event committed with its change is never lost. Secrets are read only by the delivering worker.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from app.domain.outgoing import AuditRow, EndpointFilter, check_endpoint
from app.errors import BadRequestError
from app.store.db import Database

_ENDPOINT_FIELDS = "id, name, url, format, secret, states, globs, cursor_id, attempts, next_at, last_error"
_INSERT = """
INSERT INTO event_endpoints (tenant_id, name, url, format, secret, states, globs, cursor_id)
VALUES (%s, %s, %s, %s, %s, %s, %s, (SELECT coalesce(max(id), 0) FROM events))
ON CONFLICT (name) DO NOTHING RETURNING id
"""
_AFTER = """
SELECT id, tenant_id, scope, state_name, kind, actor, serial, detail, created_at
FROM events WHERE id > %s AND (%s::bigint IS NULL OR tenant_id = %s)
  AND (txid IS NULL OR txid < pg_snapshot_xmin(pg_current_snapshot())) ORDER BY id LIMIT %s
"""


@dataclass(frozen=True, slots=True)
class Endpoint:
    id: int
    name: str
    url: str
    format: str
    secret: str = field(repr=False)
    states: tuple[str, ...]
    globs: tuple[str, ...]
    cursor_id: int
    attempts: int
    next_at: datetime | None
    last_error: str | None

    @property
    def filter(self) -> EndpointFilter:
        return EndpointFilter(tuple(self.states), tuple(self.globs))

    def to_json(self) -> dict[str, object]:
        """What listings show: never the secret."""
        return {"id": self.id, "name": self.name, "url": self.url, "format": self.format,
                "states": list(self.states), "globs": list(self.globs), "cursor": self.cursor_id,
                "attempts": self.attempts, "last_error": self.last_error}


@dataclass(frozen=True, slots=True)
class EventDelivery:
    endpoint: str
    event_id: int
    status: str
    attempts: int
    last_error: str | None
    at: datetime


def _endpoint(row: tuple[object, ...]) -> Endpoint:
    eid, name, url, fmt, secret, states, globs, cursor, attempts, next_at, last_error = row
    return Endpoint(int(eid), str(name), str(url), str(fmt), str(secret), tuple(states), tuple(globs),  # type: ignore[arg-type]
                    int(cursor), int(attempts), next_at, last_error)  # type: ignore[arg-type]


def add_endpoint(db: Database, *, name: str, url: str, fmt: str = "webhook", states: Sequence[str] = (),
                 globs: Sequence[str] = (), tenant_id: int | None = None,
                 secret: str | None = None) -> tuple[Endpoint, str]:
    """Register an endpoint that receives events from now on; returns it and its signing secret (shown once)."""
    check_endpoint(url, fmt, globs)
    if not name or len(name) > 100:
        raise BadRequestError("an event endpoint needs a name of at most 100 characters")
    secret = secret or secrets.token_urlsafe(32)
    with db.transaction() as conn:
        found = conn.execute(_INSERT, (tenant_id, name, url, fmt, secret, list(states), list(globs))).fetchone()
        if found is None:
            raise BadRequestError(f"an event endpoint named {name!r} exists already")
    return get_endpoint(db, int(found[0])), secret


def get_endpoint(db: Database, endpoint_id: int) -> Endpoint:
    with db.transaction() as conn:
        row = conn.execute(f"SELECT {_ENDPOINT_FIELDS} FROM event_endpoints WHERE id = %s", (endpoint_id,)).fetchone()
    if row is None:
        raise BadRequestError(f"no event endpoint {endpoint_id}")
    return _endpoint(row)


def list_endpoints(db: Database) -> list[Endpoint]:
    with db.transaction() as conn:
        return [_endpoint(r) for r in conn.execute(f"SELECT {_ENDPOINT_FIELDS} FROM event_endpoints ORDER BY id")]


def remove_endpoint(db: Database, name: str) -> bool:
    with db.transaction() as conn:
        return conn.execute("DELETE FROM event_endpoints WHERE name = %s RETURNING id", (name,)).fetchone() is not None


def pending(db: Database, endpoint: Endpoint, tenant_id: int | None, limit: int = 100) -> list[AuditRow]:
    """The audit rows after the endpoint's cursor, oldest first; only those written by transactions older
    than any still running (ids are taken before commit, so a later id can commit first: waiting for the
    older transactions keeps the cursor from passing a row that is not visible yet)."""
    with db.transaction() as conn:
        rows = conn.execute(_AFTER, (endpoint.cursor_id, tenant_id, tenant_id, limit)).fetchall()
    return [AuditRow(int(r[0]), r[1], str(r[2]), str(r[3]), str(r[4]), str(r[5]), r[6],
                     r[7] if isinstance(r[7], dict) else json.loads(r[7]), r[8]) for r in rows]


def tenant_of(db: Database, endpoint_id: int) -> int | None:
    with db.transaction() as conn:
        row = conn.execute("SELECT tenant_id FROM event_endpoints WHERE id = %s", (endpoint_id,)).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def advance(db: Database, endpoint_id: int, event_id: int, *, status: str | None, attempts: int,
            error: str | None = None) -> None:
    """Move the cursor past ``event_id`` and, for an event that was sent or given up on, record that."""
    with db.transaction() as conn:
        conn.execute("UPDATE event_endpoints SET cursor_id = greatest(cursor_id, %s), attempts = 0, next_at = NULL, "
                     "last_error = NULL WHERE id = %s", (event_id, endpoint_id))
        if status is not None:
            conn.execute("INSERT INTO event_deliveries (endpoint_id, event_id, status, attempts, last_error) "
                         "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (endpoint_id, event_id) DO UPDATE SET "
                         "status = EXCLUDED.status, attempts = EXCLUDED.attempts, last_error = EXCLUDED.last_error, "
                         "at = now()", (endpoint_id, event_id, status, attempts, (error or "")[:500] or None))


def failed_attempt(db: Database, endpoint_id: int, attempts: int, next_at: datetime, error: str) -> None:
    with db.transaction() as conn:
        conn.execute("UPDATE event_endpoints SET attempts = %s, next_at = %s, last_error = %s WHERE id = %s",
                     (attempts, next_at, error[:500], endpoint_id))


def deliveries(db: Database, *, status: str | None = None, limit: int = 100) -> list[EventDelivery]:
    with db.transaction() as conn:
        rows = conn.execute(
            "SELECT e.name, d.event_id, d.status, d.attempts, d.last_error, d.at FROM event_deliveries d "
            "JOIN event_endpoints e ON e.id = d.endpoint_id WHERE (%s::text IS NULL OR d.status = %s) "
            "ORDER BY d.id DESC LIMIT %s", (status, status, limit)).fetchall()
    return [EventDelivery(*r) for r in rows]


def event_row(db: Database, event_id: int) -> AuditRow | None:
    with db.transaction() as conn:
        r = conn.execute("SELECT id, tenant_id, scope, state_name, kind, actor, serial, detail, created_at "
                         "FROM events WHERE id = %s", (event_id,)).fetchone()
    if r is None:
        return None
    return AuditRow(int(r[0]), r[1], str(r[2]), str(r[3]), str(r[4]), str(r[5]), r[6], r[7], r[8])
