"""The raw bytes of a state version: stored for Terraform's writes, assembled on first read for commits.

A version written by Terraform's POST keeps the body it was sent, byte for byte. A version written by a
row-level commit (source ``apply``) is stored without bytes: the commit writes only the lifecycle delta,
the outputs and the version row. The first read of such a version (the backend lane's GET, the engine
lane's ``assembled``) builds the v4 state from the rows alive at its serial and its outputs, and caches
it in ``raw_state`` (compressed by Postgres, lz4 where available), so N commits followed by one GET cost
one assembly and every later read returns the same bytes.

Concurrent readers of one uncached version coalesce on that version's row (``FOR NO KEY UPDATE``): the
first assembles and stores, the others wait and then find the bytes. Neither the state row nor any other
version is locked, so commits, Terraform's LOCK and POST go on meanwhile. The rows at a committed serial
never change (later writes only close rows at higher serials), so the assembly is a whole serial whatever
commits run alongside.

The assembly streams: rows come from one statement read in chunks, in the state's order, with only the
columns the assembly writes and the instance's text as bytes (``resources.stream_assembly_rows`` with
``alone``: no round trip per batch, and Postgres may sort with parallel workers, which a cursor's
statement never gets), ``analyzer.state_assembly.stream_state`` turns them into pieces of text, and each
piece goes to the reader as it comes and waits in the process (``CacheWriter``) until the last one. The
statement leaves the connection to nothing else meanwhile, and a COPY there would have the reader wait:
the pieces go into a temporary table on the same connection in one COPY at the end (stored uncompressed),
where one UPDATE joins them inside Postgres into ``raw_state``, compressing them once. The process holds
a chunk of rows and the pieces (about the state's size, within the bound of 1.5 times it), never a
parsed state, and the sha256 is taken piece by piece as they are copied.
A reader that goes away mid-stream rolls the transaction back: nothing is cached and the next reader
assembles again.

When an earlier apply version of the state has bytes cached in the current layout
(``assembly_format``), the assembly splices them instead (``analyzer.state_splice``): it reads the
objects whose rows opened or closed between that serial and this one (through the ``create_serial`` and
``delete_serial`` indexes), the rows alive now among them, and the earlier bytes, then writes the new
header, the earlier text of everything unchanged and the new text of what changed, so rows are read and
encoded in proportion to the change. The earlier bytes are read in slices into one buffer: the process
holds them (about the state's size) while it writes, never a parsed state. The cache gets the new text
and the ranges of the earlier bytes kept, which the final UPDATE copies from the stored bytes inside
Postgres; it checks the length, so a base pruned meanwhile leaves the version uncached, never wrong.
Whenever something is not as expected (no such base, more changed objects than ``SPLICE_MAX_CHANGED``,
a resource whose provider changed, a base whose text is not where the layout puts it) it assembles from
all rows instead, before sending a byte. Bytes Terraform wrote are never a base: their layout is
Terraform's (it orders the ``value`` and ``type`` of a dynamic value as its encoder does and keeps empty
``sensitive_attributes``), which the assembly, writing from the rows, does not reproduce. Instead, a large
POSTed version gets the assembly of its own rows built off the request path (``app.store.splicebase``)
and stored beside it in ``state_version_bases``; the newest of those and of the apply versions' cached
bytes is the base, read and copied from whichever table holds it.

The spliced file's size is known before its first piece (``Found.size``, as is that of stored bytes), so
the backend lane sends it with a Content-Length: the reader has the whole body when the last piece is
written, and the cache write that follows (the file's sha256, taken over the parts only then, and the
final UPDATE, which joins and compresses the bytes in Postgres) is off its path. An assembly from all rows
has no size in advance: its body is sent chunked and its cache write (the COPY of its pieces and the
UPDATE) waits for ``Found.finish``, once the response is done (``Found.late``). The version's row lock
is held until that write commits, so concurrent first readers still coalesce; should the write fail, the
transaction rolls back (the version stays uncached, the reader already has its bytes) and the failure is
logged by its class alone.

A version whose bytes retention removed (``pruned_at`` set) is still assembled on read, from the rows,
but not cached again: retention would otherwise undo itself.
"""

