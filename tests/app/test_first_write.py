"""The first whole-state write of a state: its rows COPYed while the body is parsed, before the row lock.

``states.write_state`` tries a state's first write optimistically (its rows and its version stored before the
state's row lock) and falls back to the usual write when anything it assumed moved. These tests drive that on
real Postgres: the rows it stores are the parser's, and a write that races another writer, meets a Terraform
lock or a reservation taken meanwhile, or collides with another writer's rows or version ends exactly as the
usual write ends it (the same error, or the same rows), with no row of the attempt left behind, not even the
state's own. The concurrent change runs in the window the optimistic write leaves open: after it has read the
state and before its rows' COPY ends (``parse_state_watched``, wrapped so the change runs first).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from analyzer.state import EncryptedState, ParsedState, parse_state
from app.domain.locking import UnlockRequest
from app.domain.principal import default_principal
from app.errors import SerialConflictError, StateLockedError
from app.store import Database, resources, states
from app.store.opencache import OPEN_SETS, HeadKey
from tests.helpers import counted_state, lock_info, resource, state
from tests.helpers import instance as instance_of

WHO = default_principal("first-write-test")
_LIVE = """
SELECT r.address, r.deposed, r.attributes_hash, r.instance::text, r.dependencies, r.status, r.create_serial
FROM resources r JOIN states s ON s.id = r.state_id
WHERE s.name = %s AND r.delete_serial IS NULL ORDER BY r.address, r.deposed
"""
_HEAD = """
SELECT s.current_serial, v.raw_state FROM states s LEFT JOIN state_versions v ON v.id = s.head_version_id
WHERE s.name = %s
"""


def _rows(url: str, name: str) -> list[tuple[object, ...]]:
    """The state's live rows, each instance as the value its jsonb holds."""
    with psycopg.connect(url) as conn:
        found = conn.execute(_LIVE, (name,)).fetchall()
    return [(a, d, h, json.loads(i), list(deps), st, serial) for a, d, h, i, deps, st, serial in found]


def _expected(body: bytes) -> list[tuple[object, ...]]:
    """The live rows the usual write leaves for ``body`` as a state's only version: the parser's rows."""
    parsed = parse_state(body)
    assert isinstance(parsed, ParsedState)
    return sorted((r.address, r.deposed, r.attributes_hash, json.loads(r.instance_json), list(r.dependencies),
                   r.status, parsed.serial) for r in parsed.instances)


def _count(url: str, query: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0])


def _head(url: str, name: str) -> tuple[object, bytes | None] | None:
    """The state's serial and head bytes; None when the state does not exist."""
    with psycopg.connect(url) as conn:
        row = conn.execute(_HEAD, (name,)).fetchone()
    return None if row is None else (row[0], None if row[1] is None else bytes(row[1]))


def _meanwhile(monkeypatch: pytest.MonkeyPatch, change: Callable[[], object]) -> list[int]:
    """Run ``change`` (on its own connections, to its end) once the optimistic write has read the state and
    before its rows are stored; the list counts the watched parses (the change's own write is the second)."""
    real = states.parse_state_watched
    parses: list[int] = []

    def watched(body: bytes, watch: Callable[..., object]) -> ParsedState | None:
        parses.append(1)
        if len(parses) == 1:
            change()
        return real(body, watch)  # type: ignore[arg-type]

    monkeypatch.setattr(states, "parse_state_watched", watched)
    return parses


def _parse_body_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the usual write's parses (``states.parse_body``), which the optimistic write does not make."""
    real = states.parse_body
    calls: list[int] = []

    def counted(body: bytes | bytearray, **kwargs: Any) -> ParsedState | EncryptedState:
        calls.append(1)
        return real(body, **kwargs)

    monkeypatch.setattr(states, "parse_body", counted)
    return calls


