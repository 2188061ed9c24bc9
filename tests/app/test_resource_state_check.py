"""Resource rows always belong to an existing state, and deleting a state deletes them.

``resources.state_id`` has no row-by-row foreign key; a statement-level check after each INSERT or COPY
takes each new row's state FOR KEY SHARE and refuses a missing one, and a trigger on ``states`` deletes a
deleted state's rows (migration 0028). These tests drive the database directly, including from a writer that
skips the state's row lock, so they fail if either guarantee or the ordering against a concurrent deletion
breaks.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator

import psycopg
import pytest

from analyzer.state import parse_state
from app.domain.principal import default_principal
from app.errors import StateNotFoundError
from app.store import Database, resources, states
from tests.conftest import wait_for
from tests.helpers import counted_state, lock_info

WHO = default_principal("state-check-test")
_INSERT = """
INSERT INTO resources (tenant_id, state_id, address, resource_address, mode, type, name, provider, instance,
                       attributes_hash, create_serial)
VALUES (1, %s, %s, 'terraform_data.x', 'managed', 'terraform_data', 'x', 'p', '{}', 'h', 1)
"""
_ORPHANS = "SELECT count(*) FROM resources r WHERE NOT EXISTS (SELECT 1 FROM states s WHERE s.id = r.state_id)"
_WAITING_ON_A_LOCK = "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s"


def _state_id(db: Database, name: str) -> int:
    with db.transaction() as conn:
        return states.find_state(conn, WHO, name).id


def _count(url: str, query: str, *args: object) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query, args).fetchone()
    assert row is not None
    return int(row[0])


def _missing_state(url: str) -> int:
    return _count(url, "SELECT coalesce(max(id), 0) + 1000 FROM states")


@contextlib.contextmanager
def _two_connections(url: str) -> Iterator[tuple[psycopg.Connection, psycopg.Connection]]:
    """Two connections, each cancelled before either is closed: a thread left waiting on a lock the other
    holds (a failed assertion) then fails instead of holding the close, and the test, forever."""
    first, second = psycopg.connect(url), psycopg.connect(url)
    try:
        yield first, second
    finally:
        for conn in (first, second):
            conn.cancel_safe(timeout=10)
        for conn in (first, second):
            conn.close()


def _in_thread(work: Callable[[], object]) -> tuple[threading.Thread, list[BaseException]]:
    failures: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # handed to the test, which asserts on it
            failures.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, failures


def test_an_insert_for_a_missing_state_is_refused(clean_db: str) -> None:
    missing = _missing_state(clean_db)
    with psycopg.connect(clean_db) as conn, pytest.raises(psycopg.errors.ForeignKeyViolation, match="does not exist"):
        conn.execute(_INSERT, (missing, "terraform_data.x"))
    assert _count(clean_db, "SELECT count(*) FROM resources") == 0


def test_a_copy_for_a_missing_state_is_refused(db: Database, clean_db: str) -> None:
    states.lock(db, WHO, "real", lock_info("held"))  # a state with no rows yet
    real, missing = _state_id(db, "real"), _missing_state(clean_db)
    parsed = parse_state(counted_state(1, 3))
    with psycopg.connect(clean_db) as conn, pytest.raises(psycopg.errors.ForeignKeyViolation):
        # The COPY for the existing state passes; the one for the missing state fails, and with it the transaction.
        resources.insert_rows(conn, tenant_id=1, state_id=real, serial=5, rows=parsed.instances)  # type: ignore[union-attr]
        resources.insert_rows(conn, tenant_id=1, state_id=missing, serial=5, rows=parsed.instances)  # type: ignore[union-attr]
    assert _count(clean_db, "SELECT count(*) FROM resources WHERE create_serial = 5") == 0


def test_a_row_cannot_move_to_another_state(db: Database, clean_db: str) -> None:
    states.write_state(db, WHO, "one", counted_state(1, 2), lock_id=None)
    states.write_state(db, WHO, "two", counted_state(1, 2), lock_id=None)
    one, two = _state_id(db, "one"), _state_id(db, "two")
    with psycopg.connect(clean_db) as conn, pytest.raises(psycopg.errors.IntegrityConstraintViolation):
        conn.execute("UPDATE resources SET state_id = %s WHERE state_id = %s", (two, one))
    assert _count(clean_db, "SELECT count(*) FROM resources WHERE state_id = %s", one) == 2


def test_deleting_a_state_deletes_its_rows_and_their_changes(db: Database, clean_db: str) -> None:
    states.write_state(db, WHO, "gone", counted_state(1, 4), lock_id=None)
    states.write_state(db, WHO, "gone", counted_state(2, 4, changed=1), lock_id=None)
    states.write_state(db, WHO, "kept", counted_state(1, 3), lock_id=None)
    gone, kept = _state_id(db, "gone"), _state_id(db, "kept")
    assert _count(clean_db, "SELECT count(*) FROM resources WHERE state_id = %s", gone) == 5
    assert _count(clean_db, "SELECT count(*) FROM resource_changes") == 1
    states.delete_state(db, WHO, "gone", lock_id=None)
    with db.transaction() as conn, pytest.raises(StateNotFoundError):
        states.find_state(conn, WHO, "gone")
    assert _count(clean_db, "SELECT count(*) FROM resources WHERE state_id = %s", gone) == 0
    assert _count(clean_db, "SELECT count(*) FROM resource_changes") == 0
    assert _count(clean_db, "SELECT count(*) FROM resources WHERE state_id = %s", kept) == 3
    assert _count(clean_db, _ORPHANS) == 0


def test_a_deletion_waits_for_a_write_in_flight_and_removes_its_rows(db: Database, clean_db: str) -> None:
    """A writer that (against the rule) skips the state's row lock still holds the deletion off until it
    commits, and the deletion then removes what it wrote."""
    states.write_state(db, WHO, "raced", counted_state(1, 2), lock_id=None)
    raced = _state_id(db, "raced")
    with _two_connections(clean_db) as (deleter, writer):
        writer.execute(_INSERT, (raced, "terraform_data.late"))  # not committed yet
        pid = deleter.info.backend_pid

        def delete() -> None:
            deleter.execute("DELETE FROM states WHERE id = %s", (raced,))
            deleter.commit()

        thread, failures = _in_thread(delete)
        wait_for(lambda: _count(clean_db, _WAITING_ON_A_LOCK, pid), "the deletion to wait for the writer")
        writer.commit()
        thread.join(60)
        assert not thread.is_alive() and failures == []
    assert _count(clean_db, "SELECT count(*) FROM resources WHERE state_id = %s", raced) == 0
    assert _count(clean_db, _ORPHANS) == 0


def test_a_write_after_an_uncommitted_deletion_waits_and_is_refused(db: Database, clean_db: str) -> None:
    states.write_state(db, WHO, "raced", counted_state(1, 2), lock_id=None)
    raced = _state_id(db, "raced")
    with _two_connections(clean_db) as (deleter, writer):
        deleter.execute("DELETE FROM states WHERE id = %s", (raced,))  # not committed yet
        pid = writer.info.backend_pid

        def write() -> None:
            writer.execute(_INSERT, (raced, "terraform_data.late"))
            writer.commit()

        thread, failures = _in_thread(write)
        wait_for(lambda: _count(clean_db, _WAITING_ON_A_LOCK, pid), "the write to wait for the deletion")
        deleter.commit()
        thread.join(60)
        assert not thread.is_alive()
        assert len(failures) == 1 and isinstance(failures[0], psycopg.errors.ForeignKeyViolation), failures
    assert _count(clean_db, _ORPHANS) == 0


def test_whole_state_writes_racing_deletions_leave_no_orphans(db: Database, clean_db: str) -> None:
    for serial in range(1, 6):
        body = counted_state(serial, 2000)
        writer, write_failures = _in_thread(functools.partial(states.write_state, db, WHO, "churn", body, lock_id=None))

        def delete() -> None:
            try:
                states.delete_state(db, WHO, "churn", lock_id=None)
            except StateNotFoundError:
                pass  # the write had not created it yet

        deleter, delete_failures = _in_thread(delete)
        writer.join(120)
        deleter.join(120)
        assert write_failures == [] and delete_failures == []
        assert _count(clean_db, _ORPHANS) == 0