from __future__ import annotations

import hashlib
import logging
import sys
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

import psycopg

from analyzer.state import InstanceRow, OutputRow
from analyzer.state_assembly import ASSEMBLY_FORMAT, header_prefix, stream_state
from analyzer.state_splice import Part, ResourceChange, ResourceKey, SpliceError, instance_order, pieces, splice
from app.errors import NotFoundError
from app.store import resources
from app.store.db import Database

log = logging.getLogger("kilolock.store")

_LOCK_VERSION = """
SELECT state_id, serial, lineage, terraform_version, encrypted, source, pruned_at IS NOT NULL AS pruned, raw_state
FROM state_versions WHERE id = %s
FOR NO KEY UPDATE
"""
_SOURCE = "SELECT source FROM state_versions WHERE id = %s"
# The size of the newest earlier version that has bytes: what an assembly of this one will roughly write.
_EXPECTED_SIZE = """
SELECT size_bytes FROM state_versions
WHERE state_id = %s AND serial < %s AND size_bytes IS NOT NULL ORDER BY serial DESC LIMIT 1
"""
# A piece is new text (``data``) or a range of a base version's stored bytes (``base_start``, ``base_length``).
_PIECES_TABLE = """
CREATE TEMPORARY TABLE IF NOT EXISTS kl_spliced_pieces (seq integer NOT NULL, data bytea, base_start integer,
                                                       base_length integer)
ON COMMIT DELETE ROWS
"""
# The pieces are stored as they are: the final UPDATE compresses the joined bytes once, so compressing
# each piece on the way in would only cost the reader's time.
_PIECES_UNCOMPRESSED = "ALTER TABLE kl_spliced_pieces ALTER COLUMN data SET STORAGE EXTERNAL"
_PIECES_STORAGE = """
SELECT a.attstorage = 'e' FROM pg_attribute a
WHERE a.attrelid = 'pg_temp.kl_spliced_pieces'::regclass AND a.attname = 'data'
"""
_COPY_PIECES = "COPY kl_spliced_pieces (seq, data, base_start, base_length) FROM STDIN (FORMAT BINARY)"
_CACHE = """
UPDATE state_versions
SET raw_state = (SELECT string_agg(data, ''::bytea ORDER BY seq) FROM kl_spliced_pieces),
    sha256 = %(sha256)s, size_bytes = %(size)s, assembled_at = now(), assembly_format = %(format)s
WHERE id = %(id)s AND raw_state IS NULL
"""
# What ``_CACHE`` wrote, removed again: the apply version as its commit left it.
_FORGET = """
UPDATE state_versions SET raw_state = NULL, sha256 = NULL, size_bytes = NULL, assembled_at = NULL,
                          assembly_format = NULL
WHERE id = %s AND source = 'apply' AND pruned_at IS NULL
"""
# The same with ranges of a base's bytes, decompressed once (an uncorrelated subquery runs once). The
# length check leaves the version uncached should the base's bytes have been pruned meanwhile.
_CACHE_SPLICED = """
UPDATE state_versions v
SET raw_state = n.raw, sha256 = %(sha256)s, size_bytes = %(size)s, assembled_at = now(),
    assembly_format = %(format)s
FROM (SELECT string_agg(
        CASE WHEN p.data IS NOT NULL THEN p.data
             ELSE substring(({base_raw}) FROM p.base_start + 1 FOR p.base_length) END,
        ''::bytea ORDER BY p.seq) AS raw
      FROM kl_spliced_pieces p) n
WHERE v.id = %(id)s AND v.raw_state IS NULL AND octet_length(n.raw) = %(size)s
"""
# The newest earlier version whose bytes this process's assembly wrote: an apply version's cached bytes,
# or the bytes assembled off the request path for a version Terraform wrote (``state_version_bases``).
_BASE = """
SELECT id, serial, size_bytes, false AS stored_base FROM state_versions
WHERE state_id = %(state)s AND serial < %(serial)s AND source = 'apply' AND NOT encrypted AND raw_state IS NOT NULL
  AND pruned_at IS NULL AND assembly_format = %(format)s AND size_bytes IS NOT NULL
UNION ALL
SELECT b.version_id, v.serial, b.size_bytes, true FROM state_version_bases b
JOIN state_versions v ON v.id = b.version_id
WHERE b.state_id = %(state)s AND v.serial < %(serial)s AND b.assembly_format = %(format)s AND v.pruned_at IS NULL
ORDER BY serial DESC LIMIT 1
"""
# A splice base being built (``app.store.splicebase``) holds this advisory lock (the two-key form, the
# second key the version id) until its transaction ends.
BUILD_LOCK_CLASS = 0x6B6C6273  # "klbs"
BUILD_LOCK_KEY = "(%s %% 2147483647)::int"
# The newest version Terraform wrote below this serial, when it has no splice base (yet).
_UNBUILT = """
SELECT v.id FROM state_versions v
WHERE v.state_id = %(state)s AND v.serial < %(serial)s AND v.source <> 'apply' AND NOT v.encrypted
  AND NOT EXISTS (SELECT 1 FROM state_version_bases b WHERE b.version_id = v.id)
  AND NOT EXISTS (SELECT 1 FROM state_versions w WHERE w.state_id = v.state_id AND w.serial > v.serial
                  AND w.serial < %(serial)s AND (w.source <> 'apply' OR w.raw_state IS NOT NULL))
ORDER BY v.serial DESC LIMIT 1
"""
_TRY_SHARED = f"SELECT pg_try_advisory_lock_shared(%s, {BUILD_LOCK_KEY})"
_WAIT_SHARED = f"SELECT pg_advisory_lock_shared(%s, {BUILD_LOCK_KEY})"
_UNLOCK_SHARED = f"SELECT pg_advisory_unlock_shared(%s, {BUILD_LOCK_KEY})"
# Where a base's bytes are: an apply version's cache, or a stored base.
_BASE_RAW = {False: "SELECT raw_state || ''::bytea FROM state_versions WHERE id = %(base)s",
             True: "SELECT raw || ''::bytea FROM state_version_bases WHERE version_id = %(base)s"}
