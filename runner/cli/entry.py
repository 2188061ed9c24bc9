"""The ``kl`` entry point: the parser made of every command module's subcommands, and the one place where
an outcome becomes an exit code and a message.

Each module registers its own commands: ``operator`` (serve, worker, migrate, embedded, tenants, tokens, prune:
beside the service), ``reads`` (states, state, reservations, runs), ``changes`` (plan, apply, recover, abort)
and ``drift`` (drift, refresh). Exit codes: 0 ok (or nothing to do), 1 failed, 2 conflict or stale plan
(re-plan), 3 usage or configuration error: ``EXIT_CODES`` maps each outcome of ``runner.core.errors`` (and the
other errors kl knows) to one of them.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence
from datetime import timedelta

from app.domain.reservations import format_duration
from app.errors import BadRequestError, ConfigError, ConflictError, KlError, NotFoundError
from runner.cli import backup, changes, completion, drift_commands, events, manual_holds, operator, reads
from runner.cli.support import (
    EXIT_CONFLICT,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    KlArgumentParser,
    leaf_parsers,
    package_version,
    print_json,
)
from runner.core.config import ClientConfigError
from runner.core.engine_client import EngineBadRequest, EngineError
from runner.core.errors import EngineCode, Failed, InvalidInput, NothingToDo, ReservationRefused, StalePlan, UsageError
from runner.core.spec import SpecError

# Every error kl knows → its exit code; the first class the error is an instance of decides. An error not
# listed is a bug in kl: its traceback is then the useful output.
EXIT_CODES: tuple[tuple[type[Exception], int], ...] = (
    (NothingToDo, EXIT_OK),
    (Failed, EXIT_FAILED),
    (ReservationRefused, EXIT_CONFLICT),
    (StalePlan, EXIT_CONFLICT),
    (UsageError, EXIT_USAGE),
    (InvalidInput, EXIT_USAGE),
    (ClientConfigError, EXIT_USAGE),
    (SpecError, EXIT_USAGE),
    (EngineBadRequest, EXIT_USAGE),
    (EngineError, EXIT_FAILED),
    # The store's own errors, from the operators' commands.
    (ConfigError, EXIT_USAGE),
    (BadRequestError, EXIT_USAGE),
    (NotFoundError, EXIT_USAGE),
    (ConflictError, EXIT_USAGE),
    (KlError, EXIT_FAILED),
)


def build_parser() -> argparse.ArgumentParser:
    # Every subparser is a KlArgumentParser (usage errors exit 3 with the subcommand's own usage).
    parser = KlArgumentParser(prog="kl", description="Kilolock: Terraform state as rows, applied in parallel.")
    parser.add_argument("--version", action="version", version=f"kl {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    operator.register_service(sub)
    reads.register(sub)
    changes.register(sub)
    manual_holds.register(sub)
    drift_commands.register(sub)
    operator.register_admin(sub)
    backup.register(sub)
    events.register(sub)
    completion.register(sub, build_parser)
    describe(parser)
    return parser


def _prepare(parser: argparse.ArgumentParser) -> None:
    for leaf in leaf_parsers(parser):
        leaf.set_defaults(kl_parser=leaf)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that everything kl holds (a queue place, a Terraform child) is let go."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated()


def describe(parser: argparse.ArgumentParser) -> None:
    """Give every subcommand without a description of its own its one-line help as one, so that
    ``kl COMMAND --help`` says what the command does, as ``kl --help`` lists it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                sub = action.choices[choice.dest]
                if not sub.description and choice.help:
                    sub.description = choice.help[0].upper() + choice.help[1:] + "."
                describe(sub)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    _prepare(parser)
    args = parser.parse_args(argv)
    # A command that handles SIGTERM itself (kl serve, kl worker) installs its own handler over this one.
    installed = threading.current_thread() is threading.main_thread() \
        and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    if installed:
        signal.signal(signal.SIGTERM, _terminate)
    try:
        code = _run(args)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # kl states | head: the reader left; say nothing more, and keep Python from complaining at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED
    finally:
        if installed:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _run(args: argparse.Namespace) -> int:
    try:
        code: int = args.func(args)
        return code
    except Terminated:
        return 143
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        raise
    except Exception as exc:  # noqa: BLE001 - every error kl knows becomes one message and an exit code
        found = exit_code(exc)
        if found is None:
            raise
        code, message = found, _message(exc, args)
        if getattr(args, "json", False):  # the one JSON document, for a wrapper that parses stdout
            print_json({"ok": False, "exit_code": code, "error": message}, getattr(args, "json_out", None))
        print(f"kl: {message}", file=sys.stderr)
        if isinstance(exc, UsageError) and getattr(args, "kl_parser", None) is not None:
            sys.stderr.write(args.kl_parser.format_usage())
        return code


def exit_code(exc: BaseException) -> int | None:
    """The exit code of an error kl knows (``EXIT_CODES``), None for any other."""
    return next((code for kind, code in EXIT_CODES if isinstance(exc, kind)), None)


def _message(exc: BaseException, args: argparse.Namespace) -> str:
    """The error's message and what to do next."""
    if isinstance(exc, KlError):
        return exc.message
    message = str(exc)
    cause = exc.__cause__
    if (isinstance(exc, ReservationRefused) and isinstance(cause, EngineError)
            and cause.code == EngineCode.RESERVATION_CONFLICT):
        return message + _waited(args)
    if isinstance(exc, EngineError):
        return message + _engine_hint(exc, args)
    return message


def _waited(args: argparse.Namespace) -> str:
    wait = getattr(args, "wait", None)
    if not wait:
        return "\n(kl did not wait: pass --wait 5m to wait for the other run to finish, or re-plan)"
    return (f"\n(kl waited {format_duration(timedelta(seconds=wait))}, its --wait, and the conflicting "
            "reservations were still held: wait longer, or re-plan after the other run ends)")


def _engine_hint(exc: EngineError, args: argparse.Namespace) -> str:
    if exc.code == EngineCode.STATE_NOT_FOUND:
        return " (kl states lists the states on the server; check --state, KL_STATE or the backend address)"
    if exc.code == EngineCode.ADDRESS_SCOPE:
        return f" [{EngineCode.ADDRESS_SCOPE}: the token's address scopes; kl tokens list shows them]"
    if exc.status in (401, 403):
        source = getattr(args, "token_source", None)
        if source is None:
            return (" (kl sent no credential: pass --token, set KL_TOKEN or TF_HTTP_PASSWORD, or put a password in "
                    "the backend block)")
        return f" (the credential came from {source}; it takes precedence over the sources after it: --token, " \
               "KL_TOKEN, TF_HTTP_PASSWORD, the backend block)"
    return ""
