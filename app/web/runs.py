"""The engine lane's apply runs and reservations: open a run holding reservations (optionally
waiting), acquire more, renew, release, mark running, close, abort, and the listings.

The server enforces every rule; conflicts answer 409 with the first overlapping reservations and
their total. A request that asks to wait never holds a worker: it is answered 202 with a queue
ticket at once and asks again with it (docs/reservations.md, "Waiting").
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from flask import Blueprint, Response, jsonify, request

from analyzer.jsontext import JsonInputError, load_json
from app.domain.reservations import RunStatus, Wanted, lease_for, parse_wanted
from app.errors import BadRequestError
from app.store import commit as commit_store
from app.store import runs
from app.web import bodies, inputs, metrics
from app.web.context import principal, services, state_name

bp = Blueprint("runs", __name__, url_prefix="/v1/engine")
# A commit's post-apply state holds Terraform's numbers, which may be integers beyond 64 bits.
_STATE_KEY = frozenset({"state"})


def _body(*, exact_under: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The JSON object a request carries ({} for none); integers under ``exact_under`` may exceed 64 bits."""
    raw = request.get_data(cache=True)
    if not raw.strip():
        return {}
    try:
        doc = load_json(raw, exact_under=exact_under) if exact_under else request.get_json(force=True, silent=False)
    except Exception as exc:  # werkzeug raises BadRequest subclasses for malformed JSON; load_json JsonInputError
        detail = getattr(exc, "description", "") or (str(exc) if isinstance(exc, JsonInputError) else "")
        raise BadRequestError("request body must be a JSON object" + (f" ({detail})" if detail else "")) from exc
    if not isinstance(doc, dict):
        raise BadRequestError("request body must be a JSON object")
    return doc


def _wanted(items: list[bodies.Wanted]) -> tuple[Wanted, ...]:
    limit = services().settings.max_globs_per_request
    if len(items) > limit:
        raise BadRequestError(f"a request may name at most {limit} reservation globs, not {len(items)}: "
                              "reserve a module or resource prefix ('module.NAME.*', 'TYPE.NAME.*') instead")
    return parse_wanted((i.pair() for i in items), limit=limit)


def _wait(ticket: str | None, value: float | None) -> runs.WaitPolicy:
    settings = services().settings
    window = timedelta(seconds=settings.wait_ticket_seconds)
    if value is None:
        return runs.WaitPolicy(ticket=ticket or None, window=window)
    wait = timedelta(seconds=min(value, settings.max_wait_seconds))
    return runs.WaitPolicy(wait=wait or None, ticket=ticket or None, window=window)


def _ticket_response(ticket: runs.Ticket) -> tuple[Response, int]:
    response = jsonify({
        "ok": True, "waiting": True, "ticket": ticket.id, "poll_after_seconds": ticket.poll_after,
        "ticket_expires_in": ticket.expires_in, "wait_until": ticket.wait_until,
        "conflicts": ticket.conflicts, "conflicts_total": ticket.conflicts_total,
    })
    response.headers["Retry-After"] = str(max(int(ticket.poll_after), 1))
    return response, 202


def _run_payload(run: runs.Run) -> dict[str, Any]:
    return {
        "id": run.id, "state": run.state, "status": run.status, "actor": run.actor,
        "base_serial": run.base_serial, "committed_serial": run.committed_serial,
        "created_at": run.created_at, "started_at": run.started_at, "finished_at": run.finished_at,
        "lease_seconds": run.lease_seconds, "expires_at": run.expires_at, "counters": run.counters,
        "error_summary": run.error_summary, "info": run.info,
    }


def _run_response(run: runs.Run, status: int = 200, **extra: Any) -> tuple[Response, int]:
    held = runs.run_reservations(services().db, principal(), run.id)
    return jsonify({"ok": True, "run": _run_payload(run), "reservations": held, **extra}), status


@bp.post("/states/<path:name>/runs")
@metrics.engine_call("open")
def open_run(name: str) -> tuple[Response, int]:
    body = inputs.body_as(bodies.OpenRun, _body())
    run = runs.open_run(
        services().db, principal(), state_name(name), actor=body.actor, wanted=_wanted(body.reservations),
        lease=lease_for(body.lease_seconds), policy=_wait(body.ticket, body.wait_seconds),
        base_serial=body.base_serial, info=body.info,
    )
    if isinstance(run, runs.Ticket):
        return _ticket_response(run)
    # The head when the reservations were granted: the plan's serial and lineage if nothing landed since it.
    return _run_response(run, 201, granted_at_serial=run.granted_at_serial,
                         granted_at_lineage=run.granted_at_lineage)


@bp.get("/runs")
def list_runs() -> Response:
    state = request.args.get("state") or None
    status = request.args.get("status") or None
    if status is not None and status not in {s.value for s in RunStatus}:
        raise BadRequestError(f"unknown status {status!r}: use one of {', '.join(s.value for s in RunStatus)}")
    found = runs.list_runs(services().db, principal(), state=state_name(state) if state else None,
                           status=status, limit=inputs.int_arg("limit", 1, 1000) or 100)
    return jsonify({"ok": True, "runs": [_run_payload(r) for r in found]})


