"""The assembly spliced from an earlier version's cached bytes is byte for byte the assembly from all rows.

Seeded random walks of commits through the engine lane (creates, updates, deletes of whole resources and
of single count/for_each instances, deposed objects, modules, resources sorting between others, outputs
of every shape) over Postgres; after each commit, or after several, the version is read and compared with
the assembly from all its rows. Terraform's POSTs in between, pruned bases and bases of another layout
are never spliced from.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import psycopg
import pytest

from app.store import assembly
from app.store.db import Database
from app.store.prune import RetentionPolicy, prune
from tests.random_states import RandomStates

STATE = "/v1/states/walk"


def _commit(client: Any, walk: RandomStates, before: set[str], head: int) -> int:
    """Commit the walk's state over the head through a run that reserves everything; the new head."""
    run = client.post("/v1/engine/states/walk/runs", json={
        "actor": "walker", "base_serial": head,
        "reservations": [{"glob": "*", "mode": "write"}, {"glob": "output.*", "mode": "write"}]})
    assert run.status_code == 201, run.json
    done = client.post(f"/v1/engine/runs/{run.json['run']['id']}/commit", json={
        "holder": "walker", "state": walk.doc(), "slice_addresses": sorted(before | walk.addresses())})
    assert done.status_code == 200, done.json
    serial = done.json["commit"]["serial"]
    return head if serial is None else int(serial)  # None: nothing changed


def _changed(client: Any, walk: RandomStates, addresses: set[str], head: int) -> tuple[int, set[str]]:
    """Random steps committed until one changes the state: the new head and its addresses."""
    serial = head
    while serial == head:
        walk.step()
        serial = _commit(client, walk, addresses, head)
        addresses = walk.addresses()
    return serial, addresses


def _version(url: str, serial: int) -> tuple[int, int, str, str, int]:
    with psycopg.connect(url) as conn:
        found = conn.execute("SELECT v.id, v.state_id, v.lineage, v.terraform_version, v.serial FROM state_versions v "
                             "JOIN states s ON s.id = v.state_id WHERE s.name = 'walk' AND v.serial = %s",
                             (serial,)).fetchone()
    assert found is not None
    return found


def _from_rows(db: Database, url: str, serial: int) -> bytes:
    version_id, state_id, lineage, terraform_version, _ = _version(url, serial)
    with db.transaction() as conn:
        outputs = assembly.resources.outputs_of(conn, version_id=version_id)
        return b"".join(assembly.from_rows(conn, state_id, serial, lineage, terraform_version, outputs))


def _read(db: Database, url: str, serial: int) -> assembly.Materialised:
    """The version's first read, and that its cached bytes and digest are what the reader got."""
    version_id = _version(url, serial)[0]
    got = assembly.materialise(db, version_id)
    assert got is not None
    with psycopg.connect(url) as conn:
        cached = conn.execute("SELECT raw_state, sha256, size_bytes FROM state_versions WHERE id = %s",
                              (version_id,)).fetchone()
    assert cached is not None and bytes(cached[0]) == got.raw
    assert cached[1:] == (hashlib.sha256(got.raw).hexdigest(), len(got.raw))
    return got


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_spliced_versions_are_the_assembly_from_all_rows(client: Any, db: Database, clean_db: str, seed: int) -> None:
    walk = RandomStates(seed)
    assert client.post(STATE, data=json.dumps(walk.doc())).status_code == 200
    addresses = walk.addresses()
    spliced = 0
    serial = 1
    for step in range(14):
        for _ in range(1 + (step % 3 == 2) * 2):  # now and then several commits before a read
            serial, addresses = _changed(client, walk, addresses, serial)
        if step == 6:
            # Terraform writes a version of its own: its bytes are Terraform's, never a base.
            walk.step()
            walk.serial = serial = serial + 1
            assert client.post(STATE, data=json.dumps(walk.doc())).status_code == 200
            serial, addresses = _changed(client, walk, walk.addresses(), serial)
        expected = _from_rows(db, clean_db, serial)
        got = _read(db, clean_db, serial)
        assert got.assembled and got.cached
        assert got.raw == expected, (seed, step)
        spliced += got.spliced
        if step == 9:
            assert client.get(STATE).data == expected  # the backend lane serves the cached bytes
    assert spliced >= 7, spliced


