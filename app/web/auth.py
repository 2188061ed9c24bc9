"""Request authentication: credentials in, a Principal out, for the three auth modes.

Secrets are compared in constant time (static mode) or found by their SHA-256 hash (database
mode), and never logged or echoed in errors. Failed attempts are throttled per client address (and
per token when the refused credential names one): past ``KL_AUTH_FAILURE_LIMIT`` failures in a
``KL_AUTH_FAILURE_WINDOW`` the caller gets 429 with Retry-After before anything is checked. They
are audited without the secret, once per key and window (``app.store.throttle``).
"""

from __future__ import annotations

import base64
import binascii
import hmac
from dataclasses import dataclass
from datetime import UTC, datetime

from flask import Request

from app.config import AuthMode, Settings
from app.domain.names import split_scoped_path
from app.domain.principal import Principal, default_principal
from app.domain.scopes import scope_set
from app.domain.throttle import client_address, parse_networks
from app.errors import AuthThrottledError, ForbiddenError, InvalidStateNameError, UnauthorizedError
from app.store import Database, tenancy, throttle

# The Basic username becomes the recorded actor in open and static mode.
MAX_USERNAME = 200


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
        if len(username) > MAX_USERNAME or any(not ch.isprintable() for ch in username):
            raise UnauthorizedError(f"malformed Basic credentials: the username must be at most {MAX_USERNAME} "
                                    "printable characters")
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
    keys = [f"addr:{remote_address(request, settings)}"]
    check_throttle(db, settings, keys)
    if settings.auth_mode is AuthMode.STATIC:
        expected = (settings.auth_token or "").encode()
        if not hmac.compare_digest(creds.secret.encode(), expected):
            refuse(db, settings, request, keys, creds.username, "invalid static token")
        return default_principal(actor=creds.username or "static-token")
    token = tenancy.authenticate(db, creds.secret)
    if token is None:
        refuse(db, settings, request, keys, creds.username, "unknown or revoked token")
    assert token is not None
    token_key = f"token:{token.id}"
    check_throttle(db, settings, [token_key])
    if creds.scheme == "basic" and not hmac.compare_digest(creds.username.encode(), token.workspace_id.encode()):
        refuse(db, settings, request, [*keys, token_key], creds.username, "username is not the token's workspace id",
               hint="set username to the token's workspace id (ws_...)")
    return Principal.for_token(tenant_id=token.tenant_id, name=token.name, scope=token.scope, token_id=token.id,
                               scopes=scope_set(tuple(token.scopes)))


def remote_address(request: Request, settings: Settings) -> str:
    """The client's address: the TCP peer, or what trusted proxies (KL_TRUSTED_PROXIES) forwarded."""
    return client_address(request.remote_addr or "", request.headers.get("X-Forwarded-For"),
                          parse_networks(settings.trusted_proxies))


def _throttled(wait: int) -> AuthThrottledError:
    return AuthThrottledError(f"too many failed authentications from this client: retry in {wait} s with a valid "
                              "token (an operator can raise KL_AUTH_FAILURE_LIMIT)", retry_after=wait)


def check_throttle(db: Database, settings: Settings, keys: list[str]) -> None:
    """429 when any key has used up its failures in the current window."""
    wait = throttle.blocked_for(db, keys, datetime.now(UTC), limit=settings.auth_failure_limit,
                                window=settings.auth_failure_window)
    if wait:
        raise _throttled(wait)


def refuse(db: Database, settings: Settings, request: Request, keys: list[str], username: str, reason: str,
           hint: str = "") -> None:
    """Count and (aggregated) audit a failure, then refuse: 403, or 429 once the limit is reached."""
    wait = throttle.record_failure(db, keys, datetime.now(UTC), limit=settings.auth_failure_limit,
                                   window=settings.auth_failure_window, reason=reason, username=username,
                                   path=request.path, remote=request.remote_addr or "")
    if wait:
        raise _throttled(wait)
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
