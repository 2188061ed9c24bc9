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

A version whose bytes retention removed (``pruned_at`` set) is still assembled on read, from the rows,
but not cached again: retention would otherwise undo itself.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import psycopg

from analyzer.state_assembly import assemble_state
from app.errors import NotFoundError
from app.store import resources
from app.store.db import Database

_LOCK_VERSION = """
SELECT state_id, serial, lineage, terraform_version, encrypted, source, pruned_at IS NOT NULL AS pruned, raw_state
FROM state_versions WHERE id = %s
FOR NO KEY UPDATE
"""
_SOURCE = "SELECT source FROM state_versions WHERE id = %s"
_CACHE = """
UPDATE state_versions SET raw_state = %s, sha256 = %s, size_bytes = %s, assembled_at = now()
WHERE id = %s AND raw_state IS NULL
"""


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
    row = conn.execute(_LOCK_VERSION, (version_id,), binary=True).fetchone()
    if row is None:
        return None
    state_id, serial, lineage, terraform_version, encrypted, source, pruned, raw = row
    if raw is not None:
        return Materialised(bytes(raw), assembled=False, cached=False)
    if encrypted:
        # An encrypted state has no rows to rebuild it from: once retention removed its bytes (never the
        # head's), that serial is gone.
        raise NotFoundError(f"the bytes of encrypted serial {serial} were removed by retention; "
                            "read the head instead")
    built = assemble_state(
        serial=serial, lineage=lineage, terraform_version=terraform_version,
        instances=resources.instances_at(conn, state_id=state_id, serial=serial),
        outputs=resources.outputs_of(conn, version_id=version_id),
    )
    cache = source == "apply" and not pruned
    if cache:
        conn.execute(_CACHE, (built, hashlib.sha256(built).hexdigest(), len(built), version_id))
    return Materialised(built, assembled=True, cached=cache)



def apply_version_bytes(conn: psycopg.Connection, version_id: int) -> bytes | None:
    """The bytes of an apply version, assembled and cached on first read (what GET serves for it); None
    for a version Terraform wrote, whose rebuilt state the caller assembles itself."""
    found = conn.execute(_SOURCE, (version_id,)).fetchone()
    if found is None or found[0] != "apply":
        return None
    got = materialise_in(conn, version_id)
    return None if got is None else got.raw
