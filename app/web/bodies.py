"""The JSON bodies of the engine lane and the control API as models (``app.wiremodels``): each field's type and
its refusal message, and the OpenAPI component schemas, generated from these same classes.

A model says what shape a body has; the domain rules that give its values meaning (glob syntax, scopes, a
hold's reason, a drift report's entries, the limits in the settings) stay with their owners, which the views
call with the parsed values. A key whose value is ``null`` counts as absent, as it always has.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, ValidationInfo, WithJsonSchema

from app.domain.drift_reports import MAX_CHECKED
from app.domain.reservations import RunStatus
from app.wiremodels import NEEDED, Problem, Wire, refusal

_GIT_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
# A plan's changes, bounded like a commit's body: far more than any plan a workspace can hold.
MAX_PLANNED = 100_000
MAX_PRUNED = 10_000
_INT64 = 2**63 - 1


def _none_is_empty(value: object) -> object:
    return "" if value is None else value


def _present(value: str, info: ValidationInfo) -> str:
    if not value:
        raise refusal(f"{info.field_name} is required")
    return value


def _at_most_planned(value: list[str], info: ValidationInfo) -> list[str]:
    if len(value) > MAX_PLANNED:
        raise refusal(f"{info.field_name} may hold at most {MAX_PLANNED} entries, not {len(value)}")
    return value


def _described(text: str, **schema: Any) -> Any:
    return Field(description=text, json_schema_extra=schema or None)


# Text a view needs: null and "" are refused as missing, anything but a string as the wrong type.
Text = Annotated[str, BeforeValidator(_none_is_empty), Problem("{field} must be a string"), AfterValidator(_present),
                 Field(validate_default=True), NEEDED]
OptionalText = Annotated[str, BeforeValidator(_none_is_empty), Problem("{field} must be a string")]
# A value the owner of its rule reads as text (``str(value)``), whatever JSON type it arrived as.
Loose = Annotated[Any, WithJsonSchema({"type": "string"})]
Names = Annotated[list[str], Problem("{field} must be a list of strings"), AfterValidator(_at_most_planned)]
Globs = Annotated[list[str], Field(description="address globs: exact, prefix.*, TYPE.*, output.NAME, "
                                               "output.PREFIX* or *")]
Holder = Annotated[Text, Field(description="the run's holder name, as opened")]
Ticket = Annotated[str | None, Problem("ticket must be the string a 202 answer gave")]
WaitSeconds = Annotated[float | None, Problem("wait_seconds must be a number of seconds, zero or more"),
                        Field(ge=0, lt=10**9)]
_SCOPES = {"type": "array", "maxItems": 1000, "items": {"type": "string", "description": (
    "GLOB:read or GLOB:write, e.g. module.payments.*:write, output.payments_*:write")},
    "description": "address scopes (write implies read); none: the whole state"}


class Wanted(Wire):
    # One reservation asked for; app.domain.reservations.parse_wanted reads both values as text.

    glob: Loose = ""
    mode: Annotated[Any, WithJsonSchema({"type": "string", "enum": ["read", "write"]})] = ""
    model_config = {"json_schema_extra": {"required": ["glob", "mode"]}}

    def pair(self) -> tuple[str, str]:
        return str(self.glob), str(self.mode)


Reservations = Annotated[list[Wanted], Problem('reservations must be a list of {"glob": ..., "mode": "read"|"write"}'),
                         NEEDED]


def _git_commit(info: dict[str, Any]) -> dict[str, Any]:
    commit = info.get("git_commit")
    if commit is not None and not (isinstance(commit, str) and _GIT_COMMIT.fullmatch(commit)):
        raise refusal("info.git_commit must be a git commit id (40 or 64 lowercase hex digits)")
    return info


class OpenRun(Wire):
    refusal = "request body must be a JSON object"
    base_serial: Annotated[int | None, Problem("base_serial must be an integer"), _described(
        "the serial the plan was made at: refused when a reserved address changed since",
        minimum=0, maximum=_INT64)] = None
    info: Annotated[dict[str, Any], Problem("info must be a JSON object"), AfterValidator(_git_commit)] = {}
    actor: Text = ""
    reservations: Reservations = []
    lease_seconds: Annotated[float | None, Problem("lease_seconds must be a number"),
                             _described("the lease, renewed by the run's heartbeat", minimum=1, maximum=43200)] = None
    ticket: Ticket = None
    wait_seconds: WaitSeconds = None


class AcquireMore(Wire):
    refusal = OpenRun.refusal
    holder: Holder = ""
    reservations: Reservations = []
    ticket: Ticket = None
    wait_seconds: WaitSeconds = None


class HolderOnly(Wire):
    refusal = OpenRun.refusal
    holder: Holder = ""


class CancelTicket(Wire):
    refusal = OpenRun.refusal
    holder: Annotated[Text, Field(description="the actor or holder the waiting request named")] = ""


class Release(Wire):
    refusal = OpenRun.refusal
    globs: Annotated[Globs | None, Problem("globs must be a list of strings (omit it to release everything)")] = None
    holder: Holder = ""


def _closing(value: str) -> RunStatus:
    try:
        return RunStatus(value)
    except ValueError:
        raise refusal("status must be failed or aborted") from None


class Close(Wire):
    refusal = OpenRun.refusal
    status: Annotated[Text, AfterValidator(_closing), _described("how the run ended", enum=["failed", "aborted"])] = ""
    counters: Annotated[dict[str, Any], Problem("counters must be a JSON object")] = {}
    holder: Holder = ""
    error_summary: OptionalText = ""

    @property
    def run_status(self) -> RunStatus:
        return RunStatus(self.status)


class Abort(Wire):
    refusal = OpenRun.refusal
    force: Annotated[bool, Problem("force must be true or false")] = False
    reason: OptionalText = ""


class DryCommit(Wire):
    refusal = OpenRun.refusal
    holder: Holder = ""
    addresses: Annotated[Names, Field(description="the instance addresses the plan writes")] = []
    outputs: Annotated[Names, Field(description="the root outputs the plan changes")] = []


_OutputName = Annotated[str, Field(min_length=1, max_length=256)]


class Commit(Wire):
    refusal = OpenRun.refusal
    state: Annotated[dict[str, Any], Problem("state must be the post-apply Terraform state (a JSON object)"),
                     Field(description="the post-apply v4 state of the slice")]
    slice_addresses: Annotated[list[str], Problem("slice_addresses must be a list of instance addresses")] = []
    prune_outputs: Annotated[
        bool | Annotated[list[_OutputName], Field(max_length=MAX_PRUNED)],
        Problem(f"prune_outputs must be true, false or a list of at most {MAX_PRUNED} output names"),
        Field(description="true: outputs missing from the state were removed; a list: only these may be")] = True
    holder: Holder = ""

    @property
    def prune(self) -> bool | frozenset[str]:
        return self.prune_outputs if isinstance(self.prune_outputs, bool) else frozenset(self.prune_outputs)


class GlobsRead(Wire):
    # The body of the slice and edges reads.

    refusal = 'body must be {"globs": ["module.web.*", ...]}'
    globs: Annotated[Globs, Problem(refusal)]


class TakeHold(Wire):
    refusal = 'body must be {"globs": [...], "reason": "...", "until_seconds": N}'
    until_released: Annotated[bool, Problem("until_released must be true or false")] = False
    until_seconds: Annotated[float | None, Problem("until_seconds must be a number of seconds"),
                             Field(ge=0, lt=10**9, json_schema_extra={"minimum": 60})] = None
    globs: Annotated[Globs, Problem('globs must be a non-empty list of address globs, e.g. ["module.db.*"]'),
                     Field(min_length=1, validate_default=True), NEEDED] = []
    # app.domain.manual_holds.check_reason owns the reason's rules
    reason: Annotated[Any, WithJsonSchema({"type": "string", "minLength": 1, "maxLength": 200}), NEEDED] = None


_COUNT = {"type": "integer", "minimum": 0, "maximum": MAX_CHECKED}


class DriftRecord(Wire):
    # A drift check or refresh to record: app.domain.drift_reports.parse_submitted owns every field but refreshed
    # (the model documents them).

    refusal = 'body must be {"globs": [...], "checked": N, "drifted": [...], "source": "drift"}'
    refreshed: Annotated[int, Problem("refreshed must be the number of instances a refresh committed"),
                         Field(ge=0, le=MAX_CHECKED)] = 0
    source: Annotated[Any, WithJsonSchema({"type": "string", "enum": ["drift", "refresh"]})] = None
    globs: Annotated[Any, WithJsonSchema({"type": "array", "items": {"type": "string"}}), NEEDED] = None
    checked: Annotated[Any, WithJsonSchema(_COUNT)] = None
    serial: Annotated[Any, WithJsonSchema({"type": "integer", "minimum": 0, "maximum": _INT64})] = None
    run_id: Annotated[Any, WithJsonSchema({"type": "string"})] = None
    actor: Annotated[Any, WithJsonSchema({"type": "string"})] = None
    drifted: Annotated[Any, WithJsonSchema({"type": "array", "maxItems": 10000, "items": {
        "type": "object", "required": ["address"], "properties": {
            "address": {"type": "string"}, "attributes": {"type": "array", "items": {"type": "string"},
                                                          "maxItems": 200},
            "gone": {"type": "boolean"}}}})] = None


class CreateTenant(Wire):
    refusal = "request body must be a JSON object"
    slug: Annotated[Loose, NEEDED] = ""
    name: Loose = ""


class _Scoped(Wire):
    refusal = "request body must be a JSON object"
    # app.store.tenancy.requested_scopes owns both rules
    scopes: Annotated[Any, WithJsonSchema(_SCOPES)] = None
    plan_only: Annotated[Any, WithJsonSchema({"type": "boolean", "description": "the preset scope '*:read'"})] = False


class CreateToken(_Scoped):
    name: Annotated[Loose, NEEDED] = ""
    environment: Annotated[Loose, NEEDED] = ""
    workspace: Loose = None


class SetScopes(_Scoped):
    pass


class Error(Wire):
    model_config = {"json_schema_extra": {"description": (
        "The JSON error envelope; some codes add fields (conflicts, waiting, lock_info, retry_after; "
        "address_scope adds glob, mode, nearest_scope and state).")}}

    ok: Literal[False]
    code: str
    error: str
    status: int
    glob: Annotated[str | None, Field(description="address_scope: the glob or address refused")] = None
    mode: Literal["read", "write"] | None = None
    nearest_scope: Annotated[str | None, Field(description="address_scope: the token's closest scope")] = None
    state: str | None = None
