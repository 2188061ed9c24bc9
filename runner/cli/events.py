"""``kl events``: the operator's commands for outgoing events (docs/events.md): endpoints, deliveries,
dead letters and re-driving one. Like ``kl tenants``, they talk to the database KL_DATABASE_URL names."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from runner.cli.support import EXIT_OK, Commands, print_json
from runner.core.errors import UsageError


@contextmanager
def _db() -> Iterator[Any]:
    from runner.cli.operator import _operator_db

    db = _operator_db()
    try:
        yield db
    finally:
        db.close()


def cmd_endpoints_add(args: argparse.Namespace) -> int:
    from app.errors import BadRequestError
    from app.store import outbox

    try:
        with _db() as db:
            endpoint, secret = outbox.add_endpoint(db, name=args.name, url=args.url, fmt=args.format,
                                                   states=args.state or [], globs=args.glob or [])
    except BadRequestError as exc:
        raise UsageError(str(exc)) from exc
    if args.json:
        print_json({"endpoint": endpoint.to_json(), "secret": secret})
    else:
        print(f"added endpoint {endpoint.name}; its signing secret (shown once): {secret}")
    return EXIT_OK


def cmd_endpoints_list(args: argparse.Namespace) -> int:
    from app.store import outbox

    with _db() as db:
        found = outbox.list_endpoints(db)
    if args.json:
        print_json([e.to_json() for e in found])
        return EXIT_OK
    for e in found:
        print(f"{e.name}\t{e.format}\t{e.url}\tcursor {e.cursor_id}" + (f"\tretrying: {e.last_error}"
                                                                         if e.last_error else ""))
    return EXIT_OK


def cmd_endpoints_remove(args: argparse.Namespace) -> int:
    from app.store import outbox

    with _db() as db:
        removed = outbox.remove_endpoint(db, args.name)
    if not removed:
        raise UsageError(f"no event endpoint named {args.name!r}")
    print(f"removed endpoint {args.name}")
    return EXIT_OK


def cmd_deliveries(args: argparse.Namespace) -> int:
    from app.store import outbox

    with _db() as db:
        found = outbox.deliveries(db, status="dead" if args.dead else None, limit=args.limit)
    if args.json:
        print_json([{"endpoint": d.endpoint, "event_id": f"evt_{d.event_id}", "status": d.status,
                     "attempts": d.attempts, "last_error": d.last_error, "at": d.at.isoformat()} for d in found])
        return EXIT_OK
    for d in found:
        print(f"{d.at.isoformat()}\t{d.endpoint}\tevt_{d.event_id}\t{d.status}\t{d.attempts}\t{d.last_error or ''}")
    return EXIT_OK


def cmd_redrive(args: argparse.Namespace) -> int:
    from app.config import Settings
    from runner.bot.outgoing import redrive

    event = args.event.removeprefix("evt_")
    if not event.isdigit():
        raise UsageError(f"an event id looks like evt_123, not {args.event!r}")
    with _db() as db:
        delivered = redrive(db, args.endpoint, int(event), timeout=Settings.from_env().event_timeout_seconds)
    if not delivered:
        raise UsageError(f"evt_{event} was not delivered to {args.endpoint!r} (no such endpoint or event, "
                         "or the endpoint refused it again)")
    print(f"delivered evt_{event} to {args.endpoint}")
    return EXIT_OK


def register(sub: Commands) -> None:
    """Add ``kl events`` to the ``kl`` subcommands."""
    events = sub.add_parser("events", help="outgoing events: endpoints, deliveries, dead letters (operators)")
    events_sub = events.add_subparsers(dest="events_command", required=True, metavar="SUBCOMMAND")
    endpoints = events_sub.add_parser("endpoints", help="the HTTP endpoints events are delivered to")
    endpoints_sub = endpoints.add_subparsers(dest="endpoints_command", required=True, metavar="SUBCOMMAND")
    add = endpoints_sub.add_parser("add", help="deliver events from now on to URL")
    add.add_argument("name", help="a name for the endpoint, unique among them")
    add.add_argument("url", help="where to POST each event (http or https, no credentials in the URL)")
    add.add_argument("--format", choices=("webhook", "slack"), default="webhook",
                     help="signed JSON events, or Slack incoming-webhook messages (default: webhook)")
    add.add_argument("--state", action="append", metavar="NAME", help="only events of this state (repeatable)")
    add.add_argument("--glob", action="append", metavar="GLOB", help="only events about these addresses")
    add.add_argument("--json", action="store_true", help="print JSON")
    add.set_defaults(func=cmd_endpoints_add)
    listing = endpoints_sub.add_parser("list", help="the configured endpoints (never their secrets)")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(func=cmd_endpoints_list)
    remove = endpoints_sub.add_parser("remove", help="stop delivering to an endpoint")
    remove.add_argument("name", help="the endpoint's name")
    remove.set_defaults(func=cmd_endpoints_remove)
    deliveries = events_sub.add_parser("deliveries", help="the newest delivery records")
    deliveries.add_argument("--dead", action="store_true", help="only dead letters")
    deliveries.add_argument("--limit", type=int, default=100, help="how many records at most (default: 100)")
    deliveries.add_argument("--json", action="store_true", help="print JSON")
    deliveries.set_defaults(func=cmd_deliveries)
    again = events_sub.add_parser("redrive", help="post a dead-lettered event to its endpoint again")
    again.add_argument("endpoint", help="the endpoint's name")
    again.add_argument("event", metavar="EVENT_ID", help="the event's id as deliveries list it (evt_123)")
    again.set_defaults(func=cmd_redrive)
