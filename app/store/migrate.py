"""Applies the numbered SQL files in ``migrations/`` in order, once each.

Safe to re-run and safe when two processes start at once: the whole run holds a
transaction-scoped advisory lock, and each file is recorded (with its checksum) in
``schema_migrations`` in the same transaction as its statements.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import psycopg

from app.errors import ConfigError, DatabaseUnavailableError

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"
_FILE = re.compile(r"(\d{4})_([a-z0-9_]+)\.sql")
# An arbitrary constant shared by every Kilolock process: "kilolock" in ASCII, truncated.
_ADVISORY_KEY = 0x6B696C6F6C6F636B

_CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""
_LOCK = "SELECT pg_advisory_xact_lock(%s)"
_APPLIED = "SELECT version, checksum FROM schema_migrations"
_RECORD = "INSERT INTO schema_migrations (version, name, checksum) VALUES (%s, %s, %s)"


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def discover(directory: Path = MIGRATIONS_DIR) -> tuple[Migration, ...]:
    """The migration files, in order. Misnamed files are an error, not silently skipped."""
    found: list[Migration] = []
    for path in sorted(directory.glob("*.sql")):
        match = _FILE.fullmatch(path.name)
        if not match:
            raise ConfigError([f"migration file {path.name!r} must be named NNNN_name.sql"])
        found.append(Migration(int(match.group(1)), match.group(2), path.read_text()))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise ConfigError(["two migration files share a number"])
    return tuple(found)


def connect_or_explain(url: str) -> psycopg.Connection:  # type: ignore[type-arg]
    """A connection, or DatabaseUnavailableError saying where it tried (never the password) and what to check."""
    try:
        return psycopg.connect(url, autocommit=False, connect_timeout=30)
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailableError(_explain(url, exc)) from exc


def _explain(url: str, exc: psycopg.OperationalError) -> str:
    from psycopg.conninfo import conninfo_to_dict

    try:
        parts = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return ("KL_DATABASE_URL is not a valid libpq URL or connection string: use "
                "postgresql://USER@HOST:5432/DBNAME")
    where = f"{parts.get('host') or 'localhost'}:{parts.get('port') or 5432}"
    name = parts.get("dbname") or parts.get("user") or "(default)"
    reason = next((line.strip() for line in str(exc).splitlines() if line.strip()), "no reason given")
    reason = reason.split(": ", 1)[-1] if reason.startswith("connection failed") else reason
    if "does not exist" in reason and "database" in reason:
        hint = f"create it (createdb -h {parts.get('host') or 'localhost'} {name}) or fix the name in KL_DATABASE_URL"
    elif "password" in reason or "authentication" in reason:
        hint = "check the user and password in KL_DATABASE_URL"
    else:
        hint = ("is Postgres running and reachable there? Check the host and port in KL_DATABASE_URL, or unset it "
                "to use the embedded Postgres")
    return f"cannot connect to the database {name!r} on {where}: {reason}. {hint}"


def migrate(url: str, directory: Path = MIGRATIONS_DIR, *, upto: int | None = None) -> list[Migration]:
    """Apply every pending migration (those numbered up to ``upto`` only, when given); return those applied
    now (empty when up to date)."""
    pending = discover(directory)
    applied_now: list[Migration] = []
    with connect_or_explain(url) as conn:
        with conn.transaction():
            conn.execute(_LOCK, (_ADVISORY_KEY,))
            conn.execute(_CREATE_TABLE)
            done = dict(conn.execute(_APPLIED).fetchall())
            for migration in pending:
                if upto is not None and migration.version > upto:
                    break
                if migration.version in done:
                    if done[migration.version] != migration.checksum:
                        raise ConfigError(
                            [f"migration {migration.version:04d}_{migration.name} was edited after it was "
                             "applied; add a new migration instead"]
                        )
                    continue
                conn.execute(migration.sql)  # type: ignore[arg-type]  # a file, never user input
                conn.execute(_RECORD, (migration.version, migration.name, migration.checksum))
                applied_now.append(migration)
    return applied_now
