"""Every error kl knows, as one message and an exit code, with what to do next.

``explain(exc, args)`` returns ``(exit code, message)``, or None for an error kl does not know (a
bug: the traceback is then the useful output).
"""

from __future__ import annotations

import argparse
from datetime import timedelta

from app.domain.reservations import format_duration
from app.errors import ConfigError, KlError
from runner.cli_support import EXIT_CONFLICT, EXIT_FAILED, EXIT_USAGE, UsageError
from runner.config import ClientConfigError
from runner.engine_client import EngineError
from runner.plan import KlExit
from runner.spec import SpecError

_CONFLICTS = ("reservation_conflict", "wait_timeout")


def explain(exc: BaseException, args: argparse.Namespace) -> tuple[int, str] | None:
    if isinstance(exc, KlExit):
        message = str(exc)
        cause = exc.__cause__
        if exc.code == EXIT_CONFLICT and isinstance(cause, EngineError) and cause.code in _CONFLICTS:
            message += _waited(args)
        return exc.code, message
    if isinstance(exc, UsageError | ClientConfigError | SpecError):
        return EXIT_USAGE, str(exc)
    if isinstance(exc, ConfigError):
        return EXIT_USAGE, exc.message
    if isinstance(exc, EngineError):
        return (EXIT_USAGE if exc.status == 400 else EXIT_FAILED), str(exc) + _engine_hint(exc, args)
    if isinstance(exc, KlError):
        return (EXIT_USAGE if exc.status in (400, 404, 409) else EXIT_FAILED), exc.message
    return None


def _waited(args: argparse.Namespace) -> str:
    wait = getattr(args, "wait", None)
    if not wait:
        return "\n(kl did not wait: pass --wait 5m to wait for the other run to finish, or re-plan)"
    return (f"\n(kl waited {format_duration(timedelta(seconds=wait))}, its --wait, and the conflicting "
            "reservations were still held: wait longer, or re-plan after the other run ends)")


def _engine_hint(exc: EngineError, args: argparse.Namespace) -> str:
    if exc.code == "state_not_found":
        return " (kl states lists the states on the server; check --state, KL_STATE or the backend address)"
    if exc.status in (401, 403):
        source = getattr(args, "token_source", None)
        if source is None:
            return (" (kl sent no credential: pass --token, set KL_TOKEN or TF_HTTP_PASSWORD, or put a password in "
                    "the backend block)")
        return f" (the credential came from {source}; it takes precedence over the sources after it: --token, " \
               "KL_TOKEN, TF_HTTP_PASSWORD, the backend block)"
    return ""
