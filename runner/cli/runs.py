"""``kl runs`` and ``kl runs show RUN_ID``: apply runs as an operator reads them — what each was for (its
kind: an apply, a dry run, a drift check…), when it started and finished, how long it took, why it failed,
in local time. Through ``runner.core.engine_client`` only.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from app.domain.durations import format_duration
from app.domain.runkinds import run_kind
from runner.cli.support import EXIT_OK, Commands, client_options, connect, print_json

STATUSES = ("reserved", "running", "aborting", "committed", "failed", "aborted", "expired")
_FIELDS = ("id", "state", "status", "actor", "started_at", "finished_at", "base_serial", "committed_serial",
           "error_summary")
# Audit events that belong to a run's story, as kl runs show names them.
_TIMELINE = {"run_open": "opened, reservations granted", "reservation_acquire": "reservations acquired",
             "run_running": "Terraform started",
             "reservation_renew": "lease renewed", "reservation_release": "reservations released",
             "run_commit": "committed", "run_failed": "failed", "run_aborted": "closed as aborted",
             "run_abort": "aborted by an operator", "run_expired": "lease expired", "run_committed": "closed"}


def local_time(moment: str | None) -> str:
    """``2026-03-01 13:00:05`` in this machine's time zone, or ``-``."""
    if not moment:
        return "-"
    return datetime.fromisoformat(moment).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def took(run: Mapping[str, Any], now: datetime) -> str:
    """From the run's start (or opening) to its end, or to now while it is live (``… so far``)."""
    begun = run.get("started_at") or run.get("created_at")
    if not begun:
        return "-"
    end = run.get("finished_at")
    span = format_duration((datetime.fromisoformat(end) if end else now) - datetime.fromisoformat(begun))
    return span if end else f"{span} so far"


def first_line(text: str | None, width: int = 100) -> str:
    line = next((part.strip() for part in (text or "").splitlines() if part.strip()), "")
    return line if len(line) <= width else line[: width - 1] + "…"


def cmd_runs(args: argparse.Namespace) -> int:
    client, state = connect(args, need_state=False)
    found = client.list_runs(state or None, status=args.status)
    if args.json:
        print_json([{**{k: r.get(k) for k in _FIELDS}, "kind": run_kind(r.get("info")).value} for r in found])
        return EXIT_OK
    if not found:
        print("no apply runs" + (f" with status {args.status}" if args.status else ""))
    now = datetime.now(UTC)
    for r in found:
        serial = f"\tserial {r['committed_serial']}" if r["committed_serial"] is not None else ""
        error = f"\t{first_line(r.get('error_summary'))}" if r.get("error_summary") else ""
        print(f"{r['id']}\t{r['state']}\t{run_kind(r.get('info')).value:<7}\t{r['status']:<9}\t{r['actor']}\t"
              f"started {local_time(r.get('started_at') or r.get('created_at'))}\t"
              f"finished {local_time(r.get('finished_at'))}\t{took(r, now)}{serial}{error}")
    return EXIT_OK


def cmd_runs_show(args: argparse.Namespace) -> int:
    client, _ = connect(args, need_state=False)
    answer = client.get_run(args.run_id)
    run, held = answer["run"], answer.get("reservations", [])
    events = [e for e in client.list_events(run["state"]) if (e.get("detail") or {}).get("run_id") == run["id"]]
    events.reverse()  # oldest first
    if args.json:
        print_json({"run": {**run, "kind": run_kind(run.get("info")).value}, "reservations": held,
                    "events": events})
        return EXIT_OK
    now = datetime.now(UTC)
    print(f"run {run['id']} on {run['state']}: {run_kind(run.get('info')).value}, {run['status']}")
    print(f"  actor:     {run['actor']}")
    print(f"  opened:    {local_time(run.get('created_at'))}")
    print(f"  started:   {local_time(run.get('started_at'))}")
    print(f"  finished:  {local_time(run.get('finished_at'))} ({took(run, now)})")
    print(f"  serials:   base {run.get('base_serial')}, committed {run.get('committed_serial') or '-'}")
    counters = run.get("counters") or {}
    if counters:
        print("  counters:  " + ", ".join(f"{k} {v}" for k, v in sorted(counters.items())))
    if held:
        print("  holds:")
        for r in held:
            print(f"    {r['mode']:<5} {r['glob']}")
    if run.get("error_summary"):
        print("  why it failed:")
        for line in str(run["error_summary"]).splitlines()[-20:]:
            print(f"    {line}")
    if events:
        print("  timeline:")
        for e in events:
            what = _TIMELINE.get(e["kind"], e["kind"].replace("_", " "))
            serial = f" (serial {e['serial']})" if e.get("serial") is not None else ""
            print(f"    {local_time(e.get('created_at'))}  {what}{serial}  by {e['actor']}")
    return EXIT_OK


def register(sub: Commands) -> None:
    """Add kl runs (and kl runs show) to the ``kl`` subcommands."""
    runs = sub.add_parser("runs", help="list apply runs, newest first")
    client_options(runs)
    runs.add_argument("--status", choices=STATUSES, help="only runs with this status (default: every status)")
    runs.set_defaults(func=cmd_runs)
    runs_sub = runs.add_subparsers(dest="runs_command", required=False, metavar="[show RUN_ID]")
    show = runs_sub.add_parser("show", help="one run: what it holds, its timeline, why it failed")
    client_options(show)
    show.add_argument("run_id", metavar="RUN_ID", help="the run (ar_..., from kl runs)")
    show.set_defaults(func=cmd_runs_show)
