"""The OpenAPI 3.1 description of the engine lane (/v1/engine) and the control API (/v1/api), served at
``GET /v1/openapi.json`` (no authentication: it describes, it holds nothing).

The operations are declared once, below, as data; ``document()`` renders them. Request bodies and the error
envelope are the models of ``app.web.bodies`` that the views parse with, so their component schemas are
generated from the code that enforces them (``app.wiremodels.schemas_of``), never kept by hand. A test checks this
table against the app's registered routes in both directions (every route documented, no stale entry), and a
property-based fuzz drives every operation from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Any

from flask import Flask, Response, jsonify

from app.web import bodies
from app.wiremodels import Wire, schemas_of

PATH = "/v1/openapi.json"
_REF = "#/components/schemas/{model}"

_STR = {"type": "string"}
_INT = {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}


def _limit(maximum: int) -> dict[str, Any]:
    return {"type": "integer", "minimum": 1, "maximum": maximum}


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    schema: dict[str, Any]
    required: bool = False
    where: str = "query"


@dataclass(frozen=True, slots=True)
class Operation:
    method: str
    path: str
    summary: str
    params: tuple[Param, ...] = ()
    model: type[Wire] | None = None  # the JSON body, as the view parses it
    success: int = 200
    tags: tuple[str, ...] = field(default=("engine",))

    @property
    def body(self) -> dict[str, Any]:
        """The body's properties by name (none without a body)."""
        if self.model is None:
            return {}
        return dict(_schemas()[self.model.__name__].get("properties", {}))


def _engine_state(path: str, method: str, summary: str, *params: Param, body: type[Wire] | None = None,
                  success: int = 200) -> Operation:
    return Operation(method, "/v1/engine/states/{name}" + path, summary,
                     (Param("name", _STR, True, "path"), *params), body, success)


def _run(path: str, summary: str, body: type[Wire] | None = None, method: str = "post") -> Operation:
    return Operation(method, "/v1/engine/runs/{run_id}" + path, summary, (Param("run_id", _STR, True, "path"),),
                     body)


def _control(method: str, path: str, summary: str, *params: str, body: type[Wire] | None = None,
             success: int = 200) -> Operation:
    return Operation(method, "/v1/api" + path, summary, tuple(Param(p, _STR, True, "path") for p in params), body,
                     success, ("control",))


OPERATIONS: tuple[Operation, ...] = (
    Operation("get", "/v1/engine/states", "List the caller's states with serial, lock flag and resource count"),
    _engine_state("/resources", "get", "Resource instances alive at a serial (default: the head)",
                  Param("serial", _INT), Param("prefix", _STR), Param("instance", {"type": "string",
                                                                                   "enum": ["1", "true"]})),
    _engine_state("/history", "get", "Every lifecycle of one instance address (address=), or who changed each "
                  "instance under a glob (glob=), a page at a time",
                  Param("address", _STR), Param("glob", _STR), Param("after", _STR),
                  Param("limit", _limit(1000)),
                  Param("changes", _limit(200))),
    _engine_state("/dependencies", "get", "Recorded dependency edges at a serial", Param("serial", _INT)),
    _engine_state("/assembled", "get", "The v4 state re-assembled from rows at a serial", Param("serial", _INT)),
    _engine_state("/events", "get", "The state's audit trail, newest first",
                  Param("limit", _limit(1000))),
    _engine_state("/drift", "get", "The latest drift report: outstanding drifted instances, last check"),
    _engine_state("/drift/history", "get", "Drift reports, newest first",
                  Param("limit", _limit(500))),
    _engine_state("/drift", "post", "Record a drift check or refresh (addresses and attribute names only)",
                  body=bodies.DriftRecord, success=201),
    _engine_state("/slice", "post", "The head's instances under the globs, as a v4 state", body=bodies.GlobsRead),
    _engine_state("/edges", "post", "Dependency edges at the head touching the globs", body=bodies.GlobsRead),
    _engine_state("/runs", "post", "Open an apply run holding reservations (all or nothing); the answer's "
                  "granted_at_serial and granted_at_lineage are the head's when they were granted",
                  body=bodies.OpenRun, success=201),
    Operation("get", "/v1/engine/runs", "List apply runs", (
        Param("state", _STR), Param("status", _STR), Param("limit", _limit(1000)))),
    Operation("get", "/v1/engine/reservations", "List live reservations", (Param("state", _STR),)),
    _engine_state("/holds", "post", "Take a manual hold: write reservations with a reason and an owner, at once or "
                  "not at all, expiring after until_seconds (default KL_HOLD_DEFAULT_SECONDS) unless until_released",
                  body=bodies.TakeHold, success=201),
    Operation("get", "/v1/engine/holds", "List live manual holds, oldest first", (
        Param("state", _STR), Param("limit", _limit(500)))),
    Operation("delete", "/v1/engine/holds/{hold_id}", "Release a manual hold (the credential that took it)",
              (Param("hold_id", _STR, True, "path"),)),
    Operation("get", "/v1/engine/runs/{run_id}", "One run with its reservations",
              (Param("run_id", _STR, True, "path"),)),
    _run("/reservations", "Acquire more reservations for a live run", bodies.AcquireMore),
    Operation("post", "/v1/engine/tickets/{ticket}/cancel", "Give up a queue place (the waiting client stopped): "
              "cancelled is false when it is gone already or not this credential's and holder's",
              (Param("ticket", _STR, True, "path"),), bodies.CancelTicket),
    _run("/renew", "Extend the run's lease", bodies.HolderOnly),
    _run("/release", "Release some (globs) or all of the run's reservations", bodies.Release),
    _run("/running", "Mark the run as applying", bodies.HolderOnly),
    _run("/close", "Close the run as failed or aborted", bodies.Close),
    _run("/abort", "Abort a run (operators): releases its reservations, or, while its Terraform applies, marks it "
         "aborting until its client has stopped Terraform and closed it (force: release at once)", bodies.Abort),
    _run("/dry-commit", "Check the changes a plan will make against the commit's refusals, before applying "
         "(changes no row)", bodies.DryCommit),
    _run("/commit", "Row-level commit of the run's post-apply slice", bodies.Commit),
    _control("post", "/tenants", "Create a tenant", body=bodies.CreateTenant, success=201),
    _control("get", "/tenants", "List tenants"),
    _control("post", "/tenants/{slug}/tokens", "Create a token (the secret is shown once)", "slug",
             body=bodies.CreateToken, success=201),
    _control("put", "/tenants/{slug}/tokens/{token_id}/scopes", "Replace a token's address scopes (audited)",
             "slug", "token_id", body=bodies.SetScopes),
    _control("get", "/tenants/{slug}/tokens", "List a tenant's tokens (never secrets)", "slug"),
    _control("post", "/tenants/{slug}/tokens/{token_id}/revoke", "Revoke a token", "slug", "token_id"),
    _control("delete", "/tenants/{slug}/tokens/{token_id}", "Revoke a token (DELETE form)", "slug", "token_id"),
)

