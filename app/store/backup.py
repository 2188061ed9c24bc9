"""Backup and restore of a whole Kilolock database, in an archive of Kilolock's own that any supported
Postgres version can write and read (pg_dump's archives are bound to the version that made them).

Owns: the archive format and every statement that reads or loads it. An archive is an uncompressed tar
holding ``manifest.json`` first (format, schema version, source server, and per table its columns, row
count, byte count and the SHA-256 of its data), then one gzip-compressed member per table in the text
form of ``COPY`` (``tables/NAME.copy.gz``), made under fixed session settings (UTC, ISO dates, hex bytea)
so that the text is the same whichever server writes it. Every base table of the schema is included, so a
table a later migration adds is backed up without a change here; ``schema_migrations`` is not (the
restoring side migrates to the archive's version itself).

A backup reads one snapshot (a repeatable-read, read-only transaction). A restore migrates the target to
the archive's schema version, then in one transaction empties every table, loads every member (checking
each member's SHA-256 as it streams), sets the sequences, and verifies each table's row count and a
re-read of its content against the manifest before it commits; the later migrations run after that.
Anything that does not match rolls the whole restore back.

Must not: print (progress goes to the caller's callback), read the process environment, or load a member
into a table the target does not have.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import psycopg
from psycopg import sql

from app.errors import ArchiveError, DatabaseNotEmptyError
from app.store.migrate import connect_or_explain, discover, migrate

ARCHIVE_FORMAT = "kilolock-backup/1"
MANIFEST = "manifest.json"
_CHUNK = 1 << 20

# Fixed so that COPY's text is the same from every server and every client setting.
_SESSION = ("SET TIME ZONE 'UTC'", "SET DateStyle = 'ISO, YMD'", "SET IntervalStyle = 'postgres'",
            "SET bytea_output = 'hex'", "SET extra_float_digits = 1", "SET statement_timeout = 0")

# Tables whose rows a freshly migrated, or freshly started, database already has: the migrations' default
# tenant and the secrets and throttle counters a server makes at its first request. Holding only these
# still counts as empty for a restore.
_DISPOSABLE = frozenset({"server_secrets", "auth_throttle"})
_SEEDED_TENANT = "default"

_TABLES = """
SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND NOT c.relispartition
   AND c.relname <> 'schema_migrations'
 ORDER BY c.relname
"""
_COLUMNS = """
SELECT a.attname FROM pg_attribute a
 WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
 ORDER BY a.attnum
"""
_PRIMARY_KEY = """
SELECT a.attname FROM pg_index i JOIN unnest(i.indkey) WITH ORDINALITY AS k(attnum, position) ON true
  JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
 WHERE i.indrelid = to_regclass(%s) AND i.indisprimary
 ORDER BY k.position
"""
# Foreign keys checked at once (not deferrable) decide the load order; deferred ones are checked at commit.
_REFERENCES = """
SELECT c.conrelid::regclass::text, c.confrelid::regclass::text FROM pg_constraint c
 WHERE c.contype = 'f' AND NOT c.condeferrable AND c.conrelid <> c.confrelid
   AND c.connamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())
"""
# References a trigger checks at once, as such a foreign key would (``resources.state_id``, migration 0028).
_CHECKED_BY_TRIGGERS = (("resources", "states"),)
_SCHEMA_VERSION = "SELECT COALESCE(max(version), 0) FROM schema_migrations"
_SERIALS = """
SELECT a.attname, pg_get_serial_sequence(%s, a.attname) FROM pg_attribute a
 WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped
   AND pg_get_serial_sequence(%s, a.attname) IS NOT NULL
