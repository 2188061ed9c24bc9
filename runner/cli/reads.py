"""The client's read commands over a server's rows: ``kl states``, ``kl state ls``, ``kl state history``,
``kl blame``, ``kl reservations`` and ``kl runs`` (in ``runner.cli.runs``). They reach the server through
``runner.core.engine_client`` only.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import Any

from app.domain.reservations import format_duration
from runner.cli import runs
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
    if not found:
        print(f"no states visible on {client.config.base_url}: none written yet, or none this credential may see")
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


def describe_writer(by: dict[str, Any] | None) -> str:
    """Who wrote a version, in words: "PR #12 (owner/repo, by alice, merge 1a2b3c4d5e6f)" or "token ci via
    terraform"."""
    if not by:
        return "an unrecorded writer"
    if by.get("pull_request") is not None:
        extra = [x for x in (by.get("repository"), f"by {by['pull_request_author']}" if by.get(
            "pull_request_author") else None, f"merge {by['merge_commit'][:12]}" if by.get("merge_commit") else None)
            if x]
        return f"PR #{by['pull_request']}" + (f" ({', '.join(extra)})" if extra else "")
    who = f"token {by['token']}" if by.get("token") else by.get("actor") or "anonymous"
    if by.get("token") and by.get("actor") and by["actor"] != by["token"]:
        who += f" (as {by['actor']})"
    run = f", run {by['run_id']}" if by.get("run_id") else ""
    return f"{who} via {by['lane']}{run}"


def cmd_blame(args: argparse.Namespace) -> int:
    client, state = connect(args)
    page = client.blame(state, args.glob, after=args.after or "", limit=args.limit, changes=args.changes)
    if args.json:
        print_json(page)
        return EXIT_OK
    now = datetime.now(UTC)
    for item in page["instances"]:
        deposed = f" (deposed {item['deposed']})" if item["deposed"] else ""
        print(f"{item['address']}{deposed}")
        for change in item["changes"]:
            by = change.get("by") or {}
            names = change.get("attributes")
            what = ""
            if names:
                what = " " + ", ".join(names)
            if change.get("sensitive"):
                what += f" (+{change['sensitive']} sensitive)"
            print(f"  serial {change['serial']:>6}  {change['kind']:<9}{what}  by {describe_writer(by)}, "
                  f"{_age(by.get('at'), now)} ago")
        if item["more"]:
            print("  ... older changes left out (raise --changes)")
    if not page["instances"]:
        print(f"no instance under {args.glob!r} on this page", file=sys.stderr)
    if page.get("next_after"):
        print(f"# more addresses: run again with --after {page['next_after']!r}", file=sys.stderr)
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
    hist.add_argument("resource_address", metavar="ADDRESS",
                      help="an instance address, e.g. module.web.aws_instance.a[0]")
    hist.set_defaults(func=cmd_state_history)

    blame = sub.add_parser("blame", help="who created, changed and destroyed the instances under an address or glob")
    client_options(blame)
    blame.add_argument("glob", metavar="ADDRESS_OR_GLOB", help="an instance address or a glob, e.g. module.db.*")
    blame.add_argument("--after", help="continue after this address (printed when a page is full)")
    blame.add_argument("--limit", type=int, default=100, help="addresses per page (1 to 1000, default 100)")
    blame.add_argument("--changes", type=int, default=20,
                       help="newest lifecycles shown per address (1 to 200, default 20)")
    blame.set_defaults(func=cmd_blame)

    reservations = sub.add_parser("reservations", help="list live reservations (and Terraform state locks)")
    client_options(reservations)
    reservations.set_defaults(func=cmd_reservations)

    runs.register(sub)