# The base's bytes in slices, decompressed once (the subquery is evaluated once; each slice is cut from
# its result rather than from the stored value).
_BASE_SLICES = """
SELECT g, substring(b.raw FROM g FOR %(slice)s)
FROM ({base_raw} OFFSET 0) b (raw),
     LATERAL generate_series(1, length(b.raw), %(slice)s) g
"""
_BASE_SLICE_BYTES = 1 << 18
# Above this many changed instance objects the assembly reads all rows: the change is most of the state.
SPLICE_MAX_CHANGED = 20_000
_CLEAR_PIECES = "TRUNCATE kl_spliced_pieces"
# Pieces sent to the temporary table at once.
_FLUSH_BYTES = 8 << 20


@dataclass(frozen=True, slots=True)
class Materialised:
    raw: bytes
    assembled: bool  # built from rows by this call (False: the stored bytes)
    cached: bool  # stored for later readers by this call
    spliced: bool = False  # assembled from an earlier version's bytes and the changed rows


def materialise(db: Database, version_id: int) -> Materialised | None:
    """The raw bytes of a version, assembling and caching them when the version has none; None when the
    version no longer exists (its state was deleted meanwhile)."""
    with db.transaction() as conn:
        return materialise_in(conn, version_id)


def materialise_in(conn: psycopg.Connection, version_id: int) -> Materialised | None:
    """``materialise`` inside the caller's transaction, which must commit soon: it holds the version's row
    lock until then."""
    found = Found()
    raw = bytearray()
    for piece in pieces_in(conn, version_id, found):
        raw += piece
    if not found.exists:
        return None
    return Materialised(bytes(raw), assembled=found.assembled, cached=found.cached, spliced=found.spliced)


