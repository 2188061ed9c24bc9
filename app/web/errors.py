"""The single mapping from KlError to HTTP responses.

The backend lane answers the way Terraform expects (423 carries the holder's LockInfo bytes;
other errors are short text, which Terraform discards anyway); every other lane uses the JSON
envelope ``{"ok": false, "code", "error", "status"}``.
"""

from __future__ import annotations

import logging

from flask import Flask, Response, g, jsonify, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from app.errors import AddressScopeError, KlError, PayloadTooLargeError, StateLockedError
from app.store import events

log = logging.getLogger("kilolock.web")

BACKEND_PREFIXES = ("/v1/states", "/v1/state-unlock")


def _is_backend_lane() -> bool:
    return request.path.startswith(BACKEND_PREFIXES)


def error_response(error: KlError) -> Response:
    if _is_backend_lane():
        if isinstance(error, StateLockedError):
            response = Response(error.lock_info, status=423, mimetype="application/json")
        else:
            response = Response(error.message + "\n", status=error.status, mimetype="text/plain")
        response.headers["Cache-Control"] = "no-store"
    else:
        body = {"ok": False, "code": error.code, "error": error.message, "status": error.status}
        if isinstance(error, StateLockedError):
            body["lock_info"] = error.lock_info.decode("utf-8", "replace")
        body.update({k: v for k, v in error.data.items() if k not in body})
        response = jsonify(body)
        response.status_code = error.status
    if error.status == 401:
        response.headers["WWW-Authenticate"] = 'Basic realm="kilolock"'
    add_retry_after(response, error)
    return response


def add_retry_after(response: Response, error: KlError) -> None:
    """``Retry-After`` on the answer to an error that says when to try again (every 429, some 503s)."""
    retry_after = getattr(error, "retry_after", None)
    if isinstance(retry_after, int) and retry_after > 0:
        response.headers["Retry-After"] = str(retry_after)


def from_http_exception(error: HTTPException) -> KlError:
    """Werkzeug's own errors (404 for an unknown route, 405, …) as a KlError with their status and a slug."""
    generic = KlError(error.description or error.name)
    generic.status = error.code or 500
    generic.code = error.name.lower().replace(" ", "_")
    return generic


def register(app: Flask) -> None:
    @app.errorhandler(KlError)
    def _kl_error(error: KlError) -> Response:
        if error.status >= 500:
            log.error("request failed: %s %s: %s", request.method, request.path, error.code)
        return error_response(error)

    @app.errorhandler(AddressScopeError)
    def _address_scope(error: AddressScopeError) -> Response:
        # Every scope refusal is audited, whichever lane and check raised it (its own transaction rolled back).
        who = g.get("principal")
        if who is not None:
            events.record_refused(app.extensions["kilolock"].db, who, "address_scope_refused", state_name=error.state,
                                  glob=error.glob, mode=error.mode, nearest_scope=error.nearest_scope,
                                  method=request.method, path=request.path[:300])
        return error_response(error)

    @app.errorhandler(RequestEntityTooLarge)
    def _too_large(_: RequestEntityTooLarge) -> Response:
        limit = app.config.get("KL_BODY_LIMIT")
        return error_response(
            PayloadTooLargeError(f"request body exceeds the limit of {limit} bytes: raise KL_MAX_BODY_BYTES")
        )

    @app.errorhandler(HTTPException)
    def _http(error: HTTPException) -> Response:
        return error_response(from_http_exception(error))

    @app.errorhandler(Exception)
    def _unexpected(error: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(KlError("internal error; see the server log"))
