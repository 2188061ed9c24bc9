"""The in-process open-set cache: used only for the exact head it describes, whoever wrote last.

Every write's rows are checked against the table: a stale open set would leave a changed instance
with two live rows (refused by the unique index) or an unchanged one with none.
"""

from __future__ import annotations

import multiprocessing
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from multiprocessing.connection import Connection

import psycopg
import pytest

from analyzer.state import ParsedState, parse_state
from app.domain.lifecycle import OpenRow
from app.domain.principal import default_principal
from app.errors import SerialConflictError
from app.store import Database, resources, states
from app.store.opencache import OPEN_SETS, HeadKey, OpenSets
from tests.helpers import instance, resource, state

WHO = default_principal("cache-test")
T0 = datetime(2026, 11, 30, tzinfo=UTC)


def _key(state_id: int = 1, version_id: int = 1, *, database: str = "db", at: datetime = T0) -> HeadKey:
    return HeadKey(database, state_id, version_id, at)


def _rows(n: int) -> dict[tuple[str, str], OpenRow]:
    return {(f"a.b[{i}]", ""): OpenRow(i, f"h{i}") for i in range(n)}


# --- the LRU itself -------------------------------------------------------------------------------


def test_an_open_set_is_returned_only_for_the_exact_head_it_was_stored_for() -> None:
    cache = OpenSets()
    rows = _rows(3)
    cache.put(_key(version_id=5), rows)
    assert cache.get(_key(version_id=5, database="other")) is None
    assert cache.get(_key(version_id=5, state_id=2)) is None
    assert cache.get(_key(version_id=5)) is rows
    assert cache.get(_key(version_id=5, at=T0 + timedelta(microseconds=1))) is None


def test_a_lookup_for_another_head_drops_the_entry_for_good() -> None:
    cache = OpenSets()
    cache.put(_key(version_id=5), _rows(3))
    assert cache.get(_key(version_id=6)) is None
    assert cache.get(_key(version_id=5)) is None
    assert cache.stats().rows == 0 and cache.stats().states == 0


def test_the_least_recently_used_states_go_first_when_rows_exceed_the_bound() -> None:
    cache = OpenSets(max_rows=10)
    cache.put(_key(1), _rows(4))
    cache.put(_key(2), _rows(4))
    assert cache.get(_key(1)) is not None  # state 1 is now the most recently used
    cache.put(_key(3), _rows(4))
    assert cache.head_of("db", 2) is None
    assert cache.head_of("db", 1) == _key(1) and cache.head_of("db", 3) == _key(3)
    assert cache.stats().rows == 8


def test_a_state_larger_than_the_bound_is_not_kept_and_forgets_its_old_entry() -> None:
    cache = OpenSets(max_rows=10)
    cache.put(_key(1, version_id=1), _rows(4))
    cache.put(_key(1, version_id=2), _rows(11))
    assert cache.head_of("db", 1) is None
    assert cache.stats().rows == 0


# --- through the store, against the table --------------------------------------------------------


def _body(serial: int, values: dict[int, str]) -> bytes:
    return state(serial, [resource("item", [instance(k, v) for k, v in sorted(values.items())])])


def _live_rows(url: str, name: str) -> set[tuple[str, str, str]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            """SELECT r.address, r.deposed, r.attributes_hash FROM resources r JOIN states s ON s.id = r.state_id
               WHERE s.name = %s AND r.delete_serial IS NULL""", (name,)).fetchall()
    return set(rows)


def _expected_rows(body: bytes) -> set[tuple[str, str, str]]:
    parsed = parse_state(body)
    assert isinstance(parsed, ParsedState)
    return {(r.address, r.deposed, r.attributes_hash) for r in parsed.instances}


def _delta(before: bytes | None, after: bytes) -> tuple[int, int]:
    """(opened, closed) as the lifecycle model says: changed rows close and reopen."""
    old = {(a, d): h for a, d, h in _expected_rows(before)} if before else {}
    new = {(a, d): h for a, d, h in _expected_rows(after)}
    opened = sum(1 for key, digest in new.items() if old.get(key) != digest)
    closed = sum(1 for key, digest in old.items() if new.get(key) != digest)
    return opened, closed


def _write(db: Database, name: str, body: bytes) -> tuple[states.WriteResult, int]:
    """Write through the store; also return how many cache hits the write made."""
    before = OPEN_SETS.stats().hits
    result = states.write_state(db, WHO, name, body, lock_id=None)
    return result, OPEN_SETS.stats().hits - before


def test_consecutive_writes_reuse_the_open_set_and_write_exactly_the_delta(db: Database, clean_db: str) -> None:
    values = {k: f"v{k}" for k in range(20)}
    _write(db, "s", _body(1, values))
    for serial in range(2, 8):
        values[serial] = f"changed-{serial}"  # one change
        if serial % 3 == 0:
            del values[serial + 10]  # and sometimes one removal
        body = _body(serial, values)
        result, hits = _write(db, "s", body)
        assert hits == 1
        assert (result.opened, result.closed) == (1, 2 if serial % 3 == 0 else 1)
        assert _live_rows(clean_db, "s") == _expected_rows(body)


