"""The engine lane /v1/engine: Kilolock's native API for kl and the workers.

This part serves the read API over the resource rows: listings at any serial, a resource's
lifecycle history, dependency edges, re-assembled states and the audit trail.
"""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request

from app.errors import BadRequestError
from app.store import events as events_store
from app.store import graph, states
from app.web import bodies, inputs
from app.web.context import principal, services, state_name

bp = Blueprint("engine", __name__, url_prefix="/v1/engine")


_int_arg = inputs.int_arg  # query integers: bounded to 64 bits, one parser for every lane


@bp.get("/states")
def list_states() -> Response:
    found = states.list_states(services().db, principal())
    return jsonify({"ok": True, "states": found})


@bp.get("/states/<path:name>/resources")
def resources(name: str) -> Response:
    listing = graph.list_resources(
        services().db, principal(), state_name(name), serial=_int_arg("serial"),
        prefix=request.args.get("prefix") or None,
        with_instance=request.args.get("instance") in ("1", "true"),
    )
    return jsonify({"ok": True, "state": listing.state, "serial": listing.serial,
                    "count": len(listing.resources), "resources": listing.resources})


@bp.get("/states/<path:name>/history")
def history(name: str) -> Response:
    glob = request.args.get("glob", "")
    if glob:
        return _blame(name, glob)
    address = request.args.get("address", "")
    if not address:
        raise BadRequestError("query parameter address or glob is required, e.g. ?address=terraform_data.web[0] "
                              "or ?glob=module.db.*")
    rows = graph.resource_history(services().db, principal(), state_name(name), address)
    return jsonify({"ok": True, "address": address, "lifecycles": rows})


def _short(text: str, what: str) -> str:
    if len(text) > 2048:
        raise BadRequestError(f"{what} is longer than 2048 characters")
    return text


def _blame(name: str, glob: str) -> Response:
    """Who created, changed and destroyed each instance under a glob: a page of addresses."""
    page = graph.blame(services().db, principal(), state_name(name), _short(glob, "glob"),
                       after=_short(request.args.get("after", ""), "after"),
                       limit=_int_arg("limit", 1, graph.BLAME_PAGE_MAX) or 100,
                       changes=_int_arg("changes", 1, graph.BLAME_CHANGES_MAX) or 20)
    return jsonify({"ok": True, "glob": glob, "count": len(page.instances), "instances": page.instances,
                    "next_after": page.next_after})


@bp.get("/states/<path:name>/dependencies")
def dependencies(name: str) -> Response:
    edges = graph.dependency_edges(services().db, principal(), state_name(name),
                                   serial=_int_arg("serial"))
    return jsonify({"ok": True, "edges": edges})


def _state_body(body: bytes | list[bytes]) -> Response:
    """A v4 state (or a slice of one) as sent: JSON, never cached."""
    response = Response(body, mimetype="application/json")
    response.headers["Cache-Control"] = "no-store"
    return response


@bp.get("/states/<path:name>/assembled")
def assembled(name: str) -> Response:
    return _state_body(graph.assemble(services().db, principal(), state_name(name), serial=_int_arg("serial")))


@bp.get("/states/<path:name>/events")
def events(name: str) -> Response:
    who = principal()
    limit = _int_arg("limit", 1, 1000) or 100
    with services().db.transaction() as conn:
        found = events_store.list_events(conn, who, state_name(name), limit)
    return jsonify({"ok": True, "events": found})


def _globs_body() -> list[str]:
    """The ``{"globs": [...]}`` body of the slice and edges reads."""
    return inputs.body_as(bodies.GlobsRead, request.get_json(force=True, silent=True)).globs


@bp.post("/states/<path:name>/slice")
def slice_(name: str) -> Response:
    """The head's instances under the given globs as a v4 state: ``{"globs": [...]}``."""
    globs = _globs_body()
    return _state_body(graph.slice_state(services().db, principal(), state_name(name), globs))


@bp.post("/states/<path:name>/edges")
def edges(name: str) -> Response:
    """Recorded dependency edges at the head touching the given globs: ``{"globs": [...]}``."""
    globs = _globs_body()
    found = graph.edges_touching(services().db, principal(), state_name(name), globs)
    return jsonify({"ok": True, "edges": [{"address": a, "depends_on": d} for a, d in found]})
