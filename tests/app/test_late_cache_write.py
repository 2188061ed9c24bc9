"""A first GET's cache write comes after its body: readers get every byte first, the bytes are stored
once the response is done, concurrent first readers still coalesce on the version's row lock, and a
failed late write is logged without state content and leaves the version uncached (the next reader
assembles again), and the large-body slot the assembly took is held until that write is done."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from typing import Any

import psycopg
import pytest
import requests

from app.store import assembly
from app.store.db import Database
from tests.app.test_lazy_state import COUNT, STATE, commit_one
from tests.helpers import counted_state


def _version_id(url: str, serial: int) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT id FROM state_versions WHERE serial = %s", (serial,)).fetchone()
    assert row is not None
    return int(row[0])


def _cached(url: str, serial: int) -> tuple[bytes | None, str | None]:
    """The version's stored bytes and digest once no reader holds its row lock (a late cache write holds
    it until it commits)."""
    with psycopg.connect(url) as conn:
        conn.execute("SELECT 1 FROM state_versions WHERE serial = %s FOR NO KEY UPDATE", (serial,))
        conn.rollback()
        row = conn.execute("SELECT raw_state, sha256 FROM state_versions WHERE serial = %s", (serial,)).fetchone()
    assert row is not None
    return (None if row[0] is None else bytes(row[0])), row[1]


def _waiting_on_a_lock(url: str) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                           "AND wait_event_type = 'Lock'").fetchone()
    return row is not None and row[0] > 0


def test_over_http_the_body_comes_first_then_the_bytes_are_stored(live_server: Any, clean_db: str) -> None:
    http = requests.Session()
    url = f"{live_server.url}{STATE}"
    assert http.post(url, data=counted_state(1, COUNT)).status_code == 200
    serial = commit_one(http, live_server.url, 3, "rows", 1)
    first = http.get(url)
    assert first.status_code == 200
    assert "Content-Length" not in first.headers  # assembled from all rows: its size is known at the end
    assert _cached(clean_db, serial) == (first.content, hashlib.sha256(first.content).hexdigest())
    serial = commit_one(http, live_server.url, 5, "spliced", serial)
    spliced = http.get(url)
    assert spliced.status_code == 200 and b'"spliced"' in spliced.content
    assert spliced.headers["Content-Length"] == str(len(spliced.content))
    assert _cached(clean_db, serial) == (spliced.content, hashlib.sha256(spliced.content).hexdigest())
    again = http.get(url)
    assert again.content == spliced.content and again.headers["Content-Length"] == str(len(spliced.content))


def test_a_reader_arriving_before_the_late_write_waits_for_it(client: Any, db: Database, clean_db: str) -> None:
    client.post(STATE, data=counted_state(1, COUNT))
    serial = commit_one(client, "", 7, "late", 1)
    version_id = _version_id(clean_db, serial)
    found = assembly.Found(late=True)
    body = b"".join(assembly.stream(db, version_id, found))  # every piece out, the cache write still to come
    assert found.assembled and not found.cached
    results: list[assembly.Materialised | None] = []
    other = threading.Thread(target=lambda: results.append(assembly.materialise(db, version_id)))
    other.start()
    deadline = time.monotonic() + 60
    while not _waiting_on_a_lock(clean_db):
        assert time.monotonic() < deadline, "the second reader never waited on the row lock"
        time.sleep(0.01)
    found.finish()
    other.join(timeout=120)
    assert found.cached
    assert len(results) == 1 and results[0] is not None
    assert not results[0].assembled and results[0].raw == body  # it read the bytes the first one stored


def test_a_failed_late_write_is_logged_without_content_and_leaves_the_version_uncached(
        client: Any, db: Database, clean_db: str, caplog: pytest.LogCaptureFixture) -> None:
    client.post(STATE, data=counted_state(1, COUNT))
    serial = commit_one(client, "", 9, "secret-value-9", 1)
    version_id = _version_id(clean_db, serial)
    found = assembly.Found(late=True)
    body = b"".join(assembly.stream(db, version_id, found))
    # The reader's connection goes away before the cache write.
    with psycopg.connect(clean_db, autocommit=True) as conn:
        ended = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
                             "current_database() AND state = 'idle in transaction'").fetchall()
    assert ended == [(True,)]
    with caplog.at_level(logging.WARNING, logger="kilolock.store"):
        found.finish()
    assert not found.cached
    assert "stays uncached" in caplog.text and "secret-value" not in caplog.text and "v-1" not in caplog.text
    assert _cached(clean_db, serial) == (None, None)
    again = assembly.materialise(db, version_id)  # the next reader assembles and caches
    assert again is not None and again.assembled and again.cached and again.raw == body
    assert client.get(STATE).data == body


def test_a_spliced_read_takes_its_digest_after_its_last_piece(client: Any, db: Database, clean_db: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing of the cache write runs between the spliced file's pieces: the digest of every byte, as the
    reader got them, is taken once the last piece is out, then the bytes are stored under it."""
    client.post(STATE, data=counted_state(1, COUNT))
    serial = commit_one(client, "", 3, "rows", 1)
    assert client.get(STATE).status_code == 200  # assembled from all rows and cached: the next one's base
    serial = commit_one(client, "", 9, "spliced", serial)
    yielded: list[bytes] = []
    digested: list[tuple[int, bytes]] = []  # (pieces out when digested, the digested bytes)
    digest = assembly.CacheWriter.digest

    def recorded(self: assembly.CacheWriter, piece: bytes | memoryview) -> None:
        digested.append((len(yielded), bytes(piece)))
        digest(self, piece)

    monkeypatch.setattr(assembly.CacheWriter, "digest", recorded)
    found = assembly.Found()
    for piece in assembly.stream(db, _version_id(clean_db, serial), found):
        yielded.append(piece)
    body = b"".join(yielded)
    assert found.spliced and found.cached and b'"spliced"' in body and len(yielded) > 1
    assert digested and all(out == len(yielded) for out, _ in digested)
    assert b"".join(data for _, data in digested) == body
    assert _cached(clean_db, serial) == (body, hashlib.sha256(body).hexdigest())