def test_a_write_that_rolls_back_after_projecting_never_lends_its_open_set(db: Database, clean_db: str) -> None:
    values = {k: f"v{k}" for k in range(10)}
    _write(db, "s", _body(1, values))
    doomed = parse_state(_body(2, {**values, 3: "never-committed", 99: "never"}))
    assert isinstance(doomed, ParsedState)
    with pytest.raises(RuntimeError), db.transaction() as conn:  # as if the commit itself had failed
        row = states.locked_row(conn, WHO, "s", create=False)
        assert row is not None
        conn.execute("""INSERT INTO state_versions (tenant_id, state_id, serial, lineage, raw_state, sha256,
                        size_bytes, source) VALUES (1, %s, 2, 'l', '\\x00', 'x', 1, 'test')""", (row.id,))
        resources.project(conn, tenant_id=1, state_id=row.id, serial=2, instances=doomed.instances)
        raise RuntimeError("rolled back after project")
    body = _body(2, {**values, 4: "committed"})
    result, hits = _write(db, "s", body)
    assert hits == 0  # the staged open set names a head that never came to be
    assert (result.opened, result.closed) == (1, 1)
    assert _live_rows(clean_db, "s") == _expected_rows(body)
    _, hits = _write(db, "s", _body(3, {**values, 4: "committed", 5: "again"}))
    assert hits == 1


def test_a_rejected_write_changes_nothing_and_leaves_the_cache_warm(db: Database, clean_db: str) -> None:
    values = {k: f"v{k}" for k in range(10)}
    _write(db, "s", _body(1, values))
    body = _body(2, {**values, 1: "x"})
    _write(db, "s", body)
    with pytest.raises(SerialConflictError):
        _write(db, "s", _body(1, {**values, 2: "stale"}))
    assert _live_rows(clean_db, "s") == _expected_rows(body)
    assert states.read_head(db, WHO, "s") == body
    body = _body(3, {**values, 1: "x", 2: "y"})
    _, hits = _write(db, "s", body)
    assert hits == 1
    assert _live_rows(clean_db, "s") == _expected_rows(body)


def test_ids_that_come_back_after_restart_identity_never_match_an_old_entry(db: Database, clean_db: str) -> None:
    values = {k: f"v{k}" for k in range(10)}
    _write(db, "s", _body(1, values))
    _write(db, "s", _body(2, {**values, 1: "x"}))  # the entry now names version 2 of state 1
    with psycopg.connect(clean_db, autocommit=True) as conn:
        conn.execute("TRUNCATE states, state_versions, resources, outputs, events RESTART IDENTITY CASCADE")
    # A new state 1 reaches version 2 through writes that do not project (encrypted envelopes)...
    for serial in (1, 2):
        states.write_state(db, WHO, "t", (b'{"serial": %d, "lineage": "l", "encrypted_data": "eA==", '
                                          b'"encryption_version": "v0"}' % serial), lock_id=None)
    with psycopg.connect(clean_db) as conn:
        assert conn.execute("SELECT id, head_version_id FROM states").fetchall() == [(1, 2)]
    with db.transaction() as conn:
        cached = OPEN_SETS.head_of(resources.database_identity(conn), 1)
    assert cached is not None and cached.version_id == 2  # the same ids, but another state's rows
    body = _body(3, {k: f"w{k}" for k in range(5)})
    result, hits = _write(db, "t", body)
    assert hits == 0 and result.opened == 5
    assert _live_rows(clean_db, "t") == _expected_rows(body)



# --- two processes writing one state ----------------------------------------------------------


def _other_process(url: str, pipe: Connection) -> None:
    """A second server process: its own Database and its own cache, writing when asked."""
    db = Database(url, pool_size=1)
    try:
        while (request := pipe.recv()) is not None:
            name, body = request
            result, hits = _write(db, name, body)
            pipe.send((result.opened, result.closed, hits))
    finally:
        db.close()


@pytest.fixture
def other_process(clean_db: str) -> Iterator[Connection]:
    context = multiprocessing.get_context("spawn")  # no inherited pool threads or cache
    ours, theirs = context.Pipe()
    process = context.Process(target=_other_process, args=(clean_db, theirs), daemon=True)
    process.start()
    try:
        yield ours
    finally:
        ours.send(None)
        process.join(timeout=30)
        if process.is_alive():
            process.kill()


def test_two_processes_writing_one_state_in_turn_each_see_the_others_writes(
    db: Database, clean_db: str, other_process: Connection
) -> None:
    rng = random.Random(4)
    values = {k: f"v{k}" for k in range(30)}
    writers = "AABABBBAABAB"
    previous: str | None = None
    previous_body: bytes | None = None
    for serial, writer in enumerate(writers, start=1):
        if serial > 1:
            key = rng.randrange(40)
            values[key] = f"{writer}-{serial}"
            if serial % 4 == 0:
                values.pop(rng.choice(sorted(values)))
        body = _body(serial, values)
        if writer == "A":
            result, hits = _write(db, "shared", body)
            opened, closed = result.opened, result.closed
        else:
            other_process.send(("shared", body))
            assert other_process.poll(60), "the other process did not answer within a minute"
            opened, closed, hits = other_process.recv()
        assert hits == (1 if previous == writer else 0), f"write {serial} by {writer}"
        assert _live_rows(clean_db, "shared") == _expected_rows(body), f"write {serial} by {writer}"
        assert (opened, closed) == _delta(previous_body, body), f"write {serial} by {writer}"
        previous, previous_body = writer, body