def test_pruned_bases_and_bases_of_another_layout_are_not_spliced_from(client: Any, db: Database,
                                                                        clean_db: str) -> None:
    walk = RandomStates(7, provider_changes=False)  # a changed provider is never spliced either
    assert client.post(STATE, data=json.dumps(walk.doc())).status_code == 200
    addresses = walk.addresses()
    serials = [1]
    while len(serials) < 5:
        serial, addresses = _changed(client, walk, addresses, serials[-1])
        serials.append(serial)
    serials = serials[1:]
    first, second, third, fourth = serials
    assert not _read(db, clean_db, first).spliced  # only Terraform's bytes before it
    assert _read(db, clean_db, second).spliced
    # Retention removes the bytes of all but the newest two versions: the third's bases are gone, so
    # it is assembled from all rows.
    prune(db, RetentionPolicy(keep_versions=2))
    with psycopg.connect(clean_db) as conn:
        kept = conn.execute("SELECT serial FROM state_versions WHERE raw_state IS NOT NULL ORDER BY serial").fetchall()
    assert (first,) not in kept and (second,) not in kept
    third_read = _read(db, clean_db, third)
    assert not third_read.spliced and third_read.raw == _from_rows(db, clean_db, third)
    # Bytes cached under another layout are not a base either.
    with psycopg.connect(clean_db, autocommit=True) as conn:
        conn.execute("UPDATE state_versions SET assembly_format = 0 WHERE serial = %s", (third,))
    fourth_read = _read(db, clean_db, fourth)
    assert not fourth_read.spliced and fourth_read.raw == _from_rows(db, clean_db, fourth)
    fifth, addresses = _changed(client, walk, addresses, fourth)
    fifth_read = _read(db, clean_db, fifth)
    assert fifth_read.spliced and fifth_read.raw == _from_rows(db, clean_db, fifth)


def test_a_base_pruned_while_the_splice_is_written_leaves_the_version_uncached(client: Any, db: Database,
                                                                              clean_db: str) -> None:
    walk = RandomStates(11, provider_changes=False)
    assert client.post(STATE, data=json.dumps(walk.doc())).status_code == 200
    base, addresses = _changed(client, walk, walk.addresses(), 1)
    _read(db, clean_db, base)
    serial, _ = _changed(client, walk, addresses, base)
    version_id = _version(clean_db, serial)[0]
    found = assembly.Found()
    with db.transaction() as conn:
        pieces = assembly.pieces_in(conn, version_id, found)
        first = next(pieces)  # the splice is planned and the base read before the first piece
        assert found.spliced
        with psycopg.connect(clean_db, autocommit=True) as other:
            other.execute("UPDATE state_versions SET raw_state = NULL, pruned_at = now() WHERE serial = %s", (base,))
        raw = first + b"".join(pieces)
    assert raw == _from_rows(db, clean_db, serial) and not found.cached
    with psycopg.connect(clean_db) as conn:
        assert conn.execute("SELECT raw_state IS NULL FROM state_versions WHERE id = %s", (version_id,)).fetchone() == (
            True,)


def test_a_forgotten_assembly_is_assembled_again_and_a_posted_version_keeps_its_bytes(
    client: Any, db: Database, clean_db: str
) -> None:
    walk = RandomStates(4, provider_changes=False)
    assert client.post(STATE, data=json.dumps(walk.doc())).status_code == 200
    serial, _ = _changed(client, walk, walk.addresses(), 1)
    first = _read(db, clean_db, serial)
    version_id = _version(clean_db, serial)[0]
    with psycopg.connect(clean_db, autocommit=True) as conn:
        assert assembly.forget_assembly(conn, version_id)
        columns = "raw_state, sha256, size_bytes, assembled_at, assembly_format"
        assert conn.execute(f"SELECT {columns} FROM state_versions WHERE id = %s",
                            (version_id,)).fetchone() == (None,) * 5
        posted = _version(clean_db, 1)[0]
        kept = conn.execute("SELECT raw_state FROM state_versions WHERE id = %s", (posted,)).fetchone()
        assert not assembly.forget_assembly(conn, posted)
        assert conn.execute("SELECT raw_state FROM state_versions WHERE id = %s", (posted,)).fetchone() == kept
    again = _read(db, clean_db, serial)
    assert first.assembled and again.assembled  # assembled again, to the same bytes
    assert again.raw == first.raw == _from_rows(db, clean_db, serial)
