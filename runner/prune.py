"""``kl prune``: remove the raw bytes of old state versions now (operators with database access).

The same rules as the server's periodic job (``app.web.pruning``), from ``KL_RETAIN_VERSIONS`` and
``KL_RETAIN_DAYS`` unless ``--keep`` / ``--older-than-days`` are given. Rows, outputs and the version rows stay.
"""

from __future__ import annotations

import argparse
import json
from datetime import timedelta
from typing import Any


def register(sub: Any) -> None:
    """Add ``kl prune`` to the parser's subcommands."""
    p = sub.add_parser("prune", help="remove the raw bytes of old state versions (retention; operators)")
    p.add_argument("--keep", type=int, metavar="N",
                   help="keep the bytes of the newest N versions of each state (default: KL_RETAIN_VERSIONS)")
    p.add_argument("--older-than-days", type=int, metavar="DAYS",
                   help="prune only versions older than DAYS days (default: KL_RETAIN_DAYS)")
    p.add_argument("--dry-run", action="store_true", help="report what would be removed; change nothing")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_prune)


def cmd_prune(args: argparse.Namespace) -> int:
    from app.config import Settings
    from app.store import Database, prune
    from app.store.migrate import migrate
    from app.web import resolve_database_url
    from runner.cli import UsageError

    settings = Settings.from_env()
    keep = settings.retain_versions if args.keep is None else args.keep
    days = settings.retain_days if args.older_than_days is None else args.older_than_days
    if keep < 0 or days < 0:
        raise UsageError("--keep and --older-than-days must be zero or more")
    policy = prune.RetentionPolicy(keep_versions=keep or None, keep_age=timedelta(days=days) if days else None)
    if not policy.enabled:
        raise UsageError("retention is off: pass --keep N and/or --older-than-days DAYS, or set "
                         "KL_RETAIN_VERSIONS / KL_RETAIN_DAYS")
    url = resolve_database_url(settings)
    migrate(url)
    db = Database(url, pool_size=2)
    try:
        report = prune.prune(db, policy, dry_run=args.dry_run)
    finally:
        db.close()
    if args.json:
        print(json.dumps({"states": report.states, "versions": report.versions, "bytes": report.bytes,
                          "dry_run": report.dry_run, "rule": policy.describe()}))
        return 0
    verb = "would remove" if report.dry_run else "removed"
    print(f"{verb} the raw bytes of {report.versions} versions in {report.states} states "
          f"({report.bytes:,} bytes); rule: versions {policy.describe()}")
    return 0
