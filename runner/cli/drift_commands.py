"""The ``kl drift`` and ``kl refresh`` commands: arguments, output and exit codes over
``runner.core.pipeline.drift`` and ``refresh``, which do the work. ``kl drift`` exits 2 when it finds drift
(a finding, not an error).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from runner.cli.changes import terraform_context
from runner.cli.support import EXIT_OK, Commands, client_config, client_options, parse_duration
from runner.core.config import data_dir, default_actor, process_env
from runner.core.engine_client import EngineClient
from runner.core.errors import UsageError

EXIT_DRIFTED = 2


def _request(args: argparse.Namespace, env: dict[str, str]) -> tuple[EngineClient, Any]:
    from runner.core.pipeline import DriftRequest

    config_dir = Path(args.chdir).resolve()
    config = client_config(args, config_dir, env)
    assert config.state
    files = tuple(str(Path(f)) for f in args.file or [])
    for name in files:
        if "/" in name or not name.endswith((".tf", ".tf.json")):
            raise UsageError(f"-f {name}: name a .tf file of the configuration directory (e.g. -f buckets.tf)")
    request = DriftRequest(state=config.state, config_dir=config_dir, files=files, targets=tuple(args.target or ()),
                           actor=getattr(args, "actor", None) or default_actor(env), data_dir=data_dir(env),
                           wait_seconds=getattr(args, "wait", None))
    return EngineClient(config), request


def _context(env: dict[str, str], *, quiet: bool) -> Any:
    ctx = terraform_context(env)
    if quiet:  # --json: stdout carries the document only
        from dataclasses import replace

        ctx = replace(ctx, echo=lambda line: print(line, file=sys.stderr, flush=True))
    return ctx


def cmd_drift(args: argparse.Namespace) -> int:
    from runner.core.pipeline import describe, drift

    env = process_env()
    client, request = _request(args, env)
    result = drift(client, _context(env, quiet=args.json), request)
    if args.json:
        json.dump(result.to_json(), sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        print("\n".join(describe(result)))
    return EXIT_DRIFTED if result.drifted else EXIT_OK


def cmd_refresh(args: argparse.Namespace) -> int:
    from runner.core.pipeline import describe, refresh

    env = process_env()
    client, request = _request(args, env)
    outcome = refresh(client, _context(env, quiet=False), request, dry_run=args.dry_run)
    result = outcome.result
    for line in describe(result)[1:-1]:
        print(line)
    gone = sum(1 for d in result.drifted if d.gone)
    if args.dry_run:
        print(f"dry run: would refresh {len(result.drifted) - gone} and remove {gone} instance(s) of "
              f"{result.state!r} at serial {result.serial}; nothing committed, reservations released")
        return EXIT_OK
    print(f"refresh complete: {len(result.drifted) - gone} refreshed, {gone} removed "
          f"({result.checked} checked)")
    if outcome.serial is not None:
        print(f"committed at serial {outcome.serial} (run {result.run_id})")
    else:
        print(f"nothing changed on the trunk (run {result.run_id})")
    return EXIT_OK


def register(sub: Commands) -> None:
    """Register ``kl drift`` and ``kl refresh`` on the ``kl`` subparsers."""
    def scope_options(p: argparse.ArgumentParser) -> None:
        client_options(p)
        p.add_argument("-f", "--file", action="append", metavar="FILE",
                       help="check only what this .tf file declares (its file-scoped footprint; repeatable)")
        p.add_argument("--target", action="append", metavar="GLOB",
                       help="check only the instances under this address glob (repeatable)")

    drift = sub.add_parser("drift", help="refresh-only check of a slice: which instances drifted (names only)")
    scope_options(drift)
    drift.set_defaults(func=cmd_drift)

    again = sub.add_parser("refresh", help="refresh a slice and commit what the objects are now, row by row")
    scope_options(again)
    again.add_argument("--wait", type=parse_duration, metavar="DURATION",
                       help="wait up to this long for conflicting reservations (default: fail fast)")
    again.add_argument("--actor", help="who is refreshing (default: KL_ACTOR or user@host)")
    again.add_argument("--dry-run", action="store_true", help="report what would be refreshed; commit nothing")
    again.set_defaults(func=cmd_refresh)
