"""A bulk write leaves the dependencies index with nothing pending.

New entries of a GIN index wait in its pending list until vacuum folds them in, and every dependents
lookup (``edges``) reads that whole list. After a write that opens ``BULK_ROWS`` rows or more the store
folds the list in at once, with the statistics, or hands that to its caller (the server's upkeep thread,
which runs it after the response); a smaller write leaves it to vacuum. The probe is
Postgres's own ``gin_clean_pending_list``, which returns how many pending pages it had to fold.
"""

from __future__ import annotations

import logging

import psycopg
import pytest
from flask import Flask
from flask.testing import FlaskClient

from app.domain.principal import default_principal
from app.store import Database, states
from app.web.upkeep import Upkeep
from tests.conftest import wait_for
from tests.helpers import instance, resource, state

WHO = default_principal("upkeep-test")
_PENDING = "SELECT gin_clean_pending_list('resources_alive_deps_gin'::regclass)"


def _body(serial: int, count: int) -> bytes:
    rows = [instance(i, f"v-{i}", deps=[f"terraform_data.dep[{i % 7}]"]) for i in range(count)]
    return state(serial, [resource("item", rows)])


def _pending_pages(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(_PENDING).fetchone()
    assert row is not None
    return int(row[0])


def test_a_small_write_leaves_pending_entries_to_vacuum(db: Database, clean_db: str) -> None:
    states.write_state(db, WHO, "small", _body(1, 200), lock_id=None)
    assert _pending_pages(clean_db) > 0


def test_a_bulk_write_folds_the_pending_list_in(db: Database, clean_db: str) -> None:
    states.write_state(db, WHO, "bulk", _body(1, states.BULK_ROWS), lock_id=None)
    assert _pending_pages(clean_db) == 0


def test_a_bulk_write_hands_the_refresh_to_its_caller(db: Database, clean_db: str) -> None:
    asked: list[None] = []
    states.write_state(
        db, WHO, "handed", _body(1, states.BULK_ROWS), lock_id=None, after_bulk=lambda: asked.append(None)
    )
    assert asked == [None]
    assert _pending_pages(clean_db) > 0  # not folded before the write returned: that is the caller's now


def test_a_small_write_asks_its_caller_for_nothing(db: Database) -> None:
    asked: list[None] = []
    states.write_state(db, WHO, "small", _body(1, 200), lock_id=None, after_bulk=lambda: asked.append(None))
    assert asked == []


def test_a_bulk_post_folds_the_pending_list_in_after_the_answer(app: Flask, client: FlaskClient, clean_db: str) -> None:
    """Over HTTP the fold runs on the process's upkeep thread, after the response."""
    upkeep = app.extensions["kilolock"].upkeep
    assert upkeep is not None
    assert client.post("/v1/states/bulk", data=_body(1, states.BULK_ROWS)).status_code == 200
    assert upkeep.join(timeout=300), "the upkeep after the bulk POST did not finish"
    assert upkeep.done >= 1
    assert _pending_pages(clean_db) == 0
    assert _analyzed_rows(clean_db) >= states.BULK_ROWS  # the statistics count the new rows


def test_requests_during_a_refresh_coalesce_into_one_more(db: Database, clean_db: str) -> None:
    upkeep = Upkeep(db)
    try:
        with db.transaction() as conn:
            # Hold a lock ANALYZE needs, so the first refresh waits while more requests arrive.
            conn.execute("LOCK TABLE resources IN SHARE UPDATE EXCLUSIVE MODE")
            upkeep.request()
            wait_for(lambda: upkeep.running, "the first refresh to start")
            for _ in range(5):
                upkeep.request()
        assert upkeep.join(timeout=300)
        assert upkeep.done == 2
    finally:
        upkeep.stop()


def test_a_failed_refresh_is_logged_by_its_class_and_the_thread_goes_on(
    clean_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    closed = Database(clean_db, pool_size=1)
    closed.close()
    upkeep = Upkeep(closed)
    try:
        with caplog.at_level(logging.WARNING, logger="kilolock.upkeep"):
            upkeep.request()
            assert upkeep.join(timeout=120)
            upkeep.request()
            assert upkeep.join(timeout=120)
        assert upkeep.done == 2
        failures = [r.getMessage() for r in caplog.records if r.name == "kilolock.upkeep"]
        assert len(failures) == 2 and all("failed (" in m for m in failures), failures
    finally:
        upkeep.stop()


def _analyzed_rows(url: str) -> float:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT reltuples FROM pg_class WHERE oid = 'resources'::regclass").fetchone()
    assert row is not None
    return float(row[0])


def test_work_handed_on_runs_after_the_refresh_that_covers_it(db: Database) -> None:
    upkeep = Upkeep(db)
    seen: list[tuple[str, int]] = []
    try:
        upkeep.then(lambda: seen.append(("idle", upkeep.done)))
        assert seen == [("idle", 0)]  # nothing pending: at once
        with db.transaction() as conn:
            conn.execute("LOCK TABLE resources IN SHARE UPDATE EXCLUSIVE MODE")  # ANALYZE waits for this
            upkeep.request()
            wait_for(lambda: upkeep.running, "the first refresh to start")
            upkeep.then(lambda: seen.append(("running", upkeep.done)))  # after the running refresh
            upkeep.request()
            upkeep.then(lambda: seen.append(("next", upkeep.done)))  # after the one asked for now
            assert seen == [("idle", 0)]
        assert upkeep.join(timeout=300)
        wait_for(lambda: len(seen) == 3, "the handed-on work to run")
        assert seen == [("idle", 0), ("running", 1), ("next", 2)]
    finally:
        upkeep.stop()
