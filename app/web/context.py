"""Per-app services and the per-request principal, for the views."""

from __future__ import annotations

from dataclasses import dataclass, replace

from flask import current_app, g, request

from app.config import AuthMode, Settings
from app.domain.principal import Principal
from app.store import Database
from app.web.auth import authenticate, resolve_state_path
from app.web.splicebases import Builder
from app.web.upkeep import Upkeep


@dataclass(frozen=True, slots=True)
class Services:
    settings: Settings
    db: Database
    splice_bases: Builder | None = None  # None: KL_SPLICE_BASE_BYTES is 0
    upkeep: Upkeep | None = None  # None: bulk writes refresh the statistics before they answer


def services() -> Services:
    found: Services = current_app.extensions["kilolock"]
    return found


def principal() -> Principal:
    """The authenticated caller, computed once per request (401/403 raised from here)."""
    if "principal" not in g:
        g.principal = _declared_name(authenticate(request, services().settings, services().db))
    who: Principal = g.principal
    return who


_DECLARED_MAX_BODY = 64 * 1024


def _declared_name(who: Principal) -> Principal:
    """Open mode authenticates no one, so the audit trail would say "anonymous" for every run: a small
    apply-run request that names its ``actor`` or ``holder`` is recorded under that (self-declared) name."""
    if services().settings.auth_mode is not AuthMode.OPEN or who.actor != "anonymous":
        return who
    if request.blueprint != "runs" or not request.is_json or (request.content_length or 0) > _DECLARED_MAX_BODY:
        return who
    body = request.get_json(silent=True)
    name = (body.get("actor") or body.get("holder")) if isinstance(body, dict) else None
    if isinstance(name, str) and 0 < len(name) <= 200 and name.isprintable():
        return replace(who, actor=name)
    return who


def state_name(raw: str) -> str:
    """The state a request path names, within the authenticated caller's scope."""
    return resolve_state_path(raw, principal())
