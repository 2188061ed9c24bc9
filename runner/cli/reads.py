"""The client's read commands over a server's rows: ``kl states``, ``kl state ls``, ``kl state history``,
``kl reservations`` and ``kl runs``. They reach the server through ``runner.engine_client`` only.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import Any

from app.domain.reservations import format_duration
from runner.cli.support import EXIT_OK, Commands, client_options, connect, print_json


def _span(row: dict[str, Any]) -> str:
    end = row.get("delete_serial")
    return f"[{row['create_serial']}, {'' if end is None else end})"


def cmd_states(args: argparse.Namespace) -> int:
    client, _ = connect(args, need_state=False)
    found = client.list_states()
    if args.json:
        print_json(found)
        return EXIT_OK
    for s in found:
        lock = "  locked" if s["locked"] else ""
        print(f"{s['name']}\tserial {s['current_serial']}\t{s['resources']} resources{lock}")
    return EXIT_OK


def cmd_state_ls(args: argparse.Namespace) -> int:
    client, state = connect(args)
    listing = client.list_resources(state, serial=args.serial, prefix=args.prefix)
    if args.json:
        print_json(listing)
        return EXIT_OK
    for row in listing["resources"]:
        extra = f" (deposed {row['deposed']})" if row["deposed"] else ""
        extra += " (tainted)" if row["status"] == "tainted" else ""
        print(f"{row['address']}{extra}")
    print(f"# {listing['count']} instances in {state!r} at serial {listing['serial']}", file=sys.stderr)
    return EXIT_OK


def cmd_state_history(args: argparse.Namespace) -> int:
    client, state = connect(args)
    rows = client.history(state, args.resource_address)
    if args.json:
        print_json(rows)
        return EXIT_OK
    for row in rows:
        status = "alive" if row["delete_serial"] is None else "closed"
        print(f"serials {_span(row)}\t{status}\thash {row['attributes_hash'][:12]}")
    return EXIT_OK


def _age(moment: str | None, now: datetime) -> str:
    if not moment:
        return "-"
    return format_duration(now - datetime.fromisoformat(moment))


def _left(moment: str | None, now: datetime) -> str:
    if not moment:
        return "no lease"
    return format_duration(datetime.fromisoformat(moment) - now)


def cmd_reservations(args: argparse.Namespace) -> int:
    client, state = connect(args, need_state=False)
    found = client.list_reservations(state or None)
    if args.json:
        print_json([{k: r[k] for k in ("state", "glob", "mode", "holder", "run_id", "acquired_at", "expires_at")}
                     for r in found])
        return EXIT_OK
    now = datetime.now(UTC)
    if not found:
        print("no live reservations")
    for r in found:
        run = r["run_id"] or "terraform lock"
        print(f"{r['state']}\t{r['mode']:<5} {r['glob']}\theld by {r['holder']} ({run}, "
              f"acquired {_age(r['acquired_at'], now)} ago, {'expires in ' if r['expires_at'] else ''}"
              f"{_left(r['expires_at'], now)})")
    return EXIT_OK


def cmd_runs(args: argparse.Namespace) -> int:
    client, state = connect(args, need_state=False)
    found = client.list_runs(state or None, status=args.status)
    if args.json:
        print_json([{k: r[k] for k in ("id", "state", "status", "actor", "started_at", "finished_at",
                                        "base_serial", "committed_serial", "error_summary")} for r in found])
        return EXIT_OK
    for r in found:
        serial = f" serial {r['committed_serial']}" if r["committed_serial"] is not None else ""
        print(f"{r['id']}\t{r['state']}\t{r['status']:<9}\t{r['actor']}\tstarted {r['started_at']}{serial}")
    return EXIT_OK


def register(sub: Commands) -> None:
    """Add the read commands to the ``kl`` subcommands."""
    states = sub.add_parser("states", help="list the states on the server")
    client_options(states)
    states.set_defaults(func=cmd_states)

    state = sub.add_parser("state", help="inspect a state's resource rows")
    state_sub = state.add_subparsers(dest="state_command", required=True, metavar="SUBCOMMAND")
    ls = state_sub.add_parser("ls", help="list resource instances at the head or a serial")
    client_options(ls)
    ls.add_argument("--serial", type=int, help="list as of this serial (default: the head)")
    ls.add_argument("--prefix", help="only addresses under this structured prefix, e.g. module.web")
    ls.set_defaults(func=cmd_state_ls)
    hist = state_sub.add_parser("history", help="one instance's lifecycles across versions")
    client_options(hist)
    hist.add_argument("resource_address", metavar="ADDRESS")
    hist.set_defaults(func=cmd_state_history)

    reservations = sub.add_parser("reservations", help="list live reservations (and Terraform state locks)")
    client_options(reservations)
    reservations.set_defaults(func=cmd_reservations)

    runs = sub.add_parser("runs", help="list apply runs, newest first")
    client_options(runs)
    runs.add_argument("--status", choices=["reserved", "running", "aborting", "committed", "failed", "aborted",
                                           "expired"])
    runs.set_defaults(func=cmd_runs)