_ERRORS = {
    "400": "malformed request: the message names the field",
    "401": "no credentials",
    "403": "credentials refused, another credential's run, or address_scope: the token's address scopes do not "
           "cover the request",
    "404": "no such state or run", "409": "conflict: reservations, stale plan, closed run",
    "413": "body over KL_MAX_BODY_BYTES", "423": "the state is locked",
    "429": "too many failed authentications (Retry-After)",
    "503": "database unavailable, or too many large bodies at once (Retry-After)",
}


def _operation(op: Operation) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "summary": op.summary,
        "tags": list(op.tags),
        "operationId": (op.method + op.path.replace("/v1", "").replace("{", "").replace("}", "")
                        .replace("/", "_").replace("-", "_")),
        "security": [{"control": []}] if "control" in op.tags else [{"bearer": []}, {"basic": []}],
        "responses": {str(op.success): {"description": "success", "content": {"application/json": {
            "schema": {"type": "object", "properties": {"ok": {"const": True}}}}}}},
    }
    doc["responses"].update({code: {"description": text, "content": {"application/json": {"schema": {
        "$ref": _REF.format(model=bodies.Error.__name__)}}}} for code, text in _ERRORS.items()})
    if op.params:
        doc["parameters"] = [{"name": p.name, "in": p.where, "required": p.required or p.where == "path",
                              "schema": p.schema} for p in op.params]
    if op.model is not None:
        required = bool(_schemas()[op.model.__name__].get("required"))
        doc["requestBody"] = {"required": required, "content": {"application/json": {"schema": {
            "$ref": _REF.format(model=op.model.__name__)}}}}
    return doc


@cache
def _schemas() -> dict[str, Any]:
    """The component schemas: every body model of OPERATIONS, the models they nest and the error envelope."""
    models = {op.model: None for op in OPERATIONS if op.model is not None}
    return schemas_of((*models, bodies.Error), _REF)


def document() -> dict[str, Any]:
    """The OpenAPI document, rendered from OPERATIONS."""
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        paths.setdefault(op.path, {})[op.method] = _operation(op)
    return {
        "openapi": "3.1.0",
        "info": {"title": "Kilolock engine lane and control API", "version": "1",
                 "description": "Kilolock's native API for kl and the workers (/v1/engine, the same tokens as "
                                "the Terraform backend lane) and the operators' control API (/v1/api, behind "
                                "KL_CONTROL_TOKEN). Errors use one JSON envelope."},
        "paths": paths,
        "components": {
            "schemas": _schemas(),
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "a Kilolock token"},
                "basic": {"type": "http", "scheme": "basic", "description": "workspace id : token secret"},
                "control": {"type": "http", "scheme": "bearer", "description": "KL_CONTROL_TOKEN"},
            },
        },
    }


def init_app(app: Flask) -> None:
    """Serve the document at PATH."""
    rendered = document()

    @app.get(PATH)
    def openapi() -> Response:
        response = jsonify(rendered)
        response.headers["Cache-Control"] = "public, max-age=300"
        return response