def test_a_cache_writer_digests_its_parts_in_order_whenever_they_are_sent(
        db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """One rule for every writer: each part is digested as it goes to Postgres, a range of the base over the
    base's bytes, so the digest is the file's whether the parts go between fetches or all at the end."""
    monkeypatch.setattr(assembly, "_FLUSH_BYTES", 4)
    base = bytearray(b"0123456789")
    with db.transaction() as conn:
        writer = assembly.CacheWriter(conn, base=base)
        writer.add(b"ab")
        writer.add_base(2, 5)
        writer.flush_due()  # past the (lowered) threshold: these two go now
        sent = conn.execute("SELECT count(*) FROM kl_spliced_pieces").fetchone()
        writer.add(b"cd")
        writer.add_base(0, 1)
        with pytest.raises(ValueError, match="base"):
            writer.add_base(8, 5)  # beyond the base
        expected = hashlib.sha256(b"ab" + b"23456" + b"cd" + b"0").hexdigest()
        assert writer.finish_with("SELECT 1 WHERE %(sha256)s = %(expected)s AND %(size)s = 10",
                                  {"expected": expected})
        conn.rollback()
    assert sent == (2,)
    with db.transaction() as conn:
        with pytest.raises(ValueError, match="base"):
            assembly.CacheWriter(conn).add_base(0, 1)  # no base given
        conn.rollback()


def test_a_first_gets_large_body_slot_is_held_until_its_cache_write_is_done(settings: Any, clean_db: str) -> None:
    # The assembly keeps its pieces until the cache write after the body: its slot covers that write too.
    from dataclasses import replace

    from app.web import create_app

    application = create_app(replace(settings, large_body_bytes=1000, max_large_bodies=1, splice_base_bytes=0))
    client = application.test_client()
    other = counted_state(1, 20)
    try:
        assert client.post(STATE, data=counted_state(1, COUNT)).status_code == 200
        serial = commit_one(client, "", 7, "slot", 1)
        answer = client.get(STATE, buffered=False)
        body = b"".join(answer.response)  # the whole body: the request is over, its response not yet closed
        assert client.post("/v1/states/other", data=other).status_code == 503
        answer.close()
        assert _cached(clean_db, serial) == (body, hashlib.sha256(body).hexdigest())
        assert client.post("/v1/states/other", data=other).status_code == 200
    finally:
        application.extensions["kilolock"].db.close()
