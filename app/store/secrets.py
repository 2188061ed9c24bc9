"""Secrets the service keeps for itself: generated once, on first use, and shared through the database
by every process and host that serves it. Values never leave this module except to the caller that
signs with them, and are never logged."""

from __future__ import annotations

import secrets

from app.store.db import Database

SESSION_SECRET = "dashboard_session"

_INSERT = "INSERT INTO server_secrets (name, value) VALUES (%s, %s) ON CONFLICT (name) DO NOTHING"
_SELECT = "SELECT value FROM server_secrets WHERE name = %s"


def shared_secret(db: Database, name: str) -> str:
    """The secret called ``name``, created now (48 random bytes, URL-safe) if no process created it yet.
    Two processes starting at once agree: the first insert wins and both read it back."""
    with db.transaction() as conn:
        conn.execute(_INSERT, (name, secrets.token_urlsafe(48)))
        row = conn.execute(_SELECT, (name,)).fetchone()
    assert row is not None  # inserted or already there, in this same transaction
    return str(row[0])
