"""The outcomes of runner.core.errors and their exit codes: one table, the wire codes the server really sends."""

from __future__ import annotations

import inspect

import pytest

import app.errors
import runner.core.errors
from runner.cli.entry import EXIT_CODES, exit_code
from runner.cli.support import EXIT_CONFLICT, EXIT_FAILED, EXIT_OK, EXIT_USAGE
from runner.core.config import ClientConfigError
from runner.core.engine_client import EngineBadRequest, EngineError, engine_error
from runner.core.errors import (
    SERVER_CODES,
    EngineCode,
    Failed,
    InvalidInput,
    KlExit,
    NothingToDo,
    ReservationRefused,
    StalePlan,
    UsageError,
    refusal,
)


@pytest.mark.parametrize("error, code", [
    (NothingToDo("no Terraform files changed: nothing to plan"), EXIT_OK),
    (Failed("terraform apply failed"), EXIT_FAILED),
    (ReservationRefused("held by someone else"), EXIT_CONFLICT),
    (StalePlan("re-run kl plan"), EXIT_CONFLICT),
    (InvalidInput("state is encrypted"), EXIT_USAGE),
    (UsageError("-var must be NAME=VALUE"), EXIT_USAGE),
    (ClientConfigError("no state name"), EXIT_USAGE),
    (EngineError("boom", status=500, code="internal"), EXIT_FAILED),
    (EngineError("gone", status=404, code="state_not_found"), EXIT_FAILED),
    (engine_error("bad glob", status=400, code="bad_request"), EXIT_USAGE),
    (app.errors.ConfigError(["KL_X is wrong"]), EXIT_USAGE),
    (app.errors.NotFoundError("no such tenant"), EXIT_USAGE),
    (app.errors.ConflictError("taken"), EXIT_USAGE),
    (app.errors.DatabaseUnavailableError("down"), EXIT_FAILED),
])
def test_every_outcome_has_its_exit_code(error, code):
    assert exit_code(error) == code


def test_an_unknown_error_has_no_exit_code_so_its_traceback_shows():
    assert exit_code(ValueError("a bug")) is None


def test_every_outcome_class_is_in_the_table():
    outcomes = {c for _, c in inspect.getmembers(runner.core.errors, inspect.isclass)
                if issubclass(c, KlExit) and c is not KlExit}
    assert outcomes <= {kind for kind, _ in EXIT_CODES}


def test_a_bad_request_is_the_callers_fault():
    assert isinstance(engine_error("x", status=400, code="bad_request"), EngineBadRequest)
    assert type(engine_error("x", status=409, code="reservation_conflict")) is EngineError


def test_the_client_knows_only_codes_the_server_sends():
    sent = {c.code for _, c in inspect.getmembers(app.errors, inspect.isclass) if issubclass(c, app.errors.KlError)}
    assert {str(c) for c in SERVER_CODES} <= sent


@pytest.mark.parametrize("code, outcome", [
    (EngineCode.STALE_PLAN, StalePlan),
    (EngineCode.RESERVATION_CONFLICT, ReservationRefused),
    (EngineCode.WAIT_TICKET_EXPIRED, ReservationRefused),
    (EngineCode.LEASE_EXPIRED, Failed),
    ("internal", Failed),
])
def test_an_engine_refusal_becomes_a_conflict_a_stale_plan_or_a_failure(code, outcome):
    assert refusal(code) is outcome
