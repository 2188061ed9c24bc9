"""How a kl command stops: one exception class per outcome, and the engine's error codes as the client sees them.

A command (or the bot's job running the same code) raises one of these with a message that says what to do
next. Only the CLI's entry point turns a class into an exit code, in one table (``runner.cli.entry.EXIT_CODES``),
as ``app.web.errors`` is the one place that turns the service's errors into HTTP responses. The bot reads the
same classes to choose its advice.

The engine lane answers a failure with ``{"code": ...}``; ``EngineCode`` names the codes the client acts on.
The server defines them on its error classes (``app.errors``); the client keeps its own view here, since it
never imports the service.
"""

from __future__ import annotations

from enum import StrEnum


class KlExit(Exception):
    """Base of every outcome that stops a command with one message."""


class NothingToDo(KlExit):
    """Not a failure: there is nothing to plan or apply (e.g. no Terraform file changed since the ref)."""


class Failed(KlExit):
    """The operation failed: Terraform, the commit, or the server. Nothing was committed."""


class ReservationRefused(KlExit):
    """Another run holds what this one needs, or holds it still after the wait: wait, retry or re-plan."""


class StalePlan(KlExit):
    """Something moved since ``kl plan`` (the configuration, a pinned input, the trunk): re-plan."""


class InvalidInput(KlExit):
    """What was given (the configuration, a file, a flag's value, the environment) cannot be used as it is;
    the message says what to change."""


class UsageError(InvalidInput):
    """The command line itself is wrong: after the message, kl shows the command's usage."""


class EngineCode(StrEnum):
    """The engine lane's error codes the client compares (``EngineError.code``)."""

    STATE_NOT_FOUND = "state_not_found"
    RESERVATION_CONFLICT = "reservation_conflict"
    WAIT_TICKET_EXPIRED = "wait_ticket_expired"
    STALE_PLAN = "stale_plan"
    LEASE_EXPIRED = "lease_expired"
    RUN_CLOSED = "run_closed"
    RUN_NOT_FOUND = "run_not_found"
    NOT_RUN_HOLDER = "not_run_holder"
    WRITE_OUTSIDE_RESERVATION = "write_outside_reservation"
    ADDRESS_SCOPE = "address_scope"
    # Made by the client itself, never sent by the server.
    UNREACHABLE = "unreachable"
    HTTP_ERROR = "http_error"
    MALFORMED_ANSWER = "malformed_answer"  # a success answer that lacks what the client reads from it


# The server's codes (the ones the client makes itself are not among them).
SERVER_CODES = frozenset(EngineCode) - {EngineCode.UNREACHABLE, EngineCode.HTTP_ERROR, EngineCode.MALFORMED_ANSWER}

# A refusal that another try can get past: a conflicting holder, a lapsed queue place, a moved trunk.
REFUSALS = frozenset({EngineCode.RESERVATION_CONFLICT, EngineCode.STALE_PLAN, EngineCode.WAIT_TICKET_EXPIRED})

# The run is no longer this holder's: its lease ran out, it ended, or it is gone.
RUN_LOST = frozenset({EngineCode.LEASE_EXPIRED, EngineCode.RUN_CLOSED, EngineCode.NOT_RUN_HOLDER,
                      EngineCode.RUN_NOT_FOUND})


def refusal(code: str) -> type[KlExit]:
    """The outcome of an engine refusal with ``code``: a stale plan, a conflict, or a plain failure."""
    if code == EngineCode.STALE_PLAN:
        return StalePlan
    return ReservationRefused if code in REFUSALS else Failed
