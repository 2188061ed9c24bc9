"""The engine lane's manual holds: take one on a state, list them, release one (docs/engine-api.md,
"Manual holds"). A refused request changes no row."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request

from app.domain.manual_holds import check_reason
from app.errors import BadRequestError
from app.store import manual_holds as store
from app.web import bodies, inputs
from app.web.context import principal, services, state_name

bp = Blueprint("holds", __name__, url_prefix="/v1/engine")
_HOLD_ID_MAX = 40


def _globs(globs: list[str]) -> list[str]:
    limit = services().settings.max_globs_per_request
    if len(globs) > limit:
        raise BadRequestError(f"a hold may name at most {limit} globs, not {len(globs)}")
    return globs


@bp.post("/states/<path:name>/holds")
def take(name: str) -> tuple[Response, int]:
    body = inputs.body_as(bodies.TakeHold, inputs.json_body())
    settings = services().settings
    hold = store.take(services().db, principal(), state_name(name), globs=_globs(body.globs),
                      reason=check_reason(body.reason), policy=settings.hold_policy,
                      until_seconds=body.until_seconds, until_released=body.until_released,
                      max_globs=settings.max_globs_per_run)
    return jsonify({"ok": True, "hold": hold.payload()}), 201


@bp.get("/holds")
def list_holds() -> Response:
    state = request.args.get("state") or None
    found = store.list_holds(services().db, principal(), state=state_name(state) if state else None,
                             limit=inputs.int_arg("limit", 1, 500) or 500)
    return jsonify({"ok": True, "holds": [h.payload() for h in found]})


@bp.delete("/holds/<hold_id>")
def release(hold_id: str) -> Response:
    if len(hold_id) > _HOLD_ID_MAX:
        raise BadRequestError("a hold id is the id kl hold or kl reservations shows (ar_…)")
    hold = store.release(services().db, principal(), hold_id)
    return jsonify({"ok": True, "released": True, "hold": hold.payload()})