class Found:
    """What ``pieces_in`` found, filled in as it runs."""

    __slots__ = ("assembled", "cached", "exists", "late", "size", "spliced", "_finish")

    def __init__(self, *, late: bool = False) -> None:
        self.exists = False
        self.assembled = False
        self.spliced = False  # assembled from an earlier version's bytes and the changed rows
        self.cached = False
        self.size: int | None = None  # the body's length, when known before its first piece
        # The caller calls ``finish`` once the body is sent: the cache write of an assembly from all rows
        # (whose size is not known in advance) waits for it, with the transaction and row lock still held.
        self.late = late
        self._finish: Callable[[], None] | None = None

    def finish(self) -> None:
        """The cache write left for after the body (``late``), and the end of its transaction; nothing when
        there is none (stored bytes, a splice, a stream closed early). Called once the response is done."""
        finish, self._finish = self._finish, None
        if finish is not None:
            finish()


def stream(db: Database, version_id: int, found: Found,
           before_assembly: Callable[[int], None] | None = None) -> Iterator[bytes]:
    """The version's bytes as pieces, in a transaction of their own that lasts as long as the iteration
    (it holds the version's row lock, so concurrent first readers wait and then read the cached bytes),
    or, when ``found.late`` and an assembly from all rows is left to cache, until ``found.finish()``.
    Yields nothing when the version no longer exists. ``before_assembly`` is called with the expected size
    only by the reader that assembles (after the row lock, the bytes still absent): the caller's admission
    check, which readers that waited for another's assembly never meet."""
    transaction = db.transaction()
    conn = transaction.__enter__()
    try:
        yield from pieces_in(conn, version_id, found, before_assembly)
    except BaseException:
        if not transaction.__exit__(*sys.exc_info()):
            raise
        return
    write = found._finish
    if write is None:
        transaction.__exit__(None, None, None)
        return

    def finish() -> None:
        try:
            write()
        except BaseException:
            if not transaction.__exit__(*sys.exc_info()):
                raise
        else:
            transaction.__exit__(None, None, None)
    found._finish = finish


def pieces_in(conn: psycopg.Connection, version_id: int, found: Found,
              before_assembly: Callable[[int], None] | None = None) -> Iterator[bytes]:
    """The version's bytes in pieces: the stored bytes whole, or the assembly as it is written (and cached
    when the transaction commits)."""
    row = conn.execute(_LOCK_VERSION, (version_id,), binary=True).fetchone()
    if row is None:
        return
    found.exists = True
    state_id, serial, lineage, terraform_version, encrypted, source, pruned, raw = row
    if raw is not None:
        found.size = len(raw)
        yield bytes(raw)
        return
    if encrypted:
        # An encrypted state has no rows to rebuild it from: once retention removed its bytes (never the
        # head's), that serial is gone.
        raise NotFoundError(f"the bytes of encrypted serial {serial} were removed by retention; "
                            "read the head instead")
    if before_assembly is not None:
        expected = conn.execute(_EXPECTED_SIZE, (state_id, serial)).fetchone()
        before_assembly(0 if expected is None else int(expected[0]))
    found.assembled = True
    outputs = resources.outputs_of(conn, version_id=version_id)
    spliced = None if source != "apply" else _spliced(conn, state_id, serial, lineage, terraform_version, outputs)
    if spliced is not None:
        found.spliced = True
        found.size = sum(part[1] - part[0] if isinstance(part, tuple) else len(part) for part in spliced.parts)
        yield from _write_spliced(conn, version_id, spliced, found, cache=not pruned)
        return
    if source != "apply" or pruned:
        yield from from_rows(conn, state_id, serial, lineage, terraform_version, outputs, alone=True)
        return
    writer = CacheWriter(conn)  # the pieces wait in the process until the body is written
    text = from_rows(conn, state_id, serial, lineage, terraform_version, outputs, alone=True)
    try:
        for piece in text:
            writer.add(piece)
            yield piece
    finally:
        # Closed here, while this transaction is still the connection's: a row cursor left open until the
        # error is freed would send its CLOSE into whatever transaction the pooled connection serves next.
        text.close()
    if found.late:
        def store() -> None:
            found.cached = _stored(conn, writer, version_id)
        found._finish = store
        return
    found.cached = _stored(conn, writer, version_id)


