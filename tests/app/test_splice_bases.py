"""Splice bases: a version Terraform wrote, assembled from its rows in the background, is a splice base.

Over Postgres and the real app: a large POST (the threshold set low) gets a base built by the app's own
background thread; the base is byte for byte that serial's assembly from rows; the first read after later
commits is spliced from it and equals the assembly from all rows; a build that fails, a base whose bytes
are not what they should be and a base built for a superseded version leave every read correct; pruning
and a newer base remove it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from app.config import Settings
from app.store import assembly, splicebase
from app.store.db import Database
from app.store.prune import RetentionPolicy, prune
from app.web import create_app, splicebases
from tests.app.test_incremental_assembly import STATE, _changed, _from_rows, _read, _version
from tests.random_states import RandomStates


@pytest.fixture
def based(settings: Settings) -> Any:
    """An app that builds a splice base after every POST."""
    application = create_app(replace(settings, splice_base_bytes=1))
    yield application
    builder = application.extensions["kilolock"].splice_bases
    builder.stop()
    application.extensions["kilolock"].db.close()


def _base(url: str, serial: int) -> tuple[bytes, str, int] | None:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT b.raw, b.sha256, b.size_bytes FROM state_version_bases b "
            "JOIN state_versions v ON v.id = b.version_id WHERE v.serial = %s",
            (serial,),
        ).fetchone()
    return None if row is None else (bytes(row[0]), row[1], row[2])


def _post(application: Any, walk: RandomStates) -> None:
    client = application.test_client()
    assert client.post(STATE, data=json.dumps(walk.doc())).status_code == 200
    application.extensions["kilolock"].splice_bases.join()


@pytest.mark.parametrize("seed", [3, 5])
def test_a_posted_version_gets_a_base_the_next_reads_splice_from(
    based: Any, db: Database, clean_db: str, seed: int
) -> None:
    walk = RandomStates(seed, provider_changes=False)
    _post(based, walk)
    base = _base(clean_db, 1)
    assert base is not None
    expected = _from_rows(db, clean_db, 1)
    assert base[0] == expected and base[1:] == (hashlib.sha256(expected).hexdigest(), len(expected))
    client = based.test_client()
    serial, addresses = 1, walk.addresses()
    for _ in range(3):  # several commits on top of the POSTed version, then the first read
        serial, addresses = _changed(client, walk, addresses, serial)
    got = _read(db, clean_db, serial)
    assert got.spliced and got.raw == _from_rows(db, clean_db, serial)
    # The backend lane's GET after one more commit: spliced from the version just cached, same bytes.
    serial, addresses = _changed(client, walk, addresses, serial)
    assert client.get(STATE).data == _from_rows(db, clean_db, serial)
    # Terraform writes again: the new version's base replaces the old one.
    walk.step()
    walk.serial = serial + 1
    _post(based, walk)
    assert _base(clean_db, 1) is None and _base(clean_db, serial + 1) is not None


def test_a_failed_or_skipped_build_leaves_reads_assembled_from_rows(client: Any, db: Database, clean_db: str) -> None:
    walk = RandomStates(4, provider_changes=False)
    assert client.post(STATE, data=json.dumps(walk.doc())).status_code == 200  # default threshold: no base
    assert _base(clean_db, 1) is None
    version_id = _version(clean_db, 1)[0]
    broken = Database("postgresql://127.0.0.1:1/nowhere", pool_size=1)
    try:
        assert not splicebases.build(broken, version_id)  # the failure is logged, not raised
    finally:
        broken.close()
    with psycopg.connect(clean_db) as other:  # another process holds the version's build
        other.execute("SELECT pg_advisory_xact_lock(%s, %s)", (splicebase._LOCK_CLASS, version_id))
        assert not splicebase.build(db, version_id)
    assert _base(clean_db, 1) is None
    serial, addresses = _changed(client, walk, walk.addresses(), 1)
    got = _read(db, clean_db, serial)
    assert not got.spliced and got.raw == _from_rows(db, clean_db, serial)
    # A build for a version a later cached assembly already serves stores nothing.
    assert not splicebase.build(db, version_id)


def test_a_base_whose_bytes_are_wrong_is_not_spliced_from(client: Any, db: Database, clean_db: str) -> None:
    walk = RandomStates(6, provider_changes=False)
    assert client.post(STATE, data=json.dumps(walk.doc())).status_code == 200
    assert splicebase.build(db, _version(clean_db, 1)[0])
    serial, addresses = _changed(client, walk, walk.addresses(), 1)
    with psycopg.connect(clean_db, autocommit=True) as conn:  # the bytes are cut short of their recorded size
        conn.execute("UPDATE state_version_bases SET raw = substring(raw FROM 1 FOR 100)")
    got = _read(db, clean_db, serial)
    assert not got.spliced and got.raw == _from_rows(db, clean_db, serial)
    serial, _ = _changed(client, walk, addresses, serial)
    with psycopg.connect(clean_db, autocommit=True) as conn:  # text not where the layout puts it
        for later in range(2, serial + 1):  # no apply version's cached bytes to splice from instead
            assert assembly.forget_assembly(conn, _version(clean_db, later)[0])
        conn.execute("UPDATE state_version_bases SET raw = convert_to(repeat('x', size_bytes::int), 'UTF8')")
    got = _read(db, clean_db, serial)
    assert not got.spliced and got.raw == _from_rows(db, clean_db, serial)


def test_pruning_removes_the_base_with_its_version_bytes(client: Any, db: Database, clean_db: str) -> None:
    walk = RandomStates(8, provider_changes=False)
    assert client.post(STATE, data=json.dumps(walk.doc())).status_code == 200
    assert splicebase.build(db, _version(clean_db, 1)[0])
    serial, addresses = 1, walk.addresses()
    for _ in range(3):
        serial, addresses = _changed(client, walk, addresses, serial)
    _read(db, clean_db, serial)
    assert _base(clean_db, 1) is not None
    prune(db, RetentionPolicy(keep_versions=1))
    assert _base(clean_db, 1) is None
    serial, _ = _changed(client, walk, addresses, serial)
    got = _read(db, clean_db, serial)
    assert got.spliced and got.raw == _from_rows(db, clean_db, serial)  # from the head's cached bytes


def test_a_first_read_waits_for_a_base_being_built_and_splices_from_it(
    client: Any, db: Database, clean_db: str
) -> None:
    import hashlib as _h
    import threading

    from app.store import assembly

    walk = RandomStates(9, provider_changes=False)
    assert client.post(STATE, data=json.dumps(walk.doc())).status_code == 200
    posted_id = _version(clean_db, 1)[0]
    base_bytes = _from_rows(db, clean_db, 1)
    serial, _ = _changed(client, walk, walk.addresses(), 1)
    got: list[assembly.Materialised] = []
    with psycopg.connect(clean_db) as builder:  # holds the build's lock, as a build under way does
        builder.execute("SELECT pg_advisory_xact_lock(%s, %s)", (splicebase._LOCK_CLASS, posted_id))
        reader = threading.Thread(target=lambda: got.append(_read(db, clean_db, serial)))
        reader.start()
        with psycopg.connect(clean_db, autocommit=True) as watch:
            while watch.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE '%%pg_advisory_lock_shared%%'"
            ).fetchone() != (1,):
                assert reader.is_alive()
        state_id = _version(clean_db, 1)[1]
        builder.execute(
            "INSERT INTO state_version_bases (version_id, state_id, raw, size_bytes, sha256, "
            "assembly_format) VALUES (%s, %s, %s, %s, %s, %s)",
            (
                posted_id,
                state_id,
                base_bytes,
                len(base_bytes),
                _h.sha256(base_bytes).hexdigest(),
                assembly.ASSEMBLY_FORMAT,
            ),
        )
    reader.join()
    assert got and got[0].spliced and got[0].raw == _from_rows(db, clean_db, serial)
