"""``kl hold`` and ``kl release``: manual holds on address globs (docs/reservations.md, "Manual holds"),
over the engine lane's holds endpoints."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

from app.domain.reservations import format_duration
from runner.cli.support import EXIT_OK, Commands, client_options, connect, parse_duration, print_json
from runner.core.engine_client import EngineError
from runner.core.errors import EngineCode, ReservationRefused


def _until(hold: dict[str, object]) -> str:
    until = hold.get("until")
    if not isinstance(until, str):
        return "until released"
    return f"until {until} (in {format_duration(datetime.fromisoformat(until) - datetime.now(UTC))})"


def cmd_hold(args: argparse.Namespace) -> int:
    client, state = connect(args)
    body: dict[str, object] = {"globs": list(args.globs), "reason": args.reason,
                               "until_released": bool(args.until_released)}
    if args.until is not None:
        body["until_seconds"] = args.until
    try:
        hold = client.take_hold(state, body)
    except EngineError as exc:
        if exc.code == EngineCode.RESERVATION_CONFLICT:
            raise ReservationRefused(str(exc)) from exc
        raise
    if args.json:
        print_json(hold)
        return EXIT_OK
    print(f"hold {hold['id']} on {hold['state']}: {', '.join(hold['globs'])} held by {hold['holder']} "
          f"({hold['reason']}), {_until(hold)}; end it with: kl release {hold['id']}")
    return EXIT_OK


def cmd_release(args: argparse.Namespace) -> int:
    client, _ = connect(args, need_state=False)
    hold = client.release_hold(args.hold_id)
    if args.json:
        print_json(hold)
        return EXIT_OK
    print(f"released hold {hold['id']} on {hold['state']} ({', '.join(hold['globs'])}, held by {hold['holder']})")
    return EXIT_OK


def cmd_holds(args: argparse.Namespace) -> int:
    client, state = connect(args, need_state=False)
    found = client.list_holds(state or None)
    if args.json:
        print_json(found)
        return EXIT_OK
    if not found:
        print("no live manual holds")
    for h in found:
        print(f"{h['id']}\t{h['state']}\t{', '.join(h['globs'])}\theld by {h['holder']}: {h['reason']} "
              f"({_until(h)})")
    return EXIT_OK


def register(sub: Commands) -> None:
    """Add kl hold, kl holds and kl release to the ``kl`` subcommands."""
    hold = sub.add_parser("hold", help="hold address globs for out-of-band work or a change freeze")
    client_options(hold)
    hold.add_argument("globs", nargs="+", metavar="GLOB", help="address globs to hold, e.g. 'module.db.*'")
    hold.add_argument("--reason", required=True, help="why (shown to everyone the hold stops; no secrets)")
    until = hold.add_mutually_exclusive_group()
    until.add_argument("--until", type=parse_duration, metavar="DURATION",
                       help="how long the hold lasts, e.g. 2h (default: KL_HOLD_DEFAULT_SECONDS)")
    until.add_argument("--until-released", action="store_true",
                       help="no expiry: held until kl release (tokens listed in KL_HOLD_UNTIL_RELEASED)")
    hold.set_defaults(func=cmd_hold)

    holds = sub.add_parser("holds", help="list live manual holds")
    client_options(holds)
    holds.set_defaults(func=cmd_holds)

    release = sub.add_parser("release", help="release a manual hold")
    client_options(release)
    release.add_argument("hold_id", metavar="HOLD", help="the hold's id (ar_..., from kl hold or kl reservations)")
    release.set_defaults(func=cmd_release)