def _stored(conn: psycopg.Connection, writer: CacheWriter, version_id: int,
            base: tuple[int, bool] | None = None) -> bool:
    """The cache write after the last piece: whether it stored the bytes. A failure rolls the transaction
    back (the version stays uncached; the reader has had every byte) and is logged by its class alone,
    as the database's message may quote the bytes."""
    try:
        return writer.finish(version_id, base=base)
    except psycopg.Error as exc:
        log.warning("caching the assembled bytes of version %s failed (%s); it stays uncached", version_id,
                    exc.__class__.__name__)
        try:
            conn.rollback()
        except psycopg.Error:
            pass  # the connection is gone: so is the transaction
        return False


@dataclass(frozen=True, slots=True)
class _Splice:
    base_id: int
    base: bytearray
    parts: list[Part]
    stored_base: bool = False  # the base is a stored base of a version Terraform wrote


def _write_spliced(conn: psycopg.Connection, version_id: int, spliced: _Splice, found: Found, *,
                   cache: bool) -> Iterator[bytes]:
    """The spliced file to the reader in pieces; to the cache as its new text and the ranges of the base
    it keeps, which Postgres copies from the base's stored bytes itself."""
    if not cache:
        yield from pieces(spliced.base, spliced.parts)
        return
    writer = CacheWriter(conn, base=spliced.base)
    view = memoryview(spliced.base)
    for part in spliced.parts:
        if isinstance(part, bytes):
            writer.add(part)
            writer.flush_due()  # a change of many objects sends its text as it goes: the base is held already
            yield part
            continue
        start, end = part
        writer.add_base(start, end - start)
        for at in range(start, end, _BASE_SLICE_BYTES):
            yield bytes(view[at:min(end, at + _BASE_SLICE_BYTES)])
    # The reader has every byte now (it was sent the size first): the rest of the parts, and their digest,
    # go after it.
    found.cached = _stored(conn, writer, version_id, base=(spliced.base_id, spliced.stored_base))


def from_rows(conn: psycopg.Connection, state_id: int, serial: int, lineage: str, terraform_version: str,
              outputs: list[OutputRow], between: Callable[[], None] | None = None,
              alone: bool = False) -> Generator[bytes, None, None]:
    """The state at ``serial`` assembled from all its rows, as pieces; ``between`` runs between the row
    fetches (``resources.stream_assembly_rows``), where a ``CacheWriter`` may send its pieces (``flush_due``).
    ``alone``: nothing else runs on the connection until the pieces end (the rows come from one streamed
    statement), so a cache writer keeps its pieces until ``finish``."""
    return stream_state(
        serial=serial, lineage=lineage, terraform_version=terraform_version, outputs=outputs, plain_numbers=True,
        instances=resources.stream_assembly_rows(conn, state_id=state_id, serial=serial, between=between,
                                                 alone=alone),
    )


