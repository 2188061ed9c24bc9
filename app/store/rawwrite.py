"""Writing a state version's raw bytes without a second copy of them in the server process.

A parameter of ``INSERT`` is copied whole into libpq's output buffer before it is sent, so a 150 MB body
would briefly exist twice. ``insert_version`` sends the version row with ``COPY ... (FORMAT binary)``
instead, the raw bytes a slice at a time, so only one slice is ever buffered. The row is the one the
``INSERT`` wrote (same columns, the id taken from the table's sequence first).
"""

from __future__ import annotations

import hashlib
import struct

import psycopg

_NEXT_ID = "SELECT nextval(pg_get_serial_sequence('state_versions', 'id'))"
_COPY_VERSION = """
COPY state_versions (id, tenant_id, state_id, serial, lineage, terraform_version, raw_state, sha256,
                     size_bytes, encrypted, source, actor)
FROM STDIN (FORMAT binary)
"""
# PostgreSQL's binary COPY framing: signature, flags, header extension length; a tuple's field count; the
# trailer. Each field is its length (int32) and its bytes.
_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
_FIELDS = struct.pack(">h", 12)
_TRAILER = struct.pack(">h", -1)
SLICE_BYTES = 1024 * 1024


def _int8(value: int) -> bytes:
    return struct.pack(">iq", 8, value)


def _text(value: str) -> bytes:
    data = value.encode()
    return struct.pack(">i", len(data)) + data


def insert_version(
    conn: psycopg.Connection, *, tenant_id: int, state_id: int, serial: int, lineage: str, terraform_version: str,
    raw: bytes | bytearray, sha256: str, encrypted: bool, source: str, actor: str,
) -> int:
    """Insert one row of ``state_versions`` holding ``raw``; its id."""
    return _copy_version(conn, tenant_id, state_id, serial, lineage, terraform_version, raw, sha256, encrypted,
                         source, actor)[0]


def insert_version_hashing(
    conn: psycopg.Connection, *, tenant_id: int, state_id: int, serial: int, lineage: str, terraform_version: str,
    raw: bytes | bytearray, encrypted: bool, source: str, actor: str,
) -> tuple[int, str]:
    """``insert_version`` with the sha256 of ``raw`` taken slice by slice as the bytes are sent (the column
    comes after them), so Postgres stores the first bytes while the rest are hashed; its id and the digest."""
    return _copy_version(conn, tenant_id, state_id, serial, lineage, terraform_version, raw, None, encrypted,
                         source, actor)


def _copy_version(conn: psycopg.Connection, tenant_id: int, state_id: int, serial: int, lineage: str,
                  terraform_version: str, raw: bytes | bytearray, sha256: str | None, encrypted: bool, source: str,
                  actor: str) -> tuple[int, str]:
    (version_id,) = conn.execute(_NEXT_ID).fetchone() or (0,)
    head = b"".join((_SIGNATURE, _FIELDS, _int8(version_id), _int8(tenant_id), _int8(state_id), _int8(serial),
                     _text(lineage), _text(terraform_version), struct.pack(">i", len(raw))))
    hashing = hashlib.sha256() if sha256 is None else None
    view = memoryview(raw)
    try:
        with conn.cursor() as cur, cur.copy(_COPY_VERSION) as copy:
            copy.write(head)
            for start in range(0, len(view), SLICE_BYTES):
                piece = view[start:start + SLICE_BYTES]
                if hashing is not None:
                    hashing.update(piece)
                copy.write(piece)
            digest = hashing.hexdigest() if hashing is not None else sha256 or ""
            copy.write(b"".join((_text(digest), _int8(len(raw)), struct.pack(">ib", 1, encrypted), _text(source),
                                 _text(actor), _TRAILER)))
    finally:
        view.release()
    return int(version_id), digest
