"""The assembly's rows from the cursor (the text made above the sort, the fetches pipelined): the same rows in
the same order as the analyzer sorts them, statements may run on the connection between rows, the cache's
pieces are written between fetches, and an iteration closed early (a reader that goes away mid-stream)
leaves the connection usable and nothing cached."""

from __future__ import annotations

import hashlib
from typing import Any

import psycopg
import pytest

from analyzer.state_assembly import row_order
from app.store import assembly, resources
from tests.app.test_lazy_state import STATE, commit_one, stored
from tests.helpers import counted_state

COUNT = 4000  # more than one piece of the streamed file (about 1 MB), so a reader can leave mid-stream


def _head(url: str) -> tuple[int, int]:
    with psycopg.connect(url) as conn:
        found = conn.execute("SELECT state_id, max(serial) FROM state_versions GROUP BY state_id").fetchone()
    assert found is not None
    return int(found[0]), int(found[1])


@pytest.fixture
def committed(client: Any, clean_db: str) -> tuple[int, int]:
    assert client.post(STATE, data=counted_state(1, COUNT)).status_code == 200
    commit_one(client, "", 3, "changed", 1)
    return _head(clean_db)


def test_streamed_rows_are_the_rows_in_assembly_order(committed: tuple[int, int], clean_db: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resources, "STREAM_BATCH", 7)  # many batches
    state_id, serial = committed
    with psycopg.connect(clean_db) as conn:
        expected = sorted(resources.instances_at(conn, state_id=state_id, serial=serial), key=row_order)
        got = []
        for i, row in enumerate(resources.stream_assembly_rows(conn, state_id=state_id, serial=serial)):
            if i % 500 == 0:  # another statement on the connection between rows
                assert conn.execute("SELECT 1").fetchone() == (1,)
            got.append(row)
    assert [(r.address, r.deposed, r.provider, bytes(r.instance_json).decode()) for r in got] == [
        (r.address, r.deposed, r.provider, r.instance_json) for r in expected]


def test_closing_the_rows_early_leaves_the_connection_usable(
        committed: tuple[int, int], clean_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resources, "STREAM_BATCH", 5)
    state_id, serial = committed
    with psycopg.connect(clean_db) as conn:
        rows = resources.stream_assembly_rows(conn, state_id=state_id, serial=serial)
        next(rows)
        rows.close()
        assert conn.execute("SELECT count(*) FROM pg_cursors").fetchone() == (0,)
        # The same transaction goes on, and a second stream reads every row.
        assert sum(1 for _ in resources.stream_assembly_rows(conn, state_id=state_id, serial=serial)) == COUNT


def test_a_reader_that_leaves_mid_stream_leaves_nothing_cached(client: Any, clean_db: str,
                                                                            committed: tuple[int, int]) -> None:
    answer = client.get(STATE, buffered=False)
    assert answer.status_code == 200
    first = next(answer.response)
    assert first and len(first) < 2 * 1024 * 1024
    answer.close()
    assert stored(clean_db)[-1][2] is False
    full = client.get(STATE).data
    assert full.startswith(first) and stored(clean_db)[-1][2] is True


def test_pieces_written_between_pipelined_fetches_cache_the_bytes_the_reader_gets(
        client: Any, clean_db: str, committed: tuple[int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    # Many fetches and a COPY of the pieces due after every piece: each one waits for a gap between fetches.
    monkeypatch.setattr(resources, "STREAM_BATCH", 50)
    monkeypatch.setattr(assembly, "_FLUSH_BYTES", 1)
    body = client.get(STATE).data
    with psycopg.connect(clean_db) as conn:
        cached = conn.execute("SELECT raw_state, sha256 FROM state_versions ORDER BY serial DESC LIMIT 1").fetchone()
    assert cached is not None and bytes(cached[0]) == body
    assert cached[1] == hashlib.sha256(body).hexdigest()
    assert body == client.get(STATE).data
