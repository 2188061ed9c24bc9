"""A pooled connection that read a large value is retired: the value is read whole, the pool hands out a new
connection next (libpq's input buffer of the old one is gone with it), and no warning is logged for it."""

from __future__ import annotations

import logging

import pytest

from app.store.db import LARGE_VALUE_BYTES, Database, retire

_BIG = "SELECT convert_to(repeat('x', %s), 'UTF8')"


def test_a_retired_connection_is_replaced_without_a_warning(db: Database, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="psycopg.pool")
    with db.transaction() as conn:
        first = conn.info.backend_pid
        row = conn.execute(_BIG, (LARGE_VALUE_BYTES,), binary=True).fetchone()
        assert row is not None and len(row[0]) == LARGE_VALUE_BYTES
        retire(conn)
    assert conn.closed
    with db.transaction() as conn:
        assert conn.info.backend_pid != first
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.records

