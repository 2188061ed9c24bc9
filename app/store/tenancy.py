"""Tenants, workspaces, environments and API tokens; token authentication.

Token secrets are shown once, at creation, and stored only as SHA-256 hashes: a lookup hashes the
presented secret and finds the row by hash, so no secret is ever compared or kept in clear.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg.rows import class_row

from app.domain.principal import Principal
from app.domain.scopes import PLAN_ONLY, ScopeError, parse_scopes
from app.errors import BadRequestError, ConflictError, NotFoundError
from app.store import events
from app.store.db import Database

_SLUG = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")

_INSERT_TENANT = "INSERT INTO tenants (slug, name) VALUES (%s, %s) ON CONFLICT (slug) DO NOTHING RETURNING id"
_TENANT = "SELECT id, slug, name, created_at FROM tenants WHERE slug = %s"
_TENANT_BY_ID = "SELECT id, slug, name, created_at FROM tenants WHERE id = %s"
_TENANTS = "SELECT id, slug, name, created_at FROM tenants ORDER BY slug"
_ENSURE_WORKSPACE = """
INSERT INTO workspaces (tenant_id, public_id, name) VALUES (%s, %s, %s)
ON CONFLICT (tenant_id, name) DO NOTHING
"""
_WORKSPACE = "SELECT id, public_id FROM workspaces WHERE tenant_id = %s AND name = %s"
_ENSURE_ENVIRONMENT = """
INSERT INTO environments (tenant_id, workspace_id, public_id, name) VALUES (%s, %s, %s, %s)
ON CONFLICT (workspace_id, name) DO NOTHING
"""
_ENVIRONMENT = "SELECT id, public_id FROM environments WHERE workspace_id = %s AND name = %s"
_INSERT_TOKEN = """
INSERT INTO api_tokens (public_id, tenant_id, environment_id, name, token_hash, created_by, scopes)
VALUES (%s, %s, %s, %s, %s, %s, %s)
"""
_SET_SCOPES = "UPDATE api_tokens SET scopes = %s WHERE tenant_id = %s AND public_id = %s"
_TOKEN_FIELDS = """
t.public_id AS id, t.name, w.name AS workspace, w.public_id AS workspace_id, e.name AS environment,
e.public_id AS environment_id, t.created_at, t.last_used_at, t.revoked_at, t.scopes
FROM api_tokens t JOIN environments e ON e.id = t.environment_id JOIN workspaces w ON w.id = e.workspace_id
"""
_TOKENS = f"SELECT {_TOKEN_FIELDS} WHERE t.tenant_id = %s ORDER BY t.created_at, t.id"
_TOKEN = f"SELECT {_TOKEN_FIELDS} WHERE t.tenant_id = %s AND t.public_id = %s"
_REVOKE = "UPDATE api_tokens SET revoked_at = now() WHERE tenant_id = %s AND public_id = %s AND revoked_at IS NULL"
_AUTHENTICATE = """
SELECT t.id, t.tenant_id, t.name, w.public_id AS workspace_id, e.public_id AS environment_id, t.scopes
FROM api_tokens t JOIN environments e ON e.id = t.environment_id JOIN workspaces w ON w.id = e.workspace_id
WHERE t.token_hash = %s AND t.revoked_at IS NULL
"""
# Recording last use on every request would make each read a write; once a minute is enough.
_TOUCH = """
UPDATE api_tokens SET last_used_at = now()
WHERE id = %s AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute')
"""


@dataclass(frozen=True, slots=True)
class Tenant:
    id: int
    slug: str
    name: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """A token as listed: never the secret."""

    id: str
    name: str
    workspace: str
    workspace_id: str
    environment: str
    environment_id: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None
    scopes: list[str]  # address scopes 'GLOB:MODE'; empty: the whole state


@dataclass(frozen=True, slots=True)
class AuthenticatedToken:
    id: int
    tenant_id: int
    name: str
    workspace_id: str
    environment_id: str
    scopes: list[str]

    @property
    def scope(self) -> str:
        return f"{self.workspace_id}/{self.environment_id}"


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _check(pattern: re.Pattern[str], value: object, what: str, hint: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise BadRequestError(f"invalid {what} {value!r}: {hint}")
    return value


def _tenant(conn: psycopg.Connection, slug: str) -> Tenant:
    with conn.cursor(row_factory=class_row(Tenant)) as cur:
        found = cur.execute(_TENANT, (slug,)).fetchone()
    if found is None:
        raise NotFoundError(f"no tenant {slug!r}: create it first (kl tenants create {slug})")
    return found


def create_tenant(db: Database, slug: str, name: str, *, actor: str) -> Tenant:
    slug = _check(_SLUG, slug, "tenant slug", "use 1-63 lowercase letters, digits and dashes")
    if not isinstance(name, str) or not name.strip():
        name = slug
    with db.transaction() as conn:
        created = conn.execute(_INSERT_TENANT, (slug, name.strip()[:200])).fetchone()
        if created is None:
            raise ConflictError(f"tenant {slug!r} already exists")
        tenant = _tenant(conn, slug)
        events.record(conn, Principal(tenant_id=tenant.id, actor=actor), "tenant_create", state_id=None,
                      state_name="", slug=slug)
    return tenant


def tenant_by_id(db: Database, tenant_id: int) -> Tenant:
    with db.transaction() as conn, conn.cursor(row_factory=class_row(Tenant)) as cur:
        found = cur.execute(_TENANT_BY_ID, (tenant_id,)).fetchone()
    if found is None:
        raise NotFoundError(f"no tenant with id {tenant_id}")
    return found


def list_tenants(db: Database) -> list[Tenant]:
    with db.transaction() as conn, conn.cursor(row_factory=class_row(Tenant)) as cur:
        return cur.execute(_TENANTS).fetchall()


def checked_scopes(scopes: object) -> list[str]:
    """Address scopes from a request or the command line, validated and canonical; BadRequestError names a bad one."""
    if scopes is None:
        return []
    if not isinstance(scopes, list | tuple):
        raise BadRequestError('scopes must be a list of "GLOB:read" or "GLOB:write" strings')
    try:
        return list(parse_scopes(scopes))
    except ScopeError as exc:
        raise BadRequestError(str(exc)) from exc


def requested_scopes(scopes: object, plan_only: object) -> object:
    """What a request asks for: its ``scopes`` (a list of 'GLOB:MODE'), or ``plan_only`` for the preset '*:read'."""
    if not isinstance(plan_only, bool):
        raise BadRequestError("plan_only must be true or false")
    if plan_only and scopes:
        raise BadRequestError("give scopes or plan_only, not both (plan_only is the scope '*:read')")
    return list(PLAN_ONLY) if plan_only else scopes


def create_token(
    db: Database, slug: str, *, name: str, environment: str, workspace: str = "default", actor: str,
    scopes: object = None,
) -> tuple[str, TokenInfo]:
    """Create a token for one environment (creating the workspace and environment on first use), with
    address scopes (none: the whole state). Returns the secret — the only time it exists outside the
    caller's hands — and the listing."""
    name = _check(_NAME, name, "token name", "use letters, digits, '.', '_' and '-'")
    scope_texts = checked_scopes(scopes)
    environment = _check(_NAME, environment, "environment", "use letters, digits, '.', '_' and '-'")
    workspace = _check(_NAME, workspace, "workspace", "use letters, digits, '.', '_' and '-'")
    secret = "kl_" + secrets.token_urlsafe(32)
    public_id = "tok_" + secrets.token_hex(8)
    with db.transaction() as conn:
        tenant = _tenant(conn, slug)
        conn.execute(_ENSURE_WORKSPACE, (tenant.id, "ws_" + secrets.token_hex(6), workspace))
        workspace_row = conn.execute(_WORKSPACE, (tenant.id, workspace)).fetchone()
        assert workspace_row is not None
        conn.execute(_ENSURE_ENVIRONMENT, (tenant.id, workspace_row[0], "env_" + secrets.token_hex(6), environment))
        env_row = conn.execute(_ENVIRONMENT, (workspace_row[0], environment)).fetchone()
        assert env_row is not None
        conn.execute(_INSERT_TOKEN, (public_id, tenant.id, env_row[0], name, hash_secret(secret), actor,
                                     scope_texts))
        principal = Principal(tenant_id=tenant.id, actor=actor, scope=f"{workspace_row[1]}/{env_row[1]}")
        events.record(conn, principal, "token_create", state_id=None, state_name="", token_id=public_id,
                      token_name=name, environment=environment, workspace=workspace, scopes=scope_texts)
        return secret, _token_of(conn, tenant.id, slug, public_id)


