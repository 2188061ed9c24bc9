"""What every kl command shares: the argument parser's conventions, the client options and the client
they build, JSON output, and durations.

The parser exits 3 on every usage error (2 means "conflict or stale plan: re-plan" to a CI wrapper),
and shows the usage of the subcommand that was misused, not the top level's.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NoReturn, TypeAlias, TypeVar, overload

from app.domain import durations
from runner.core.config import ClientConfig, ClientConfigError, resolve
from runner.core.engine_client import EngineClient

_N = TypeVar("_N")

EXIT_OK, EXIT_FAILED, EXIT_CONFLICT, EXIT_USAGE = 0, 1, 2, 3

# What a command module registers its commands on: the ``kl`` parser's subcommands.
Commands: TypeAlias = "argparse._SubParsersAction[KlArgumentParser]"


class KlArgumentParser(argparse.ArgumentParser):
    """argparse with kl's conventions: exit 3 and this (sub)command's usage on a usage error."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(self.format_usage())
        sys.stderr.write(f"{self.prog}: error: {message}\n(run {self.prog} --help for every option)\n")
        raise SystemExit(EXIT_USAGE)

    @overload
    def parse_known_args(self, args: Iterable[str] | None = None,
                         namespace: None = None) -> tuple[argparse.Namespace, list[str]]: ...

    @overload
    def parse_known_args(self, args: Iterable[str] | None, namespace: _N) -> tuple[_N, list[str]]: ...

    @overload
    def parse_known_args(self, *, namespace: _N) -> tuple[_N, list[str]]: ...

    def parse_known_args(self, args: Iterable[str] | None = None, namespace: Any = None) -> tuple[Any, list[str]]:
        parsed, extra = super().parse_known_args(args, namespace)
        # A leaf command reports its own unknown flags, so the usage shown is the command's own.
        if extra and not any(isinstance(a, argparse._SubParsersAction) for a in self._actions):
            self.error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed, extra


def leaf_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every parser that runs a command (no subcommands of its own), depth first."""
    found: list[argparse.ArgumentParser] = []
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [parser]
    for action in subs:
        for sub in dict.fromkeys(action.choices.values()):
            found.extend(leaf_parsers(sub))
    return found


def print_json(value: Any, stream: Any = None) -> None:
    import json

    out = stream or sys.stdout
    json.dump(value, out, indent=2, sort_keys=True, default=str)
    out.write("\n")


@contextlib.contextmanager
def json_mode(args: argparse.Namespace) -> Any:
    """With --json, everything a command says goes to stderr; stdout carries only the JSON document."""
    if not getattr(args, "json", False):
        yield
        return
    args.json_out = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        yield


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``5m``, ``1h30m`` → seconds (``app.domain.durations``), as an argparse type."""
    try:
        return durations.parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kilolock")
    except PackageNotFoundError:
        return "(not installed)"


def client_options(p: argparse.ArgumentParser) -> None:
    """The options of every command that talks to a server (see "Options shared by the client commands")."""
    p.add_argument("-C", "--chdir", default=".", metavar="DIR",
                   help="configuration directory, whose backend block names the server (default: .)")
    p.add_argument("--address", help="server or backend address (default: the backend block)")
    p.add_argument("--state", help="state name (default: from the backend address)")
    p.add_argument("--token", help="API token (default: KL_TOKEN, TF_HTTP_PASSWORD, the backend block)")
    p.add_argument("--json", action="store_true", help="print JSON")


def client_config(args: argparse.Namespace, config_dir: Path, env: dict[str, str] | None = None, *,
                  need_state: bool = True, address: str | None = None, state: str | None = None,
                  texts: Mapping[str, str] | None = None) -> ClientConfig:
    """The server and state of the client options (``address``/``state`` when the options give none), noting
    where the credential came from for the error hints; ``texts``: the configuration's files when the caller
    has read them already (``runner.core.config.backend_texts``)."""
    config = resolve(config_dir=config_dir, address=args.address or address, state=state or args.state,
                     token=args.token, env=env, texts=texts)
    args.token_source = config.token_source
    if need_state and not config.state:
        raise ClientConfigError("no state name: pass --state NAME or use a backend address ending in /v1/states/NAME")
    return config


def connect(args: argparse.Namespace, *, need_state: bool = True) -> tuple[EngineClient, str]:
    """The engine client of the client options, and the state they name (empty when none is needed)."""
    config = client_config(args, Path(args.chdir), need_state=need_state)
    return EngineClient(config), config.state or ""
