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

The assembly streams: rows come from a server-side cursor in the state's order
(``resources.stream_instances_at``), ``analyzer.state_assembly.stream_state`` turns them into pieces of
text, and each piece goes to the reader and into a temporary table on the same connection as it comes
(``_CacheWriter``); at the end one UPDATE joins the pieces inside Postgres into ``raw_state``. The
process holds a batch of rows and a few pieces, never the state, and the sha256 is taken piece by piece.
A reader that goes away mid-stream rolls the transaction back: nothing is cached and the next reader
assembles again.

A version whose bytes retention removed (``pruned_at`` set) is still assembled on read, from the rows,
but not cached again: retention would otherwise undo itself.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import psycopg

from analyzer.state_assembly import stream_state
from app.errors import NotFoundError
from app.store import resources
from app.store.db import Database

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
_PIECES_TABLE = """
CREATE TEMPORARY TABLE IF NOT EXISTS kl_assembly_pieces (seq integer NOT NULL, data bytea NOT NULL)
ON COMMIT DELETE ROWS
"""
_COPY_PIECES = "COPY kl_assembly_pieces (seq, data) FROM STDIN (FORMAT BINARY)"
_CACHE = """
UPDATE state_versions
SET raw_state = (SELECT string_agg(data, ''::bytea ORDER BY seq) FROM kl_assembly_pieces),
    sha256 = %s, size_bytes = %s, assembled_at = now()
WHERE id = %s AND raw_state IS NULL
"""
_CLEAR_PIECES = "TRUNCATE kl_assembly_pieces"
# Pieces sent to the temporary table at once.
_FLUSH_BYTES = 8 << 20


@dataclass(frozen=True, slots=True)
class Materialised:
    raw: bytes
    assembled: bool  # built from rows by this call (False: the stored bytes)
    cached: bool  # stored for later readers by this call


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
    return Materialised(bytes(raw), assembled=found.assembled, cached=found.cached)


class Found:
    """What ``pieces_in`` found, filled in as it runs."""

    __slots__ = ("assembled", "cached", "exists")

    def __init__(self) -> None:
        self.exists = False
        self.assembled = False
        self.cached = False


def stream(db: Database, version_id: int, found: Found,
           before_assembly: Callable[[int], None] | None = None) -> Iterator[bytes]:
    """The version's bytes as pieces, in a transaction of their own that lasts as long as the iteration
    (it holds the version's row lock, so concurrent first readers wait and then read the cached bytes).
    Yields nothing when the version no longer exists. ``before_assembly`` is called with the expected size
    only by the reader that assembles (after the row lock, the bytes still absent): the caller's admission
    check, which readers that waited for another's assembly never meet."""
    with db.transaction() as conn:
        yield from pieces_in(conn, version_id, found, before_assembly)


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
    pieces = stream_state(
        serial=serial, lineage=lineage, terraform_version=terraform_version, outputs=outputs, plain_numbers=True,
        instances=resources.stream_instances_at(conn, state_id=state_id, serial=serial),
    )
    if source != "apply" or pruned:
        yield from pieces
        return
    writer = _CacheWriter(conn)
    for piece in pieces:
        writer.add(piece)
        yield piece
    writer.finish(version_id)
    found.cached = True


class _CacheWriter:
    """Pieces of an assembly into the session's temporary table as they come, then into ``raw_state``."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self._conn = conn
        self._digest = hashlib.sha256()
        self._size = 0
        self._seq = 0
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        conn.execute(_PIECES_TABLE)
        conn.execute(_CLEAR_PIECES)  # a rolled-back assembly on this session left none, but be sure

    def add(self, piece: bytes) -> None:
        self._digest.update(piece)
        self._size += len(piece)
        self._pending.append(piece)
        self._pending_bytes += len(piece)
        if self._pending_bytes >= _FLUSH_BYTES:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        with self._conn.cursor() as cur, cur.copy(_COPY_PIECES) as copy:
            copy.set_types(["int4", "bytea"])
            for piece in self._pending:
                copy.write_row((self._seq, piece))
                self._seq += 1
        self._pending.clear()
        self._pending_bytes = 0

    def finish(self, version_id: int) -> None:
        self._flush()
        self._conn.execute(_CACHE, (self._digest.hexdigest(), self._size, version_id))
        self._conn.execute(_CLEAR_PIECES)
def apply_version_bytes(conn: psycopg.Connection, version_id: int) -> bytes | None:
    """The bytes of an apply version, assembled and cached on first read (what GET serves for it); None
    for a version Terraform wrote, whose rebuilt state the caller assembles itself."""
    found = conn.execute(_SOURCE, (version_id,)).fetchone()
    if found is None or found[0] != "apply":
        return None
    got = materialise_in(conn, version_id)
    return None if got is None else got.raw
