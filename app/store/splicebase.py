"""Splice bases: a version Terraform wrote, assembled from its rows off the request path.

A whole-state POST keeps Terraform's bytes, which are laid out by Terraform and so are never a base for the
splice (``app.store.assembly``): the first read after row commits on top of such a version would assemble
from every row. ``build`` writes that version's assembly from its rows (``assembly.from_rows``, the same
stream the first read would write) into ``state_version_bases``, where ``assembly``'s choice of a base finds
it beside the cached bytes of apply versions. The rows of a committed serial never change, so a base is
that serial's assembly for good; it is stored with the assembly's layout (``assembly_format``) and is
ignored under any other.

``build`` runs in the background (``app.web.splicebases``), never on a request: it takes no state row lock
and no version row lock (Terraform's GET of the head goes on meanwhile), only a transaction-scoped advisory
lock on the version so two processes do not build the same base at once. It streams from a server-side cursor
(a batch of rows and a few pieces in memory: the pieces go to Postgres between the row fetches, and
Postgres joins and compresses them), so a background build never holds the state's text. It stores nothing
when the version is gone, was pruned, is encrypted, or a later version already gives the splice a base;
after storing, the bases of earlier versions of the state are removed (only the newest is ever used).
A failure stores nothing: reads then assemble from all rows, as without a base.
"""

from __future__ import annotations

from analyzer.state_assembly import ASSEMBLY_FORMAT
from app.store import assembly, resources
from app.store.db import Database

# The advisory lock a build holds (``assembly.BUILD_LOCK_CLASS``): a first read that needs the base waits
# for it rather than assembling from all rows beside the build.
_LOCK_CLASS = assembly.BUILD_LOCK_CLASS
_TRY_LOCK = f"SELECT pg_try_advisory_xact_lock(%s, {assembly.BUILD_LOCK_KEY})"
_VERSION = """
SELECT v.state_id, v.serial, v.lineage, v.terraform_version FROM state_versions v
WHERE v.id = %(id)s AND v.source <> 'apply' AND NOT v.encrypted AND v.raw_state IS NOT NULL
  AND v.pruned_at IS NULL
  AND NOT EXISTS (SELECT 1 FROM state_version_bases b WHERE b.version_id = v.id)
  AND NOT EXISTS (SELECT 1 FROM state_versions w
                  WHERE w.state_id = v.state_id AND w.serial > v.serial
                    AND (w.source <> 'apply' OR (w.raw_state IS NOT NULL AND w.assembly_format = %(format)s)))
"""
_STORE = """
INSERT INTO state_version_bases (version_id, state_id, raw, size_bytes, sha256, assembly_format)
SELECT %(id)s, %(state)s, n.raw, %(size)s, %(sha256)s, %(format)s
FROM (SELECT string_agg(data, ''::bytea ORDER BY seq) AS raw FROM kl_spliced_pieces) n
WHERE octet_length(n.raw) = %(size)s
  AND EXISTS (SELECT 1 FROM state_versions v WHERE v.id = %(id)s AND v.pruned_at IS NULL)
ON CONFLICT (version_id) DO NOTHING
"""
_DROP_OLDER = """
DELETE FROM state_version_bases b USING state_versions v
WHERE b.state_id = %(state)s AND v.id = b.version_id AND v.serial < %(serial)s
"""


def build(db: Database, version_id: int) -> bool:
    """Store the splice base of a version Terraform wrote; whether one was stored (False: not needed, not
    possible, or another process is building it)."""
    with db.transaction() as conn:
        locked = conn.execute(_TRY_LOCK, (_LOCK_CLASS, version_id)).fetchone()
        if locked is None or not locked[0]:
            return False
        row = conn.execute(_VERSION, {"id": version_id, "format": ASSEMBLY_FORMAT}).fetchone()
        if row is None:
            return False
        state_id, serial, lineage, terraform_version = row
        outputs = resources.outputs_of(conn, version_id=version_id)
        writer = assembly.CacheWriter(conn)
        text = assembly.from_rows(conn, state_id, serial, lineage, terraform_version, outputs, between=writer.flush_due)
        try:
            for piece in text:
                writer.add(piece)
        finally:
            text.close()  # before the transaction ends, as the assembly on a read does
        stored = writer.finish_with(_STORE, {"id": version_id, "state": state_id})
        if stored:
            conn.execute(_DROP_OLDER, {"state": state_id, "serial": serial})
        return stored