"""


@dataclass(frozen=True, slots=True)
class TableCopy:
    """One table in an archive: its columns (in the archive's order), the order its rows were read in,
    and what its data came to."""

    name: str
    columns: tuple[str, ...]
    order_by: tuple[str, ...]
    rows: int
    bytes: int
    sha256: str

    @property
    def member(self) -> str:
        return f"tables/{self.name}.copy.gz"


@dataclass(frozen=True, slots=True)
class Manifest:
    format: str
    schema_version: int
    server_version: str
    made_by: str
    created_at: str
    tables: tuple[TableCopy, ...]

    @property
    def total_rows(self) -> int:
        return sum(t.rows for t in self.tables)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=2, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Manifest:
        try:
            data = json.loads(raw)
            if data.get("format") != ARCHIVE_FORMAT:
                raise ArchiveError(f"not a Kilolock backup of format {ARCHIVE_FORMAT} "
                                   f"(its manifest says {data.get('format')!r})")
            tables = tuple(TableCopy(name=str(t["name"]), columns=tuple(map(str, t["columns"])),
                                     order_by=tuple(map(str, t["order_by"])), rows=int(t["rows"]),
                                     bytes=int(t["bytes"]), sha256=str(t["sha256"])) for t in data["tables"])
            return cls(format=data["format"], schema_version=int(data["schema_version"]),
                       server_version=str(data["server_version"]), made_by=str(data["made_by"]),
                       created_at=str(data["created_at"]), tables=tables)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ArchiveError(f"the backup's manifest is unreadable ({exc.__class__.__name__}): is this file "
                               "a kl backup?") from None


@dataclass(frozen=True, slots=True)
class Progress:
    """Where a long copy is: ``rows`` of ``table`` so far (of ``expected`` when known); ``done`` once the
    table is complete."""

    action: str
    table: str
    rows: int
    bytes: int
    expected: int | None
    done: bool


ProgressCallback = Callable[[Progress], None]


@dataclass(frozen=True, slots=True)
class RestoreReport:
    manifest: Manifest
    counts: tuple[tuple[str, int], ...]  # each table's rows in the target after the restore, verified
    migrated: tuple[str, ...]  # the migrations applied after the load (the archive was older)


def backup(url: str, path: Path, *, made_by: str, progress: ProgressCallback | None = None) -> Manifest:
    """Write an archive of the database at ``url`` to ``path`` (through a temporary file beside it, renamed
    into place once complete)."""
    report = progress or (lambda _: None)
    path = path.absolute()
    with tempfile.TemporaryDirectory(prefix=".kl-backup-", dir=path.parent) as scratch, \
            connect_or_explain(url) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.read_only = True
        with conn.transaction():
            for statement in _SESSION:
                conn.execute(statement)  # type: ignore[arg-type]  # constants above
            tables = [_dump_table(conn, name, Path(scratch), report) for name in _load_order(conn)]
            schema_version = int(_one(conn, _SCHEMA_VERSION))
            server_version = str(_one(conn, "SHOW server_version"))
        manifest = Manifest(format=ARCHIVE_FORMAT, schema_version=schema_version, server_version=server_version,
                            made_by=made_by, created_at=datetime.now(UTC).isoformat(timespec="seconds"),
                            tables=tuple(tables))
        partial = Path(scratch) / "archive.tar"
        with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
            _add_member(tar, MANIFEST, io.BytesIO(manifest.to_json()), len(manifest.to_json()))
            for table in tables:
                member = Path(scratch) / f"{table.name}.gz"
                with member.open("rb") as data:
                    _add_member(tar, table.member, data, member.stat().st_size)
                member.unlink()
        os.replace(partial, path)
    return manifest


def read_manifest(path: Path) -> Manifest:
    """The manifest of the archive at ``path`` (its first member), without reading the tables."""
    with _open_archive(path) as tar:
        return _first_manifest(tar)


def restore(url: str, path: Path, *, replace: bool = False, progress: ProgressCallback | None = None) -> RestoreReport:
    """Load the archive at ``path`` into the database at ``url``: refused (DatabaseNotEmptyError) when the
    target holds data of its own unless ``replace``, which then discards it; ArchiveError when the archive
    is damaged, from a newer schema, or does not match its manifest. Nothing is changed on a refusal."""
    report = progress or (lambda _: None)
    with _open_archive(path) as tar:
        manifest = _first_manifest(tar)
        known = max((m.version for m in discover()), default=0)
        if manifest.schema_version > known:
            raise ArchiveError(f"the backup has schema version {manifest.schema_version}, newer than this kl's "
                               f"{known}: restore it with the kl version that made it ({manifest.made_by}) or newer")
        migrate(url, upto=manifest.schema_version)
        with connect_or_explain(url) as conn:
            with conn.transaction():
                for statement in _SESSION:
                    conn.execute(statement)  # type: ignore[arg-type]  # constants above
                present = _tables(conn)
                missing = [t.name for t in manifest.tables if t.name not in present]
                if missing:
                    raise ArchiveError(f"the target database has no table {', '.join(missing)}: restore into a "
                                       "database migrated by this kl")
                if not replace:
                    _refuse_if_holding_data(conn, present)
                conn.execute(sql.SQL("TRUNCATE {} RESTART IDENTITY CASCADE").format(
                    sql.SQL(", ").join(sql.Identifier(t) for t in sorted(present))))
                loaded = {t.name: t for t in manifest.tables}
                for member in _members(tar):
                    table = next((t for t in manifest.tables if t.member == member.name), None)
                    if table is None or table.name not in loaded:
                        raise ArchiveError(f"the backup holds {member.name!r}, which its manifest does not list "
                                           "(or lists twice)")
                    _load_table(conn, table, tar, member, report)
                    del loaded[table.name]
                if loaded:
                    raise ArchiveError(f"the backup is truncated: no data for {', '.join(sorted(loaded))}")
                counts = tuple(_verify_table(conn, table) for table in manifest.tables)
        applied = migrate(url)
    return RestoreReport(manifest=manifest, counts=counts,
                         migrated=tuple(f"{m.version:04d}_{m.name}" for m in applied))


def _dump_table(conn: psycopg.Connection, name: str, scratch: Path, report: ProgressCallback) -> TableCopy:
    columns = tuple(r[0] for r in conn.execute(_COLUMNS, (name,)).fetchall())
    order_by = tuple(r[0] for r in conn.execute(_PRIMARY_KEY, (name,)).fetchall()) or columns
    digest, rows, size = hashlib.sha256(), 0, 0
    with gzip.open(scratch / f"{name}.gz", "wb", compresslevel=6) as out:
        for chunk in _copy_out(conn, name, columns, order_by):
            out.write(chunk)
            digest.update(chunk)
            rows += chunk.count(b"\n")
            size += len(chunk)
            report(Progress("backup", name, rows, size, None, done=False))
    report(Progress("backup", name, rows, size, None, done=True))
    return TableCopy(name=name, columns=columns, order_by=order_by, rows=rows, bytes=size,
                     sha256=digest.hexdigest())


def _copy_out(conn: psycopg.Connection, name: str, columns: tuple[str, ...],
              order_by: tuple[str, ...]) -> Iterator[bytes]:
    """The table's rows as COPY text, in ``order_by`` order (so a re-read of the same rows is the same text).
    In the text form each row ends in a newline and newlines inside values are escaped: rows = newlines."""
    query = sql.SQL("COPY (SELECT {} FROM {} ORDER BY {}) TO STDOUT").format(
        sql.SQL(", ").join(map(sql.Identifier, columns)), sql.Identifier(name),
        sql.SQL(", ").join(map(sql.Identifier, order_by)))
    with conn.cursor() as cur, cur.copy(query) as copy:
        for chunk in copy:
            yield bytes(chunk)


def _load_table(conn: psycopg.Connection, table: TableCopy, tar: tarfile.TarFile, member: tarfile.TarInfo,
                report: ProgressCallback) -> None:
    source = tar.extractfile(member)
    if source is None:
        raise ArchiveError(f"the backup's {member.name!r} is not a file")
    digest, rows, size = hashlib.sha256(), 0, 0
    refused: str | None = None  # the SQLSTATE of the target's refusal
    query = sql.SQL("COPY {} ({}) FROM STDIN").format(
        sql.Identifier(table.name), sql.SQL(", ").join(map(sql.Identifier, table.columns)))
    try:
        with gzip.open(source, "rb") as data:
            try:
                with conn.cursor() as cur, cur.copy(query) as copy:
                    while chunk := data.read(_CHUNK):
                        digest.update(chunk)
                        rows += chunk.count(b"\n")
                        size += len(chunk)
                        copy.write(chunk)
                        report(Progress("restore", table.name, rows, size, table.rows, done=False))
            except (psycopg.errors.DataError, psycopg.errors.IntegrityError) as exc:
                # A value the target cannot take or a key it already holds: most often a damaged file, which
                # the rest of it tells. The message would quote row data (state content): only the SQLSTATE.
                refused = exc.sqlstate or "?"
                while chunk := data.read(_CHUNK):
                    digest.update(chunk)
                    rows += chunk.count(b"\n")
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise ArchiveError(f"the backup's data for {table.name} is damaged ({exc.__class__.__name__})") from None
    if digest.hexdigest() != table.sha256 or rows != table.rows:
        raise ArchiveError(f"the backup's data for {table.name} does not match its manifest ({rows} rows read, "
                           f"{table.rows} listed): the file is damaged; nothing was restored")
    if refused is not None:
        raise ArchiveError(f"the target refused the backup's data for {table.name} (SQLSTATE {refused}): "
                           "nothing was restored")
    report(Progress("restore", table.name, rows, size, table.rows, done=True))


def _verify_table(conn: psycopg.Connection, table: TableCopy) -> tuple[str, int]:
    """Set the table's sequences past its rows, then check its count and a re-read of its content."""
    for column, sequence in conn.execute(_SERIALS, (table.name, table.name, table.name)).fetchall():
        conn.execute(sql.SQL("SELECT setval(%s::regclass, COALESCE(max({c}), 1), max({c}) IS NOT NULL) FROM {t}")
                     .format(c=sql.Identifier(column), t=sql.Identifier(table.name)), (sequence,))
    count = int(_one(conn, sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table.name))))
    digest = hashlib.sha256()
    for chunk in _copy_out(conn, table.name, table.columns, table.order_by):
        digest.update(chunk)
    if count != table.rows or digest.hexdigest() != table.sha256:
        raise ArchiveError(f"after loading, {table.name} holds {count} rows (the backup lists {table.rows}) "
                           f"{'with the same' if digest.hexdigest() == table.sha256 else 'with different'} "
                           "content: nothing was restored")
    return table.name, count