def _spliced(conn: psycopg.Connection, state_id: int, serial: int, lineage: str, terraform_version: str,
             outputs: list[OutputRow]) -> _Splice | None:
    """The state at ``serial`` spliced from an earlier assembly's bytes and the changed rows, or None when
    there is no usable base or the splice refuses it (the caller then assembles from all rows). Everything
    that can refuse runs before the first piece."""
    _wait_for_build(conn, state_id, serial)
    base = conn.execute(_BASE, {"state": state_id, "serial": serial, "format": ASSEMBLY_FORMAT}).fetchone()
    if base is None:
        return None
    base_id, base_serial, base_size, stored_base = base
    objects = resources.changed_between(conn, state_id=state_id, after=base_serial, upto=serial,
                                        limit=SPLICE_MAX_CHANGED + 1)
    if len(objects) > SPLICE_MAX_CHANGED:
        return None
    changed: dict[ResourceKey, set[tuple[int, int, str, str]]] = {}
    try:
        for o in objects:
            changed.setdefault((o.module, o.mode, o.type, o.name), set()).add(instance_order(o.index_key, o.deposed))
        alive = resources.instances_among_at(conn, state_id=state_id, serial=serial, objects=objects)
        by_resource: dict[ResourceKey, list[InstanceRow]] = {}
        for row in alive:
            by_resource.setdefault((row.module, row.mode, row.type, row.name), []).append(row)
        changes = {key: ResourceChange(frozenset(orders), tuple(by_resource.get(key, ())))
                   for key, orders in changed.items()}
        if by_resource.keys() - changes.keys():
            return None
        buffer = _base_bytes(conn, base_id, int(base_size), stored_base=bool(stored_base))
        if buffer is None:
            return None
        header = header_prefix(serial=serial, lineage=lineage, terraform_version=terraform_version, outputs=outputs)
        parts = splice(buffer, header, changes, plain_numbers=True)
    except (SpliceError, ValueError, TypeError):
        return None  # the assembly from all rows decides, and raises what is wrong with the rows
    return _Splice(int(base_id), buffer, parts, stored_base=bool(stored_base))


def _wait_for_build(conn: psycopg.Connection, state_id: int, serial: int) -> None:
    """Wait for the splice base of the version Terraform wrote below ``serial`` when another transaction is
    building it: the rest of a build already under way costs less than a second assembly from all rows
    beside it. Nothing when no build runs (the lock is taken and let go at once)."""
    unbuilt = conn.execute(_UNBUILT, {"state": state_id, "serial": serial}).fetchone()
    if unbuilt is None:
        return
    key = (BUILD_LOCK_CLASS, unbuilt[0])
    got = conn.execute(_TRY_SHARED, key).fetchone()
    try:
        if got is None or not got[0]:
            conn.execute(_WAIT_SHARED, key)
    finally:
        conn.execute(_UNLOCK_SHARED, key)


def _base_bytes(conn: psycopg.Connection, base_id: int, size: int, *, stored_base: bool) -> bytearray | None:
    """The base's bytes, read in slices into one buffer of its size; None when they are not its
    recorded size (or went away meanwhile)."""
    buffer = bytearray(size)
    filled = 0
    with conn.cursor("kl_splice_base", binary=True) as cur:
        cur.itersize = 2
        query = _BASE_SLICES.format(base_raw=_BASE_RAW[stored_base])
        cur.execute(query.encode(), {"base": base_id, "slice": _BASE_SLICE_BYTES})
        for start, data in cur:
            if start != filled + 1 or filled + len(data) > size:
                return None
            buffer[filled:filled + len(data)] = data
            filled += len(data)
    return buffer if filled == size else None