def list_tokens(db: Database, slug: str) -> list[TokenInfo]:
    with db.transaction() as conn:
        tenant = _tenant(conn, slug)
        with conn.cursor(row_factory=class_row(TokenInfo)) as cur:
            return cur.execute(_TOKENS, (tenant.id,)).fetchall()


def get_token(db: Database, slug: str, token_id: str) -> TokenInfo:
    with db.transaction() as conn:
        return _token_of(conn, _tenant(conn, slug).id, slug, token_id)


def _token_of(conn: psycopg.Connection, tenant_id: int, slug: str, token_id: str) -> TokenInfo:
    with conn.cursor(row_factory=class_row(TokenInfo)) as cur:
        info = cur.execute(_TOKEN, (tenant_id, token_id)).fetchone()
    if info is None:
        raise NotFoundError(f"tenant {slug!r} has no token {token_id!r}: list them with kl tokens list {slug}")
    return info


def revoke_token(db: Database, slug: str, token_id: str, *, actor: str) -> TokenInfo:
    """Revoke a token; it stops working on the next request. Revoking twice is harmless."""
    with db.transaction() as conn:
        tenant = _tenant(conn, slug)
        info = _token_of(conn, tenant.id, slug, token_id)
        if conn.execute(_REVOKE, (tenant.id, token_id)).rowcount:
            events.record(conn, Principal(tenant_id=tenant.id, actor=actor, scope=f"{info.workspace_id}/"
                                          f"{info.environment_id}"),
                          "token_revoke", state_id=None, state_name="", token_id=token_id, token_name=info.name)
        return _token_of(conn, tenant.id, slug, token_id)


