"""Per-app services and the per-request principal, for the views."""

from __future__ import annotations

from dataclasses import dataclass

from flask import current_app, g, request

from app.config import Settings
from app.domain.principal import Principal
from app.store import Database
from app.web.auth import authenticate, resolve_state_path


@dataclass(frozen=True, slots=True)
class Services:
    settings: Settings
    db: Database


def services() -> Services:
    found: Services = current_app.extensions["kilolock"]
    return found


def principal() -> Principal:
    """The authenticated caller, computed once per request (401/403 raised from here)."""
    if "principal" not in g:
        g.principal = authenticate(request, services().settings, services().db)
    who: Principal = g.principal
    return who


def state_name(raw: str) -> str:
    """The state a request path names, within the authenticated caller's scope."""
    return resolve_state_path(raw, principal())
