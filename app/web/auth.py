"""Request authentication: credentials in, a Principal out, for the three auth modes.

Secrets are compared in constant time (static mode) or found by their SHA-256 hash (database
mode), and never logged or echoed in errors. Failed attempts are audited without the secret.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from dataclasses import dataclass

from flask import Request

from app.config import AuthMode, Settings
from app.domain.names import split_scoped_path
from app.domain.principal import Principal, default_principal
from app.errors import ForbiddenError, InvalidStateNameError, UnauthorizedError
from app.store import Database, tenancy


@dataclass(frozen=True, slots=True)
class Credentials:
    username: str
    secret: str
    scheme: str


def credentials_of(request: Request) -> Credentials | None:
    """Basic (username, password) or Bearer (token) credentials, or None when absent."""
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer" and value:
        return Credentials(username="", secret=value, scheme="bearer")
    if scheme.lower() == "basic" and value:
        try:
            decoded = base64.b64decode(value, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise UnauthorizedError("malformed Basic credentials") from exc
        username, _, password = decoded.partition(":")
        return Credentials(username=username, secret=password, scheme="basic")
    return None


_MISSING = ("credentials required: set password in the backend block (or TF_HTTP_PASSWORD), "
            "or send Authorization: Bearer <token>")


def authenticate(request: Request, settings: Settings, db: Database) -> Principal:
    """Who is calling. Raises UnauthorizedError (401, no credentials) or ForbiddenError (403)."""
    return principal_for(credentials_of(request), request, settings, db)


def principal_for(creds: Credentials | None, request: Request, settings: Settings, db: Database) -> Principal:
    """The principal these credentials stand for (the dashboard's login form builds them from a
    token field). Raises like ``authenticate``; refusals are audited with the request's path."""
    if settings.auth_mode is AuthMode.OPEN:
        return default_principal(actor=(creds.username if creds and creds.username else "anonymous"))
    if creds is None or not creds.secret:
        raise UnauthorizedError(_MISSING)
    if settings.auth_mode is AuthMode.STATIC:
        expected = (settings.auth_token or "").encode()
        if not hmac.compare_digest(creds.secret.encode(), expected):
            _refuse(db, request, creds, "invalid static token")
        return default_principal(actor=creds.username or "static-token")
    token = tenancy.authenticate(db, creds.secret)
    if token is None:
        _refuse(db, request, creds, "unknown or revoked token")
    assert token is not None
    if creds.scheme == "basic" and not hmac.compare_digest(creds.username.encode(), token.workspace_id.encode()):
        _refuse(db, request, creds, "username is not the token's workspace id",
                hint="set username to the token's workspace id (ws_...)")
    return Principal.for_token(tenant_id=token.tenant_id, name=token.name, scope=token.scope, token_id=token.id)


def _refuse(db: Database, request: Request, creds: Credentials, reason: str, hint: str = "") -> None:
    tenancy.record_auth_failure(db, reason=reason, username=creds.username, path=request.path,
                                remote=request.remote_addr or "")
    raise ForbiddenError("invalid credentials" + (f": {hint}" if hint else ""))


def resolve_state_path(raw: str, who: Principal) -> str:
    """The state name a request path names, checked against the caller's scope: a scoped path
    (``ws_…/env_…/name``) must be the token's own; a plain name lives in the token's scope."""
    scope, name = split_scoped_path(raw)
    if scope is None:
        return name
    if not who.scope:
        raise InvalidStateNameError(
            f"{raw!r} is a workspace/environment path, which needs KL_AUTH_MODE=database; use /v1/states/{name}"
        )
    if not hmac.compare_digest(scope.encode(), who.scope.encode()):
        raise ForbiddenError(f"this token belongs to {who.scope}, not {scope}")
    return name
