"""The Terraform HTTP backend lane: /v1/states/{name} and /v1/state-unlock/{name}.

Speaks exactly the stock ``backend "http"`` protocol. Bodies are read with ``get_data()``
(Terraform's force-unlock sends an empty body labelled JSON) and never logged.
"""

from __future__ import annotations

from flask import Blueprint, Response, request

from app.domain.locking import classify_unlock
from app.errors import InvalidStateNameError, StateNotFoundError
from app.store import states
from app.web import metrics
from app.web.context import principal, services, state_name

bp = Blueprint("backend", __name__)

_STATE_METHODS = ["GET", "POST", "DELETE", "LOCK", "UNLOCK"]


def _ok(body: bytes = b"", mimetype: str = "text/plain") -> Response:
    response = Response(body, status=200, mimetype=mimetype)
    response.headers["Cache-Control"] = "no-store"
    return response


@bp.route("/v1/states", methods=_STATE_METHODS, strict_slashes=False)
def missing_name() -> Response:
    raise InvalidStateNameError("the URL has no state name: use /v1/states/<name>")


@bp.route("/v1/states/<path:name>", methods=_STATE_METHODS, strict_slashes=False)
@metrics.backend_call
def state(name: str) -> Response:
    name = state_name(name)
    who = principal()
    db = services().db
    lock_id = request.args.get("ID") or None
    if request.method == "GET":
        raw = states.read_head(db, who, name)
        if raw is None:
            raise StateNotFoundError(f"no state named {name!r}")
        return _ok(raw, "application/json")
    if request.method == "POST":
        states.write_state(db, who, name, request.get_data(cache=False), lock_id=lock_id)
        return _ok()
    if request.method == "DELETE":
        states.delete_state(db, who, name, lock_id=lock_id)
        return _ok()
    if request.method == "LOCK":
        states.lock(db, who, name, request.get_data(cache=False))
        return _ok()
    states.unlock(db, who, name, classify_unlock(request.get_data(cache=False), lock_id))
    return _ok()


@bp.route("/v1/state-unlock/<path:name>", methods=["POST", "UNLOCK"], strict_slashes=False)
@metrics.backend_call
def state_unlock(name: str) -> Response:
    """The unlock alias for edges that drop UNLOCK requests with a body."""
    name = state_name(name)
    request_ = classify_unlock(request.get_data(cache=False), request.args.get("ID") or None)
    states.unlock(services().db, principal(), name, request_)
    return _ok()
