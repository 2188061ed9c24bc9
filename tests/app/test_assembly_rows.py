"""The assembly's rows (the text made above the sort), from the cursor with pipelined fetches or from one
streamed statement: the same rows in the same order as the analyzer sorts them, statements may run on the
connection between a cursor's rows, the splice base's pieces are written between fetches, a first GET's
pieces wait in the process and go to the cache in one write after its last piece, and an iteration closed
early (a reader that goes away mid-stream) leaves the connection usable and nothing cached."""

from __future__ import annotations

import hashlib
from typing import Any

import psycopg
import pytest

from analyzer.state_assembly import row_order
from app.store import assembly, resources, splicebase
from app.store.db import Database
from tests.app.test_lazy_state import STATE, commit_one, stored
from tests.helpers import counted_state

COUNT = 4000  # several pieces of the streamed file (about 256 KB each), so a reader can leave mid-stream


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
    with psycopg.connect(clean_db) as conn:
        streamed = list(resources.stream_assembly_rows(conn, state_id=state_id, serial=serial, alone=True))
    assert streamed == got


def test_a_streamed_statement_leaves_no_gap_for_other_statements(committed: tuple[int, int], clean_db: str) -> None:
    state_id, serial = committed
    with psycopg.connect(clean_db) as conn, pytest.raises(ValueError, match="no gap"):
        resources.stream_assembly_rows(conn, state_id=state_id, serial=serial, between=lambda: None, alone=True)


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
        streamed = resources.stream_assembly_rows(conn, state_id=state_id, serial=serial, alone=True)
        next(streamed)
        streamed.close()  # cancels the statement should it still run: the caller rolls back
        conn.rollback()
        assert sum(1 for _ in resources.stream_assembly_rows(conn, state_id=state_id, serial=serial,
                                                             alone=True)) == COUNT


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


def test_a_first_gets_pieces_go_to_the_cache_in_one_write_after_the_last_piece(
        client: Any, clean_db: str, committed: tuple[int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    # A COPY would be due after every piece: none runs while the rows stream, all the pieces go at the end.
    monkeypatch.setattr(assembly, "_FLUSH_BYTES", 1)
    copies: list[int] = []
    flush = assembly.CacheWriter._flush

    def counted(writer: assembly.CacheWriter) -> None:
        copies.append(len(writer._pending))
        flush(writer)
    monkeypatch.setattr(assembly.CacheWriter, "_flush", counted)
    body = client.get(STATE).data
    with psycopg.connect(clean_db) as conn:
        cached = conn.execute("SELECT raw_state, sha256 FROM state_versions ORDER BY serial DESC LIMIT 1").fetchone()
    assert cached is not None and bytes(cached[0]) == body
    assert cached[1] == hashlib.sha256(body).hexdigest()
    assert len(copies) == 1 and copies[0] > 1  # the file is several pieces, written once
    assert body == client.get(STATE).data


def test_a_splice_bases_pieces_written_between_pipelined_fetches_store_its_assembly(
        client: Any, db: Database, clean_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Many fetches and a COPY of the pieces due after every piece: each one waits for a gap between fetches.
    assert client.post(STATE, data=counted_state(1, COUNT)).status_code == 200
    monkeypatch.setattr(resources, "STREAM_BATCH", 50)
    monkeypatch.setattr(assembly, "_FLUSH_BYTES", 1)
    state_id, serial = _head(clean_db)
    with psycopg.connect(clean_db) as conn:
        version_id, lineage, terraform_version = conn.execute(
            "SELECT id, lineage, terraform_version FROM state_versions WHERE serial = %s", (serial,)).fetchone()
        expected = b"".join(assembly.from_rows(conn, state_id, serial, lineage, terraform_version,
                                               resources.outputs_of(conn, version_id=version_id)))
    assert splicebase.build(db, version_id)
    with psycopg.connect(clean_db) as conn:
        stored_base = conn.execute("SELECT raw, sha256 FROM state_version_bases WHERE version_id = %s",
                                   (version_id,)).fetchone()
    assert stored_base is not None and bytes(stored_base[0]) == expected
    assert stored_base[1] == hashlib.sha256(expected).hexdigest()
