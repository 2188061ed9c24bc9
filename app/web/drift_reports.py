"""The engine lane's drift reports: ``GET /v1/engine/states/NAME/drift`` (the latest: the state's outstanding
drift and when it was last checked), ``GET …/drift/history`` and ``POST …/drift`` (kl drift and kl refresh
record what they found). Reports carry addresses and attribute names only, never values."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from flask import Blueprint, Response, jsonify, request

from app.domain import drift_reports as rules
from app.errors import BadRequestError
from app.store import drift_reports as store
from app.web import bodies, inputs
from app.web.context import principal, services, state_name

bp = Blueprint("drift", __name__, url_prefix="/v1/engine")


def _latest(name: str, found: list[store.Report]) -> dict[str, Any]:
    if not found:
        return {"ok": True, "state": name, "serial": None, "checked_at": None, "checked": 0, "globs": [],
                "drifted": [], "report": None}
    latest = found[0]
    return {"ok": True, "state": name, "serial": latest.serial, "checked_at": latest.checked_at.isoformat(),
            "checked": latest.checked, "globs": list(latest.globs),
            "drifted": [latest.entry_json(e) for e in latest.drifted],
            "report": latest.to_json()}


@bp.get("/states/<path:name>/drift")
def latest(name: str) -> Response:
    chosen = state_name(name)
    return jsonify(_latest(chosen, store.reports(services().db, principal(), chosen, limit=1)))


@bp.get("/states/<path:name>/drift/history")
def history(name: str) -> Response:
    raw = request.args.get("limit", "20")
    if not raw.isdigit() or not 1 <= int(raw) <= 500:
        raise BadRequestError("limit must be a whole number between 1 and 500")
    chosen = state_name(name)
    found = store.reports(services().db, principal(), chosen, limit=int(raw))
    return jsonify({"ok": True, "state": chosen, "reports": [r.to_json() for r in found]})


@bp.post("/states/<path:name>/drift")
def record(name: str) -> tuple[Response, int]:
    doc = request.get_json(force=True, silent=True)
    body = inputs.body_as(bodies.DriftRecord, doc)
    submitted = rules.parse_submitted({k: v for k, v in doc.items() if k != "refreshed"})
    chosen = state_name(name)
    report = store.record(services().db, principal(), chosen, submitted, refreshed=body.refreshed,
                          now=datetime.now(UTC))
    return jsonify(_latest(chosen, [report])), 201