def set_token_scopes(db: Database, slug: str, token_id: str, scopes: object, *, actor: str) -> TokenInfo:
    """Replace a token's address scopes (an empty list: the whole state again); audited with both lists.
    The next request of the token is checked against the new scopes."""
    scope_texts = checked_scopes(scopes)
    with db.transaction() as conn:
        tenant = _tenant(conn, slug)
        info = _token_of(conn, tenant.id, slug, token_id)
        conn.execute(_SET_SCOPES, (scope_texts, tenant.id, token_id))
        events.record(conn, Principal(tenant_id=tenant.id, actor=actor,
                                      scope=f"{info.workspace_id}/{info.environment_id}"),
                      "token_scopes", state_id=None, state_name="", token_id=token_id, token_name=info.name,
                      before=list(info.scopes), after=scope_texts)
        return _token_of(conn, tenant.id, slug, token_id)


def authenticate(db: Database, secret: str) -> AuthenticatedToken | None:
    """The active token whose hash matches the secret, or None (unknown or revoked)."""
    with db.transaction() as conn:
        with conn.cursor(row_factory=class_row(AuthenticatedToken)) as cur:
            found = cur.execute(_AUTHENTICATE, (hash_secret(secret),)).fetchone()
        if found is not None:
            conn.execute(_TOUCH, (found.id,))
    return found
