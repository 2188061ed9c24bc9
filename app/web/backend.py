"""The Terraform HTTP backend lane: /v1/states/{name} and /v1/state-unlock/{name}.

Speaks exactly the stock ``backend "http"`` protocol. Bodies are read through ``app.web.inputs``
(bounded: 413 beyond the limit; Terraform's force-unlock sends an empty body labelled JSON) and
never logged. Lock and unlock bodies are small documents and are checked like every JSON body.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from flask import Blueprint, Response, request, stream_with_context

from app.domain.locking import classify_unlock
from app.domain.reservations import Mode
from app.domain.scopes import check_whole_state
from app.errors import InvalidLockInfoError, InvalidStateNameError, PayloadTooLargeError, StateNotFoundError
from app.store import assembly, states
from app.web import inputs, metrics
from app.web.context import principal, services, state_name

bp = Blueprint("backend", __name__)

_STATE_METHODS = ["GET", "POST", "DELETE", "LOCK", "UNLOCK"]
# Terraform's LockInfo is a few hundred bytes; anything this large is not one.
MAX_LOCK_BODY = 64 * 1024


def _lock_body(what: str) -> bytes | bytearray:
    """A LOCK or UNLOCK body: at most MAX_LOCK_BODY bytes, acceptable JSON when it is JSON, and
    free of control characters when it is a plain-text lock ID."""
    length = request.content_length
    if length is not None and length > MAX_LOCK_BODY:
        raise PayloadTooLargeError(f"a {what} body is at most {MAX_LOCK_BODY} bytes: send Terraform's LockInfo")
    body = inputs.read_body()
    if len(body) > MAX_LOCK_BODY:
        raise PayloadTooLargeError(f"a {what} body is at most {MAX_LOCK_BODY} bytes: send Terraform's LockInfo")
    if not inputs.check_json(body, f"{what} body") and inputs.has_control(
            bytes(body).strip().decode("utf-8", "replace")):
        raise InvalidLockInfoError(f"the {what} body holds a control character: send Terraform's LockInfo")
    return body


def _ok(body: bytes | Iterable[bytes] = b"", mimetype: str = "text/plain") -> Response:
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
    # The whole state moves in each of these: a token with address scopes needs '*' (a scoped token reads
    # through the engine lane's slice and resources reads instead).
    mode = Mode.READ if request.method == "GET" else Mode.WRITE
    check_whole_state(who.scopes, name, mode, f"Terraform's {request.method}")
    if request.method == "GET":
        # The cache write of a first GET comes after the body: when the response closes (every WSGI server
        # closes it once the body is sent), or, for a body whose size is known, after the last piece.
        found = assembly.Found(late=True)
        pieces = states.head_pieces(db, who, name, before_assembly=inputs.large_body_slot, found=found)
        if pieces is None:
            raise StateNotFoundError(f"no state named {name!r}")
        response = _ok(stream_with_context(pieces), "application/json")
        response.call_on_close(found.finish)
        if found.size is not None:
            response.content_length = found.size
        inputs.return_memory_after(response, found.size)
        inputs.slot_until_closed(response)  # the pieces an assembly holds are freed by ``finish``
        return response
    if request.method == "POST":
        # The body is passed on, not kept here: the store frees it once its bytes are stored.
        # A bulk write's statistics refresh, and the changed attribute names of a write that replaced many
        # rows, run after the answer, on this process's upkeep thread.
        upkeep = services().upkeep
        written = states.write_state(db, who, name, inputs.read_body(), lock_id=lock_id,
                                     after_bulk=None if upkeep is None else upkeep.request,
                                     later=None if upkeep is None else upkeep.later)
        builder, threshold = services().splice_bases, services().settings.splice_base_bytes
        if builder is not None and written.version_id and not written.encrypted and written.size >= threshold:
            # Its splice base, built off this request (app.web.splicebases), after the statistics refresh.
            submit = functools.partial(builder.submit, written.version_id)
            if upkeep is None:
                submit()
            else:
                upkeep.then(submit)
        return _ok()
    if request.method == "DELETE":
        states.delete_state(db, who, name, lock_id=lock_id)
        return _ok()
    if request.method == "LOCK":
        states.lock(db, who, name, bytes(_lock_body("LOCK")))
        return _ok()
    states.unlock(db, who, name, classify_unlock(bytes(_lock_body("UNLOCK")), lock_id))
    return _ok()


@bp.route("/v1/state-unlock/<path:name>", methods=["POST", "UNLOCK"], strict_slashes=False)
@metrics.backend_call
def state_unlock(name: str) -> Response:
    """The unlock alias for edges that drop UNLOCK requests with a body."""
    name = state_name(name)
    check_whole_state(principal().scopes, name, Mode.WRITE, "Terraform's UNLOCK")
    request_ = classify_unlock(bytes(_lock_body("UNLOCK")), request.args.get("ID") or None)
    states.unlock(services().db, principal(), name, request_)
    return _ok()
