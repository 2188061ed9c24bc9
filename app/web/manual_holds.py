"""The engine lane's manual holds: take one on a state, list them, release one (docs/engine-api.md,
"Manual holds"). A refused request changes no row."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify, request

from app.domain.manual_holds import check_reason
from app.errors import BadRequestError
from app.store import manual_holds as store
from app.web import inputs
from app.web.context import principal, services, state_name

bp = Blueprint("holds", __name__, url_prefix="/v1/engine")
_HOLD_ID_MAX = 40


def _globs(doc: dict[str, Any]) -> list[str]:
    items = doc.get("globs")
    limit = services().settings.max_globs_per_request
    if not isinstance(items, list) or not items or not all(isinstance(g, str) for g in items):
        raise BadRequestError('globs must be a non-empty list of address globs, e.g. ["module.db.*"]')
    if len(items) > limit:
        raise BadRequestError(f"a hold may name at most {limit} globs, not {len(items)}")
    return items


def _until(doc: dict[str, Any]) -> tuple[float | None, bool]:
    seconds, released = doc.get("until_seconds"), doc.get("until_released", False)
    if not isinstance(released, bool):
        raise BadRequestError("until_released must be true or false")
    if seconds is not None and (not isinstance(seconds, int | float) or isinstance(seconds, bool)
                                or not 0 <= seconds < 10**9):
        raise BadRequestError("until_seconds must be a number of seconds")
    return (None if seconds is None else float(seconds)), released


@bp.post("/states/<path:name>/holds")
def take(name: str) -> tuple[Response, int]:
    doc = inputs.json_body()
    if not isinstance(doc, dict):
        raise BadRequestError('body must be {"globs": [...], "reason": "...", "until_seconds": N}')
    seconds, released = _until(doc)
    settings = services().settings
    hold = store.take(services().db, principal(), state_name(name), globs=_globs(doc),
                      reason=check_reason(doc.get("reason")), policy=settings.hold_policy,
                      until_seconds=seconds, until_released=released, max_globs=settings.max_globs_per_run)
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