@bp.get("/reservations")
def list_reservations() -> Response:
    state = request.args.get("state") or None
    found = runs.list_reservations(services().db, principal(), state=state_name(state) if state else None)
    return jsonify({"ok": True, "reservations": found})


@bp.get("/runs/<run_id>")
def get_run(run_id: str) -> tuple[Response, int]:
    return _run_response(runs.get_run(services().db, principal(), run_id))


@bp.post("/runs/<run_id>/reservations")
@metrics.engine_call("more")
def acquire_more(run_id: str) -> tuple[Response, int]:
    body = inputs.body_as(bodies.AcquireMore, _body())
    run = runs.acquire_more(services().db, principal(), run_id, holder=body.holder,
                            wanted=_wanted(body.reservations), policy=_wait(body.ticket, body.wait_seconds),
                            max_globs=services().settings.max_globs_per_run)
    if isinstance(run, runs.Ticket):
        return _ticket_response(run)
    return _run_response(run)


@bp.post("/tickets/<ticket>/cancel")
def cancel_ticket(ticket: str) -> tuple[Response, int]:
    """Give up a queue place: the waiting kl stopped waiting (Ctrl-C, SIGTERM, or it gave up). Idempotent:
    ``cancelled`` is false when the place is gone already or is not this credential's and holder's."""
    doc = _body()
    if len(ticket) > 40:
        raise BadRequestError("ticket must be the string a 202 answer gave")
    body = inputs.body_as(bodies.CancelTicket, doc)
    cancelled = runs.cancel_ticket(services().db, principal(), ticket, body.holder)
    return jsonify({"ok": True, "ticket": ticket, "cancelled": cancelled}), 200


@bp.post("/runs/<run_id>/renew")
@metrics.engine_call("renew")
def renew(run_id: str) -> tuple[Response, int]:
    return _as_holder(runs.renew, run_id)


@bp.post("/runs/<run_id>/release")
@metrics.engine_call("release")
def release(run_id: str) -> tuple[Response, int]:
    body = inputs.body_as(bodies.Release, _body())
    return _run_response(runs.release(services().db, principal(), run_id, holder=body.holder, globs=body.globs))


@bp.post("/runs/<run_id>/running")
@metrics.engine_call("running")
def running(run_id: str) -> tuple[Response, int]:
    return _as_holder(runs.mark_running, run_id)


def _as_holder(step: Callable[..., runs.Run], run_id: str) -> tuple[Response, int]:
    """A step of the run that only its holder may take, the holder named by the body."""
    body = inputs.body_as(bodies.HolderOnly, _body())
    return _run_response(step(services().db, principal(), run_id, holder=body.holder))


@bp.post("/runs/<run_id>/close")
@metrics.engine_call("close")
def close(run_id: str) -> tuple[Response, int]:
    body = inputs.body_as(bodies.Close, _body())
    run = runs.close_run(services().db, principal(), run_id, holder=body.holder, status=body.run_status,
                         error_summary=body.error_summary or None, counters=body.counters)
    return _run_response(run)


@bp.post("/runs/<run_id>/abort")
@metrics.engine_call("abort")
def abort(run_id: str) -> tuple[Response, int]:
    """End a run; one that is applying becomes ``aborting`` until its client has stopped Terraform
    (``{"force": true}`` releases at once)."""
    body = inputs.body_as(bodies.Abort, _body())
    run = runs.abort(services().db, principal(), run_id, reason=body.reason, force=body.force)
    return _run_response(run)


@bp.post("/runs/<run_id>/dry-commit")
@metrics.engine_call("dry_commit")
def dry_commit(run_id: str) -> tuple[Response, int]:
    """The commit's refusals for the changes a plan will make, before Terraform applies them:
    ``{"holder", "addresses": [instance addresses], "outputs": [root output names]}``. Changes no row."""
    body = inputs.body_as(bodies.DryCommit, _body())
    result = commit_store.dry_commit_run(services().db, principal(), run_id, holder=body.holder,
                                         addresses=body.addresses, outputs=body.outputs)
    return jsonify({"ok": True, "dry_commit": {
        "run_id": result.run_id, "base_serial": result.base_serial, "head_serial": result.head_serial,
        "addresses": list(result.addresses), "outputs": list(result.outputs)}}), 200


@bp.post("/runs/<run_id>/commit")
@metrics.engine_call("commit")
def commit(run_id: str) -> tuple[Response, int]:
    """Row-level commit of the run's post-apply slice: ``{"holder", "state", "slice_addresses",
    "prune_outputs"}`` (prune: true when the workspace held every output, so missing ones were removed; a
    list of the output names a partial workspace declares, whose missing ones were removed)."""
    body = inputs.body_as(bodies.Commit, _body(exact_under=_STATE_KEY))
    result = commit_store.commit_run(
        services().db, principal(), run_id, holder=body.holder,
        state_body=json.dumps(body.state).encode(), slice_addresses=body.slice_addresses, prune_outputs=body.prune,
    )
    payload = {"serial": result.serial, "created": result.created, "updated": result.updated,
               "deleted": result.deleted, "addresses": list(result.addresses),
               "outputs_changed": list(result.outputs_changed)}
    response, status = _run_response(runs.get_run(services().db, principal(), run_id))
    body = response.get_json()
    body["commit"] = payload
    return jsonify(body), status
