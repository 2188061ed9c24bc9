"""The audit trail: one row per mutation, lock, unlock and force-unlock. Reads record nothing."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import class_row

from app.domain.principal import Principal
from app.domain.scopes import readable_event
from app.store.db import Database

_INSERT = """
INSERT INTO events (tenant_id, scope, state_id, state_name, kind, actor, serial, lock_id, detail)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
"""
_LIST = """
SELECT id, state_name, kind, actor, serial, lock_id, detail, created_at
FROM events
WHERE tenant_id = %s AND scope = %s AND (%s::text IS NULL OR state_name = %s)
ORDER BY id DESC
LIMIT %s
"""


@dataclass(frozen=True, slots=True)
class Event:
    id: int
    state_name: str
    kind: str
    actor: str
    serial: int | None
    lock_id: str | None
    detail: dict[str, Any]
    created_at: datetime


def record(
    conn: psycopg.Connection,
    principal: Principal,
    kind: str,
    *,
    state_id: int | None,
    state_name: str,
    serial: int | None = None,
    lock_id: str | None = None,
    **detail: Any,
) -> None:
    """Append an audit event inside the caller's transaction (so it commits with the change)."""
    if principal.token_name:
        detail.setdefault("token", principal.token_name)
    conn.execute(
        _INSERT,
        (principal.tenant_id or None, principal.scope, state_id, state_name, kind, principal.actor, serial, lock_id,
         json.dumps(detail)),
    )


def record_refused(db: Database, principal: Principal, kind: str, *, state_name: str, **detail: Any) -> None:
    """Audit a refused request in a transaction of its own: the request's own transaction rolled back, so
    the refusal is the only row it leaves."""
    with db.transaction() as conn:
        record(conn, principal, kind, state_id=None, state_name=state_name, **detail)


def record_alone(db: Database, principal: Principal, kind: str, *, state_name: str, **detail: Any) -> None:
    """Audit something that changes no row of its own (a bot job starting or ending) in its own transaction."""
    record_refused(db, principal, kind, state_name=state_name, **detail)


def list_events(
    conn: psycopg.Connection, principal: Principal, state_name: str | None = None, limit: int = 100
) -> list[Event]:
    """The newest events; a token with address scopes sees only those whose addresses it may read."""
    with conn.cursor(row_factory=class_row(Event)) as cur:
        found = cur.execute(_LIST, (principal.tenant_id, principal.scope, state_name, state_name, limit)).fetchall()
    return [e for e in found if readable_event(principal.scopes, e.detail)]