class CacheWriter:
    """An assembly's parts into the session's temporary table, then into ``raw_state``: pieces of new text
    and, for a splice, ranges of ``base`` (the bytes it splices) kept. The parts wait in the process until
    ``flush_due`` finds enough of them (a caller with gaps between its row fetches calls it there) or
    ``finish`` sends the rest, so nothing of the cache write runs on a reader's path unless its caller asks.
    The sha256 is taken over each part, in order, as it is sent: a range over the base's bytes."""

    def __init__(self, conn: psycopg.Connection, *, base: bytes | bytearray | None = None) -> None:
        self._conn = conn
        self._base = None if base is None else memoryview(base)
        self._digest = hashlib.sha256()
        self._size = 0
        self._seq = 0
        self._pending: list[tuple[bytes | None, int | None, int | None]] = []
        self._pending_bytes = 0
        conn.execute(_PIECES_TABLE)
        stored_whole = conn.execute(_PIECES_STORAGE).fetchone()
        if stored_whole is None or not stored_whole[0]:
            conn.execute(_PIECES_UNCOMPRESSED)
        conn.execute(_CLEAR_PIECES)  # a rolled-back assembly on this session left none, but be sure

    def add(self, piece: bytes) -> None:
        """A piece of new text."""
        self._size += len(piece)
        self._pending.append((piece, None, None))
        self._pending_bytes += len(piece)

    def add_base(self, start: int, length: int) -> None:
        """A range of the base's bytes, which the final UPDATE copies from the stored base."""
        if self._base is None or start + length > len(self._base):
            raise ValueError("a range of the base needs the base's bytes")
        self._size += length
        self._pending.append((None, start, length))
        self._pending_bytes += 64

    def digest(self, part: bytes | memoryview) -> None:
        self._digest.update(part)

    def flush_due(self) -> None:
        """Send the parts once they add up to ``_FLUSH_BYTES``."""
        if self._pending_bytes >= _FLUSH_BYTES:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        pending.reverse()
        with self._conn.cursor() as cur, cur.copy(_COPY_PIECES) as copy:
            copy.set_types(["int4", "bytea", "int4", "int4"])
            while pending:  # each piece let go once it is sent: the COPY adds to the memory held, never doubles it
                row = pending.pop()
                piece, start, length = row
                if piece is not None:
                    self.digest(piece)
                else:
                    assert self._base is not None and start is not None and length is not None  # add_base's
                    self.digest(self._base[start:start + length])
                copy.write_row((self._seq, *row))
                self._seq += 1
                del row, piece

    def finish(self, version_id: int, base: tuple[int, bool] | None = None) -> bool:
        """Store the pieces as the version's bytes (with ``base``: its id and whether it is a stored base,
        for the ranges kept from it); whether they were stored."""
        query = _CACHE if base is None else _CACHE_SPLICED.format(base_raw=_BASE_RAW[base[1]])
        return self.finish_with(query, {"id": version_id, "base": None if base is None else base[0]})

    def finish_with(self, query: str, params: dict[str, object]) -> bool:
        """Run ``query`` over the pieces (``kl_spliced_pieces``) with ``params`` and the pieces' sha256, size
        and layout; whether it wrote one row."""
        self._flush()
        params = {**params, "sha256": self._digest.hexdigest(), "size": self._size, "format": ASSEMBLY_FORMAT}
        stored = self._conn.execute(query.encode(), params).rowcount == 1
        self._conn.execute(_CLEAR_PIECES)
        return stored


def forget_assembly(conn: psycopg.Connection, version_id: int) -> bool:
    """An apply version's cached assembly removed, as its commit left the version, so its next read
    assembles it again (benches and tests of the first read); whether there was such a version. A
    version Terraform wrote keeps its bytes, a pruned one its pruning."""
    return conn.execute(_FORGET, (version_id,)).rowcount == 1


def apply_version_bytes(conn: psycopg.Connection, version_id: int) -> bytes | None:
    """The bytes of an apply version, assembled and cached on first read (what GET serves for it); None
    for a version Terraform wrote, whose rebuilt state the caller assembles itself."""
    found = conn.execute(_SOURCE, (version_id,)).fetchone()
    if found is None or found[0] != "apply":
        return None
    got = materialise_in(conn, version_id)
    return None if got is None else got.raw