def _refuse_if_holding_data(conn: psycopg.Connection, present: set[str]) -> None:
    holding = []
    for name in sorted(present - _DISPOSABLE):
        where = sql.SQL(" WHERE slug <> %s") if name == "tenants" else sql.SQL("")
        params = (_SEEDED_TENANT,) if name == "tenants" else ()
        if conn.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {}{})").format(sql.Identifier(name), where),
                        params).fetchone() == (True,):
            holding.append(name)
    if holding:
        raise DatabaseNotEmptyError(
            f"the target database already holds data (in {', '.join(holding)}): restore into an empty database, "
            "or pass --replace to discard what it holds", tables=holding)


def _load_order(conn: psycopg.Connection) -> list[str]:
    """Every table, each after the tables its immediately-checked foreign keys (and the references triggers
    check at once) point at."""
    names = sorted(_tables(conn))
    needs: dict[str, set[str]] = {name: set() for name in names}
    for child, parent in [*conn.execute(_REFERENCES).fetchall(), *_CHECKED_BY_TRIGGERS]:
        if child in needs and parent in needs:
            needs[child].add(parent)
    ordered: list[str] = []
    while needs:
        ready = sorted(name for name, parents in needs.items() if not parents - set(ordered))
        if not ready:  # a cycle of immediate foreign keys: no order loads it; the schema never has one
            raise ArchiveError(f"cannot order the tables {', '.join(sorted(needs))}: their foreign keys form a cycle")
        ordered.extend(ready)
        for name in ready:
            del needs[name]
    return ordered


