"""The changed attribute names of a whole-state write that replaced many rows are recorded off the request.

A write that replaced ``names_inline_max`` rows or more hands the recording to its caller's ``later`` (the
server's upkeep thread, after the answer); a smaller one records before it returns. Until the handed-on
recording has run, history reads derive the names from the two rows themselves, so a reader in that window
sees the same names as one after it, never a change without names. The thresholds here are small numbers
passed as parameters; the rows are real Postgres rows written through ``states.write_state``.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg
from flask import Flask
from flask.testing import FlaskClient

from app.domain.principal import default_principal
from app.store import Database, history, states
from app.web.upkeep import Upkeep
from tests.conftest import wait_for
from tests.helpers import instance, resource, state

WHO = default_principal("names-test")
COUNT = 12


def _body(serial: int, value: str) -> bytes:
    rows = [instance(i, f"{value}-{i}") for i in range(COUNT)]
    secret = instance(None, "db", sensitive_attributes=[[{"type": "get_attr", "value": "input"}]])
    secret["attributes"]["input"] = {"value": f"pw-{value}", "type": "string"}
    secret["attributes"]["output"] = {"value": f"size-{value}", "type": "string"}
    return state(serial, [resource("item", rows), resource("db", [secret])])


def _recorded(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM resource_changes").fetchone()
    assert row is not None
    return int(row[0])


def _changes(db: Database, name: str) -> dict[str, list[tuple[str, int, list[str] | None, int]]]:
    with db.transaction() as conn:
        row = states.find_state(conn, WHO, name)
        addresses = history.addresses_under(conn, state_id=row.id, exact=(), prefixes=(), everything=True,
                                            after="", limit=100)
        found = history.histories(conn, state_id=row.id, addresses=addresses, per_address=5)
    return {h.address: [(c.kind, c.serial, c.attributes, c.sensitive) for c in h.changes] for h in found}


def _write(db: Database, serial: int, value: str, handed: list[Callable[[], object]], limit: int = 5) -> None:
    states.write_state(db, WHO, "names", _body(serial, value), lock_id=None, later=handed.append,
                       names_inline_max=limit)


def test_a_write_that_replaced_many_rows_hands_its_names_on_and_readers_derive_them_meanwhile(
    db: Database, clean_db: str
) -> None:
    handed: list[Callable[[], object]] = []
    _write(db, 1, "v", handed)
    _write(db, 2, "w", handed)  # every row replaced: 13 rows, more than the limit of 5
    assert len(handed) == 1 and _recorded(clean_db) == 0  # not recorded before the write returned

    during = _changes(db, "names")  # a reader before the handed-on recording runs
    assert during["terraform_data.item[3]"] == [("changed", 2, ["id", "input", "output"], 0), ("created", 1, None, 0)]
    # input is sensitive: counted, never named
    assert during["terraform_data.db"] == [("changed", 2, ["output"], 1), ("created", 1, None, 0)]

    handed.pop()()
    assert _recorded(clean_db) == COUNT + 1
    assert _changes(db, "names") == during  # recorded or derived, a reader sees the same names


def test_a_handed_on_recording_still_finds_rows_a_later_write_has_replaced(db: Database, clean_db: str) -> None:
    handed: list[Callable[[], object]] = []
    _write(db, 1, "v", handed)
    _write(db, 2, "w", handed)
    _write(db, 3, "x", handed)  # closes every row serial 2 opened before serial 2's names are recorded
    first, second = handed
    second()
    first()
    assert _recorded(clean_db) == 2 * (COUNT + 1)
    assert _changes(db, "names")["terraform_data.item[0]"] == [
        ("changed", 3, ["id", "input", "output"], 0), ("changed", 2, ["id", "input", "output"], 0),
        ("created", 1, None, 0)]


def test_a_write_that_replaced_few_rows_records_their_names_before_it_returns(db: Database, clean_db: str) -> None:
    handed: list[Callable[[], object]] = []
    _write(db, 1, "v", handed, limit=100)
    _write(db, 2, "w", handed, limit=100)
    assert handed == [] and _recorded(clean_db) == COUNT + 1
    assert _changes(db, "names")["terraform_data.item[0]"][0] == ("changed", 2, ["id", "input", "output"], 0)


def test_without_a_later_the_store_records_every_write_s_names_itself(db: Database, clean_db: str) -> None:
    states.write_state(db, WHO, "own", _body(1, "v"), lock_id=None, names_inline_max=1)
    states.write_state(db, WHO, "own", _body(2, "w"), lock_id=None, names_inline_max=1)
    assert _recorded(clean_db) == COUNT + 1


def test_a_write_that_replaced_nothing_records_and_hands_on_nothing(db: Database, clean_db: str) -> None:
    handed: list[Callable[[], object]] = []
    _write(db, 1, "v", handed, limit=1)
    assert handed == [] and _recorded(clean_db) == 0


def test_work_handed_on_later_runs_on_the_upkeep_thread_after_the_refresh_asked_for_before_it(
    db: Database,
) -> None:
    upkeep = Upkeep(db)
    seen: list[tuple[str, int]] = []
    try:
        with db.transaction() as conn:
            conn.execute("LOCK TABLE resources IN SHARE UPDATE EXCLUSIVE MODE")  # ANALYZE waits for this
            upkeep.request()
            upkeep.later(lambda: seen.append(("later", upkeep.done)))
            wait_for(lambda: upkeep.running, "the refresh to start")
            assert seen == [] and upkeep.pending == 2  # the running refresh and the work behind it
        assert upkeep.join(timeout=300)
        assert seen == [("later", 1)] and upkeep.pending == 0
        upkeep.later(lambda: seen.append(("idle", upkeep.done)))  # nothing pending: still on the thread
        assert upkeep.join(timeout=60)
        assert seen[-1] == ("idle", 1)
    finally:
        upkeep.stop()


def test_metrics_count_the_upkeep_queued_or_running(app: Flask, client: FlaskClient, db: Database) -> None:
    upkeep = app.extensions["kilolock"].upkeep
    assert upkeep is not None
    idle = 'kilolock_background_pending{queue="upkeep"} 0.0'
    assert idle in client.get("/metrics").get_data(as_text=True)
    with db.transaction() as conn:
        conn.execute("LOCK TABLE resources IN SHARE UPDATE EXCLUSIVE MODE")  # ANALYZE waits for this
        upkeep.request()
        upkeep.later(lambda: None)
        wait_for(lambda: upkeep.running, "the refresh to start")
        busy = client.get("/metrics").get_data(as_text=True)
        assert 'kilolock_background_pending{queue="upkeep"} 2.0' in busy, busy
    assert upkeep.join(timeout=300)
    assert idle in client.get("/metrics").get_data(as_text=True)
