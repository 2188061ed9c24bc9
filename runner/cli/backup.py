"""``kl backup`` and ``kl restore``: the whole database (every tenant, token hash, state, version, row, run,
reservation, audit event, drift report and bot table) into one archive and back, between any two
supported Postgres versions. The archive format and its SQL belong to ``app.store.backup``; this module
only chooses the database (the operators' settings: ``KL_DATABASE_URL``, else the embedded Postgres) and
shows progress and the verified counts.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from runner.cli.support import EXIT_OK, Commands, package_version, print_json

# On a terminal the progress line is rewritten at most this often; elsewhere a long table gets a line this often.
_TTY_EVERY = 0.2
_LOG_EVERY = 10.0


class ProgressPrinter:
    """Progress on stderr: one line rewritten in place on a terminal, a line per table (and one every
    ``_LOG_EVERY`` seconds during a long table) otherwise."""

    def __init__(self, stream: TextIO, *, clock: Any = time.monotonic) -> None:
        self.stream, self.clock = stream, clock
        self.tty = stream.isatty()
        self.last = float("-inf")

    def __call__(self, step: Any) -> None:
        now = self.clock()
        if not step.done and now - self.last < (_TTY_EVERY if self.tty else _LOG_EVERY):
            return
        self.last = now
        of = f" of {step.expected:,}" if step.expected is not None else ""
        line = f"{step.action}: {step.table}: {step.rows:,}{of} rows, {_size(step.bytes)}{' done' if step.done else ''}"
        if self.tty:
            self.stream.write("\r\033[K" + line + ("\n" if step.done else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


def _database_url() -> str:
    from app.config import Settings
    from app.web import resolve_database_url

    return resolve_database_url(Settings.from_env())


def cmd_backup(args: argparse.Namespace) -> int:
    from app.store.backup import backup

    quiet = args.quiet or args.json
    manifest = backup(_database_url(), Path(args.file), made_by=f"kl {package_version()}",
                      progress=None if quiet else ProgressPrinter(sys.stderr))
    if args.json:
        print_json({"file": str(args.file), "schema_version": manifest.schema_version,
                    "server_version": manifest.server_version,
                    "tables": {t.name: t.rows for t in manifest.tables}})
        return EXIT_OK
    print(f"wrote {args.file}: {len(manifest.tables)} tables, {manifest.total_rows:,} rows "
          f"(schema {manifest.schema_version}, from Postgres {manifest.server_version})")
    return EXIT_OK


def cmd_restore(args: argparse.Namespace) -> int:
    from app.store.backup import restore

    quiet = args.quiet or args.json
    report = restore(_database_url(), Path(args.file), replace=args.replace,
                     progress=None if quiet else ProgressPrinter(sys.stderr))
    if args.json:
        print_json({"file": str(args.file), "schema_version": report.manifest.schema_version,
                    "tables": dict(report.counts), "migrated": list(report.migrated), "verified": True})
        return EXIT_OK
    width = max(len(name) for name, _ in report.counts)
    print(f"restored {args.file} (made by {report.manifest.made_by} on {report.manifest.created_at}, "
          f"from Postgres {report.manifest.server_version}); rows per table, verified against the backup:")
    for name, count in report.counts:
        print(f"  {name:<{width}}  {count:>10,}")
    if report.migrated:
        print(f"then applied the newer migrations: {', '.join(report.migrated)}")
    return EXIT_OK


def register(sub: Commands) -> None:
    """Add kl backup and kl restore to the ``kl`` subcommands."""
    b = sub.add_parser("backup", help="write the whole database to one archive (any Postgres version)",
                       description="Write every table of the Kilolock database (KL_DATABASE_URL, else the "
                                   "embedded Postgres) to FILE: a tar of compressed COPY text with a manifest of "
                                   "per-table counts and checksums. The archive holds state content and token "
                                   "hashes: keep it as safe as the database.")
    b.add_argument("file", metavar="FILE", help="archive to write (replaced once complete)")
    _report_options(b, counts="the per-table counts")
    b.set_defaults(func=cmd_backup)

    r = sub.add_parser("restore", help="load a kl backup into the database, verifying every count",
                       description="Load FILE, made by kl backup, into the Kilolock database (KL_DATABASE_URL, "
                                   "else the embedded Postgres), migrating it first. One transaction: a damaged "
                                   "archive, or any count or checksum that differs, restores nothing. Stop the "
                                   "servers using the database first.")
    r.add_argument("file", metavar="FILE", help="archive written by kl backup")
    r.add_argument("--replace", action="store_true",
                   help="discard what the database holds (default: refuse unless it is empty)")
    _report_options(r, counts="the verified per-table counts")
    r.set_defaults(func=cmd_restore)


def _report_options(parser: argparse.ArgumentParser, *, counts: str) -> None:
    """How kl backup and kl restore report: progress on stderr unless ``--quiet``, and ``counts`` as JSON
    with ``--json``."""
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    parser.add_argument("--json", action="store_true", help=f"print {counts} as JSON")
