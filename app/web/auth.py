"""Request authentication for the open and static modes: credentials in, a Principal out.

Secrets are compared in constant time and never logged or echoed in errors.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from dataclasses import dataclass

from flask import Request

from app.config import AuthMode, Settings
from app.domain.principal import Principal, default_principal
from app.errors import ForbiddenError, UnauthorizedError


@dataclass(frozen=True, slots=True)
class Credentials:
    username: str
    secret: str


def credentials_of(request: Request) -> Credentials | None:
    """Basic (username, password) or Bearer (token) credentials, or None when absent."""
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer" and value:
        return Credentials(username="", secret=value)
    if scheme.lower() == "basic" and value:
        try:
            decoded = base64.b64decode(value, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise UnauthorizedError("malformed Basic credentials") from exc
        username, _, password = decoded.partition(":")
        return Credentials(username=username, secret=password)
    return None


def authenticate(request: Request, settings: Settings) -> Principal:
    """Who is calling. Raises UnauthorizedError (401, no credentials) or ForbiddenError (403)."""
    creds = credentials_of(request)
    if settings.auth_mode is AuthMode.OPEN:
        return default_principal(actor=(creds.username if creds and creds.username else "anonymous"))
    if settings.auth_mode is AuthMode.STATIC:
        if creds is None or not creds.secret:
            raise UnauthorizedError(
                "credentials required: set password in the backend block (or TF_HTTP_PASSWORD), "
                "or send Authorization: Bearer <token>"
            )
        expected = (settings.auth_token or "").encode()
        if not hmac.compare_digest(creds.secret.encode(), expected):
            raise ForbiddenError("invalid credentials")
        return default_principal(actor=creds.username or "static-token")
    raise ForbiddenError("this server's auth mode does not accept these credentials")
