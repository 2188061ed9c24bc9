"""The control API /v1/api: tenants and tokens, for operators, behind KL_CONTROL_TOKEN.

Served by the main app, or alone on its own listener (``kl serve --control-port``) so it can be
kept off the public network.
"""

from __future__ import annotations

import hmac
from typing import TypeVar

from flask import Blueprint, Response, jsonify, request

from app.config import AuthMode
from app.domain.backend_blocks import scoped_backend_block
from app.errors import BadRequestError, ForbiddenError, UnauthorizedError
from app.store import tenancy
from app.web import bodies, inputs
from app.web.auth import check_throttle, credentials_of, refuse, remote_address
from app.web.context import services
from app.wiremodels import Wire

W = TypeVar("W", bound=Wire)
bp = Blueprint("control", __name__, url_prefix="/v1/api")


def require_control_mode() -> None:
    """Token management exists only in database mode with KL_CONTROL_TOKEN set (the API and the dashboard)."""
    settings = services().settings
    if settings.auth_mode is not AuthMode.DATABASE or not settings.control_token:
        raise ForbiddenError("the control API needs KL_AUTH_MODE=database and KL_CONTROL_TOKEN")


def check_control_token(secret: str, username: str = "") -> None:
    """The one check of an operator's credential: KL_CONTROL_TOKEN, compared in constant time, with failures
    throttled and audited like any refused credential."""
    require_control_mode()
    settings = services().settings
    if not secret:
        raise UnauthorizedError("control token required: Authorization: Bearer $KL_CONTROL_TOKEN")
    keys = [f"addr:{remote_address(request, settings)}"]
    check_throttle(services().db, settings, keys)
    if not hmac.compare_digest(secret.encode(), str(settings.control_token).encode()):
        refuse(services().db, settings, request, keys, username, "invalid control token")


@bp.before_request
def _require_control_token() -> None:
    creds = credentials_of(request)
    check_control_token(creds.secret if creds else "", creds.username if creds else "")


def _body(model: type[W]) -> W:
    return inputs.body_as(model, request.get_json(force=True, silent=True))


def public_base_url() -> str:
    configured = services().settings.public_url
    return (configured or request.host_url).rstrip("/")


@bp.post("/tenants")
def create_tenant() -> tuple[Response, int]:
    body = _body(bodies.CreateTenant)
    tenant = tenancy.create_tenant(services().db, str(body.slug), str(body.name), actor="control-api")
    return jsonify({"ok": True, "tenant": tenant}), 201


@bp.get("/tenants")
def list_tenants() -> Response:
    return jsonify({"ok": True, "tenants": tenancy.list_tenants(services().db)})


@bp.post("/tenants/<slug>/tokens")
def create_token(slug: str) -> tuple[Response, int]:
    body = _body(bodies.CreateToken)
    secret, info = tenancy.create_token(
        services().db, slug, name=str(body.name), environment=str(body.environment),
        workspace=str(body.workspace or "default"), actor="control-api", scopes=_scopes(body),
    )
    block = scoped_backend_block(public_base_url(), info.workspace_id, info.environment_id)
    return jsonify({"ok": True, "token_secret": secret, "token": info, "workspace_id": info.workspace_id,
                    "environment_id": info.environment_id, "backend_block": block}), 201


def _scopes(body: bodies.CreateToken | bodies.SetScopes) -> object:
    """``scopes`` (a list of 'GLOB:MODE'), or ``plan_only: true`` for the preset '*:read'."""
    return tenancy.requested_scopes(body.scopes, body.plan_only)


@bp.put("/tenants/<slug>/tokens/<token_id>/scopes")
def set_scopes(slug: str, token_id: str) -> Response:
    """Replace a token's address scopes: ``{"scopes": [...]}`` (``[]``: the whole state) or ``{"plan_only": true}``."""
    body = _body(bodies.SetScopes)
    if "scopes" not in body.model_fields_set and not body.plan_only:
        raise BadRequestError('body must be {"scopes": ["GLOB:MODE", ...]} ([] for the whole state) or '
                              '{"plan_only": true}')
    info = tenancy.set_token_scopes(services().db, slug, token_id, _scopes(body) or [], actor="control-api")
    return jsonify({"ok": True, "token": info})


@bp.get("/tenants/<slug>/tokens")
def list_tokens(slug: str) -> Response:
    return jsonify({"ok": True, "tokens": tenancy.list_tokens(services().db, slug)})


@bp.post("/tenants/<slug>/tokens/<token_id>/revoke")
def revoke_token(slug: str, token_id: str) -> Response:
    return jsonify({"ok": True, "token": tenancy.revoke_token(services().db, slug, token_id, actor="control-api")})


@bp.delete("/tenants/<slug>/tokens/<token_id>")
def delete_token(slug: str, token_id: str) -> Response:
    return revoke_token(slug, token_id)