def test_a_first_post_stores_the_parsers_rows_without_the_usual_parse(
        db: Database, clean_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _parse_body_calls(monkeypatch)
    body = counted_state(3, 40)
    result = states.write_state(db, WHO, "s", body, lock_id=None)
    assert calls == []  # stored by the watched parse, its rows COPYed as they were read
    assert (result.serial, result.opened, result.closed, result.replay) == (3, 40, 0, False)
    assert _rows(clean_db, "s") == _expected(body)
    assert _head(clean_db, "s") == (3, body)
    assert _count(clean_db, "SELECT count(*) FROM events WHERE kind = 'state_write'") == 1
    # The next write is the usual one, and sees the first's rows as its head's.
    changed = counted_state(4, 40, changed=7)
    result = states.write_state(db, WHO, "s", changed, lock_id=None)
    assert (result.opened, result.closed) == (1, 1)
    assert calls == [1]
    assert [row[:6] for row in _rows(clean_db, "s")] == [row[:6] for row in _expected(changed)]


def test_a_first_post_under_terraforms_lock_takes_the_optimistic_way(
        db: Database, clean_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    states.lock(db, WHO, "s", lock_info("tf-1"))  # Terraform locks before its first push
    calls = _parse_body_calls(monkeypatch)
    body = counted_state(1, 12)
    states.write_state(db, WHO, "s", body, lock_id="tf-1")
    assert calls == []
    assert _rows(clean_db, "s") == _expected(body)


@pytest.mark.parametrize("existed, same_addresses, parses_again", [
    (True, True, False), (True, False, False), (False, False, True),
], ids=["rows and versions collide", "versions collide", "state created meanwhile"])
def test_a_first_post_racing_another_first_post_of_the_same_serial_is_a_409_and_leaves_the_winners_rows(
        db: Database, clean_db: str, monkeypatch: pytest.MonkeyPatch, existed: bool, same_addresses: bool,
        parses_again: bool) -> None:
    if existed:
        states.lock(db, WHO, "s", lock_info("tf-0"))
        states.unlock(db, WHO, "s", UnlockRequest(lock_id="tf-0", force=False))  # a state with no head yet
    winner = counted_state(1, 10, name="item" if same_addresses else "other", value="winner")
    _meanwhile(monkeypatch, lambda: states.write_state(db, WHO, "s", winner, lock_id=None))
    calls = _parse_body_calls(monkeypatch)
    with pytest.raises(SerialConflictError):
        states.write_state(db, WHO, "s", counted_state(1, 10, value="loser"), lock_id=None)
    # The version, stored before the rows, collides first: the parse goes on without storing rows, and the
    # usual way reuses it. A state found written when the version would be stored stops the parse: the usual
    # way parses again.
    assert calls == ([1] if parses_again else [])
    assert _rows(clean_db, "s") == _expected(winner)
    assert _head(clean_db, "s") == (1, winner)
    assert _count(clean_db, "SELECT count(*) FROM state_versions") == 1
    assert _count(clean_db, "SELECT count(*) FROM states") == 1


@pytest.mark.parametrize("same_addresses", [True, False], ids=["rows collide", "other rows"])
def test_a_first_post_whose_head_moved_meanwhile_is_written_the_usual_way(
        db: Database, clean_db: str, monkeypatch: pytest.MonkeyPatch, same_addresses: bool) -> None:
    states.lock(db, WHO, "s", lock_info("tf-0"))
    states.unlock(db, WHO, "s", UnlockRequest(lock_id="tf-0", force=False))  # a state with no head yet
    earlier = counted_state(1, 10, name="item" if same_addresses else "other", value="earlier")
    parses = _meanwhile(monkeypatch, lambda: states.write_state(db, WHO, "s", earlier, lock_id=None))
    calls = _parse_body_calls(monkeypatch)
    body = counted_state(2, 10)
    result = states.write_state(db, WHO, "s", body, lock_id=None)
    assert parses == [1, 1]  # this write's optimistic attempt, and the earlier write's own
    # Colliding rows fail the COPY inside the parse, which the usual way then repeats; otherwise it reuses it.
    assert calls == ([1] if same_addresses else [])
    assert (result.serial, result.opened, result.closed) == (2, 10, 10)
    assert _rows(clean_db, "s") == _expected(body)
    assert _head(clean_db, "s") == (2, body)
    assert _count(clean_db, "SELECT count(*) FROM state_versions") == 2


def test_a_terraform_lock_taken_meanwhile_refuses_the_first_post_and_leaves_no_row(
        db: Database, clean_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _meanwhile(monkeypatch, lambda: states.lock(db, WHO, "s", lock_info("tf-1")))
    with pytest.raises(StateLockedError):
        states.write_state(db, WHO, "s", counted_state(1, 10), lock_id=None)
    assert _head(clean_db, "s") == (None, None)  # the lock's state, nothing of the write
    assert _count(clean_db, "SELECT count(*) FROM resources") == 0
    assert _count(clean_db, "SELECT count(*) FROM state_versions") == 0
    assert _count(clean_db, "SELECT count(*) FROM events WHERE kind = 'state_write'") == 0


def test_a_rejected_first_post_creates_no_state(db: Database, clean_db: str) -> None:
    with pytest.raises(StateLockedError):  # a lock ID for a state nobody locked
        states.write_state(db, WHO, "new", counted_state(1, 10), lock_id="stale")
    assert _head(clean_db, "new") is None
    assert _count(clean_db, "SELECT count(*) FROM resources") == 0
    states.lock(db, WHO, "held", lock_info("tf-1"))
    with pytest.raises(StateLockedError):  # the wrong lock ID
        states.write_state(db, WHO, "held", counted_state(1, 10), lock_id="tf-2")
    assert _head(clean_db, "held") == (None, None)
    assert _count(clean_db, "SELECT count(*) FROM resources") == 0
    assert _count(clean_db, "SELECT count(*) FROM state_versions") == 0


def test_a_first_post_that_is_not_in_terraforms_shape_is_written_the_usual_way(
        db: Database, clean_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _parse_body_calls(monkeypatch)
    doc = json.loads(counted_state(5, 6))
    # "serial" after "resources": the rows cannot be COPYed before their serial is known.
    body = json.dumps({"resources": doc.pop("resources"), **doc}).encode()
    result = states.write_state(db, WHO, "s", body, lock_id=None)
    assert calls == [] and result.opened == 6  # parsed once, by the watched parse, and stored the usual way
    assert _rows(clean_db, "s") == _expected(body)
    assert _head(clean_db, "s") == (5, body)


def test_a_first_post_found_odd_after_its_rows_were_sent_stores_none_of_them(
        db: Database, clean_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _parse_body_calls(monkeypatch)
    # A key repeated after the resources: the streaming parse declines once every row went into the COPY, and
    # the whole-document parse (the last "serial" wins) decides what is stored.
    body = counted_state(5, 6).rstrip()[:-1] + b', "serial": 6}'
    assert json.loads(body)["serial"] == 6
    result = states.write_state(db, WHO, "s", body, lock_id=None)
    assert calls == [1] and (result.serial, result.opened) == (6, 6)
    assert _rows(clean_db, "s") == _expected(body)
    assert _count(clean_db, "SELECT count(*) FROM resources") == 6
    assert _head(clean_db, "s") == (6, body)


def test_a_reservation_taken_meanwhile_refuses_the_first_post_and_leaves_no_row(
        client: Any, clean_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def reserve() -> None:
        opened = client.post("/v1/engine/states/s/runs", json={
            "actor": "alice", "reservations": [{"glob": "terraform_data.item[0]", "mode": "write"}]})
        assert opened.status_code == 201

    _meanwhile(monkeypatch, reserve)
    assert client.post("/v1/states/s", data=counted_state(1, 10)).status_code == 423
    assert _head(clean_db, "s") == (None, None)
    assert _count(clean_db, "SELECT count(*) FROM resources") == 0
    assert _count(clean_db, "SELECT count(*) FROM state_versions") == 0
    assert _count(clean_db, "SELECT count(*) FROM events WHERE kind = 'reservation_conflict'") == 1


@pytest.mark.parametrize("interleaved", [False, True], ids=["ids in a run", "another session took one"])
def test_the_first_writes_open_set_is_kept_only_when_its_ids_are_known(
        db: Database, clean_db: str, interleaved: bool) -> None:
    states.lock(db, WHO, "s", lock_info("tf-0"))
    parsed = parse_state(counted_state(1, 30))
    assert isinstance(parsed, ParsedState)
    with db.transaction() as conn:
        state_id = states.find_state(conn, WHO, "s").id
        after = resources.last_row_id(conn, advance=True)
        with resources.row_copy(conn, tenant_id=1, state_id=state_id, serial=1) as put:
            for row in parsed.instances[:10]:
                put(row)
            if interleaved:
                _count(clean_db, "SELECT nextval(pg_get_serial_sequence('resources', 'id'))")
            for row in parsed.instances[10:]:
                put(row)
        resources.remember_open_set(conn, state_id=state_id, version_id=10**9, rows=parsed.instances,
                                    after_id=after)
        stored = {(a, d): row_id for row_id, a, d in conn.execute(
            "SELECT id, address, deposed FROM resources WHERE state_id = %s", (state_id,))}
        now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        kept = OPEN_SETS.get(HeadKey(resources.database_identity(conn), state_id, 10**9, now))
        conn.rollback()
    if interleaved:
        assert kept is None
    else:
        assert kept is not None and {key: row.id for key, row in kept.items()} == stored


def test_a_first_post_stores_its_version_before_its_rows_and_each_rows_dependencies(
        db: Database, clean_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = json.loads(counted_state(2, 8))
    for position, instance in enumerate(doc["resources"][0]["instances"]):
        if position % 3 == 0:  # some rows with dependencies, most without
            instance["dependencies"] = [f"terraform_data.dep{position}", "terraform_data.other"]
    body = json.dumps(doc, indent=2).encode()
    versions_at_copy: list[int] = []
    real = resources.row_copy

    def row_copy(conn: psycopg.Connection, **kwargs: Any) -> Any:
        versions_at_copy.append(int(conn.execute("SELECT count(*) FROM state_versions").fetchone()[0]))  # type: ignore[index]
        return real(conn, **kwargs)

    monkeypatch.setattr(resources, "row_copy", row_copy)
    calls = _parse_body_calls(monkeypatch)
    result = states.write_state(db, WHO, "s", body, lock_id=None)
    assert calls == [] and versions_at_copy == [1]  # the version was stored when the rows' COPY started
    assert _rows(clean_db, "s") == _expected(body)
    assert sorted(str(row[4]) for row in _rows(clean_db, "s")) == sorted(
        [str([])] * 5 + [str([f"terraform_data.dep{p}", "terraform_data.other"]) for p in (0, 3, 6)])
    assert _head(clean_db, "s") == (2, body)
    # The body's sha256, taken beside the parse, is the version's: the same body again is a replay.
    with psycopg.connect(clean_db) as conn:
        stored = conn.execute("SELECT sha256 FROM state_versions").fetchone()
    assert stored == (hashlib.sha256(body).hexdigest(),)
    again = states.write_state(db, WHO, "s", body, lock_id=None)
    assert again.replay and again.serial == result.serial


def test_a_first_post_whose_lineage_follows_its_resources_stores_its_version_after_the_parse(
        db: Database, clean_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _parse_body_calls(monkeypatch)
    doc = json.loads(counted_state(4, 9))
    lineage, terraform_version = doc.pop("lineage"), doc.pop("terraform_version")
    body = json.dumps({**doc, "lineage": lineage, "terraform_version": terraform_version}).encode()
    result = states.write_state(db, WHO, "s", body, lock_id=None)
    assert calls == [] and (result.serial, result.opened) == (4, 9)  # still the optimistic way
    assert _rows(clean_db, "s") == _expected(body)
    assert _head(clean_db, "s") == (4, body)
    assert _count(clean_db, "SELECT count(*) FROM state_versions") == 1


def test_a_post_into_a_state_with_a_head_scans_its_body_for_unstorable_characters_once(
        db: Database, clean_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    states.write_state(db, WHO, "s", counted_state(1, 5), lock_id=None)
    real = states.may_hold_unstorable
    scans: list[int] = []

    def counted(body: bytes | bytearray) -> bool:
        scans.append(1)
        return real(body)

    monkeypatch.setattr(states, "may_hold_unstorable", counted)
    calls = _parse_body_calls(monkeypatch)
    result = states.write_state(db, WHO, "s", counted_state(2, 5, changed=3), lock_id=None)
    assert (result.opened, result.closed) == (1, 1)
    assert scans == [1] and calls == [1]  # the optimistic way found the head: the usual way, its scan reused


_KEYS = """
SELECT r.address, r.index_key::text, r.dependencies FROM resources r JOIN states s ON s.id = r.state_id
WHERE s.name = %s AND r.delete_serial IS NULL ORDER BY r.address
"""
# Count keys at the edges of what a state holds, and for_each keys JSON must escape (quotes, backslashes,
# control characters, non-ASCII and beyond the BMP).
_COUNT_KEYS = [0, 7, -3, 2**63 - 1]
_EACH_KEYS = ['plain', 'quote"back\\slash', "tab\tnew\nline\x01", "été", "\U0001f680 rocket", ""]


def _keyed_state(serial: int, value: str) -> bytes:
    return state(serial, [
        resource("counted", [instance_of(k, f"{value}-{k}", deps=["terraform_data.each"] if k == 7 else ())
                             for k in _COUNT_KEYS]),
        resource("each", [instance_of(k, f"{value}-{i}") for i, k in enumerate(_EACH_KEYS)]),
    ])


def test_every_row_write_stores_each_index_key_as_the_jsonb_of_jsons_text(db: Database, clean_db: str) -> None:
    """The rows' COPY writes a key's JSON text without json's encoder: the stored jsonb is the key's, for the
    first write (streamed rows) and for a write that replaces every row of a state with a head."""
    keys = _COUNT_KEYS + _EACH_KEYS
    assert [resources.index_key_json(k) for k in [*keys, None]] == [json.dumps(k) for k in keys] + [None]
    for serial, value in ((1, "a"), (2, "b")):  # the first write, then every row new the usual way
        states.write_state(db, WHO, "keys", _keyed_state(serial, value), lock_id=None)
        with psycopg.connect(clean_db) as conn:
            stored = conn.execute(_KEYS, ("keys",)).fetchall()
        by_key = {json.loads(text): (address, list(deps)) for address, text, deps in stored}
        assert sorted(by_key, key=json.dumps) == sorted(keys, key=json.dumps)
        assert by_key[7][1] == ["terraform_data.each"]
        assert all(deps == [] for key, (_, deps) in by_key.items() if key != 7)
        parsed = parse_state(_keyed_state(serial, value))
        assert isinstance(parsed, ParsedState)
        assert sorted((r.address, r.index_key) for r in parsed.instances) == sorted(
            (address, key) for key, (address, _) in by_key.items())