def _tables(conn: psycopg.Connection) -> set[str]:
    return {r[0] for r in conn.execute(_TABLES).fetchall()}


def _one(conn: psycopg.Connection, query: Any) -> Any:
    row = conn.execute(query).fetchone()
    assert row is not None  # an aggregate or SHOW always returns one row
    return row[0]


def _add_member(tar: tarfile.TarFile, name: str, data: IO[bytes], size: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o600, int(datetime.now(UTC).timestamp())
    tar.addfile(info, data)


def _open_archive(path: Path) -> tarfile.TarFile:
    try:
        return tarfile.open(path, "r|")  # a stream: members are read once, in order
    except FileNotFoundError:
        raise ArchiveError(f"no backup at {path}") from None
    except (tarfile.TarError, OSError) as exc:
        raise ArchiveError(f"{path} is not a kl backup ({exc.__class__.__name__})") from None


def _first_manifest(tar: tarfile.TarFile) -> Manifest:
    try:
        first = tar.next()
    except tarfile.TarError as exc:
        raise ArchiveError(f"the backup is not a readable archive ({exc.__class__.__name__})") from None
    if first is None or first.name != MANIFEST or not first.isfile() or first.size > 16 << 20:
        raise ArchiveError(f"the backup does not begin with its {MANIFEST}: is this file a kl backup?")
    data = tar.extractfile(first)
    assert data is not None  # a regular file, checked above
    return Manifest.from_json(data.read())


def _members(tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    try:
        while (member := tar.next()) is not None:
            yield member
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ArchiveError(f"the backup is damaged after its manifest ({exc.__class__.__name__})") from None
