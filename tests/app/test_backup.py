"""kl backup / kl restore: a populated embedded Postgres (the wheel's, a newer major version) moved into the
suite's Postgres with every table's count and content equal, states served byte for byte, tokens still
valid and sequences past the restored ids; a damaged archive or a non-empty target restores nothing."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from app.config import Settings
from app.store import Database, bot, tenancy
from app.store.migrate import migrate
from runner.cli import main
from tests.helpers import counted_state, lock_info

FIXTURES = Path("/work/shared/fixtures/tf-example")
TABLES = ("SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
          "WHERE n.nspname = 'public' AND c.relkind = 'r' AND relname <> 'schema_migrations' ORDER BY relname")


def counts(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        names = [r[0] for r in conn.execute(TABLES).fetchall()]
        return {n: conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(n))).fetchone()[0]
                for n in names}


def server_version(url: str) -> int:
    with psycopg.connect(url) as conn:
        return int(conn.execute("SHOW server_version_num").fetchone()[0]) // 10000


@pytest.fixture
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    from app.embedded import start_embedded_postgres, stop_embedded_postgres

    where = tmp_path_factory.mktemp("backup-src")
    url = start_embedded_postgres(where)
    migrate(url)
    yield url, where
    stop_embedded_postgres(where)


@pytest.fixture
def empty_database(database_url: str) -> Iterator[str]:
    """A new database on the suite's server, not migrated: restore migrates it itself."""
    name = f"kl_restore_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield psycopg.conninfo.make_conninfo(database_url, dbname=name)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def app_on(url: str):  # type: ignore[no-untyped-def]
    from app.web import create_app

    return create_app(Settings(database_url=url, auto_migrate=False, log_level="WARNING"))


def populate(url: str) -> str:
    """Every kind of row a running service makes; returns a token secret."""
    db = Database(url, pool_size=2)
    try:
        tenancy.create_tenant(db, "acme", "Acme ☃", actor="cli:test")
        secret, _ = tenancy.create_token(db, "acme", name="ci", environment="prod", workspace="default",
                                         actor="cli:test")
        tenancy.create_token(db, "acme", name="old", environment="stage", workspace="web", actor="cli:test")
        bot.record_delivery(db, "delivery-1", "pull_request", "opened", "org/repo")
    finally:
        db.close()
    app = app_on(url)
    client = app.test_client()
    try:
        for serial, path in enumerate(("state1.tfstate", "state2.tfstate"), 1):
            assert client.post("/v1/states/real", data=(FIXTURES / path).read_bytes()).status_code == 200, serial
        assert client.post("/v1/states/shared", data=counted_state(1, 4, value="ünïcødé ✓")).status_code == 200
        assert client.post("/v1/states/shared", data=counted_state(2, 4, value="ünïcødé ✓", changed=2)).status_code \
            == 200
        assert client.open("/v1/states/shared", method="LOCK", data=lock_info("L1")).status_code == 200
        assert client.open("/v1/states/shared", method="UNLOCK", data=lock_info("L1")).status_code == 200
        run = client.post("/v1/engine/states/shared/runs", json={
            "actor": "alice", "reservations": [{"glob": "terraform_data.item[0]", "mode": "write"}]})
        assert run.status_code == 201, run.get_json()
        other = client.post("/v1/engine/states/shared/runs", json={
            "actor": "bob", "reservations": [{"glob": "terraform_data.item[3]", "mode": "write"}]}).get_json()["run"]
        assert client.post(f"/v1/engine/runs/{other['id']}/abort", json={"reason": "test"}).status_code == 200
        drift = client.post("/v1/engine/states/shared/drift", json={
            "globs": ["*"], "checked": 4, "drifted": [{"address": "terraform_data.item[1]",
                                                      "attributes": ["input"], "gone": False}]})
        assert drift.status_code in (200, 201), drift.get_json()
    finally:
        app.extensions["kilolock"].db.close()
    return secret


def test_a_populated_embedded_database_moves_to_another_postgres_with_every_count_and_byte_equal(
        embedded, empty_database, tmp_path, monkeypatch, capsys):
    embedded_url, where = embedded
    secret = populate(embedded_url)
    before = counts(embedded_url)
    for table in ("tenants", "workspaces", "environments", "api_tokens", "states", "state_versions", "resources",
                  "outputs", "events", "apply_runs", "resource_reservations", "drift_reports", "webhook_deliveries"):
        assert before[table] > 0, f"the fixture should put rows in {table}"
    archive = tmp_path / "kilolock.backup"

    monkeypatch.setenv("KL_DATABASE_URL", embedded_url)
    assert main(["backup", str(archive)]) == 0
    said = capsys.readouterr()
    assert f"{sum(before.values()):,} rows" in said.out
    assert f"backup: states: {before['states']:,} rows" in said.err  # progress, one line per table off a terminal

    monkeypatch.setenv("KL_DATABASE_URL", empty_database)
    assert main(["restore", str(archive)]) == 0
    said = capsys.readouterr()
    assert "verified against the backup" in said.out
    assert f"restore: resources: {before['resources']:,} of {before['resources']:,} rows" in said.err
    assert counts(empty_database) == before
    assert server_version(embedded_url) == 18  # the wheel's Postgres; the suite's is the machine's (15 here)

    source, target = app_on(embedded_url), app_on(empty_database)
    try:
        for name in ("real", "shared"):
            want = source.test_client().get(f"/v1/states/{name}")
            got = target.test_client().get(f"/v1/states/{name}")
            assert want.status_code == got.status_code == 200
            assert got.get_data() == want.get_data()
        # The sequences continue after the restored ids: new rows of every kind land without a clash.
        client = target.test_client()
        assert client.post("/v1/states/fresh", data=counted_state(1, 2)).status_code == 200
        assert client.post("/v1/engine/states/fresh/runs", json={
            "actor": "carol", "reservations": [{"glob": "*", "mode": "write"}]}).status_code == 201
    finally:
        source.extensions["kilolock"].db.close()
        target.extensions["kilolock"].db.close()
    db = Database(empty_database, pool_size=1)
    try:
        assert tenancy.authenticate(db, secret) is not None  # the hash moved, so the secret still works
    finally:
        db.close()

    # kl embedded info names a URL that reaches the same database with the wheel's own psql.
    monkeypatch.setenv("KL_DATA_DIR", str(where))
    assert main(["embedded", "info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["running"] and info["version"] == "18"
    psql = subprocess.run([str(Path(info["bin_dir"]) / "psql"), info["url"], "-Atc", "SELECT count(*) FROM states"],
                          capture_output=True, text=True, timeout=60, check=True)
    assert int(psql.stdout) == before["states"]

    # A second restore would discard the target's own rows: refused, and nothing changes.
    now = counts(empty_database)
    monkeypatch.setenv("KL_DATABASE_URL", empty_database)
    assert main(["restore", str(archive), "--quiet"]) == 3
    assert "already holds data" in capsys.readouterr().err
    assert counts(empty_database) == now
    assert main(["restore", str(archive), "--replace", "--quiet", "--json"]) == 0
    assert counts(empty_database) == before


def _damage(archive: Path, out: Path, member: str) -> None:
    """Copy the archive with one byte of ``member``'s uncompressed data changed (a valid gzip still)."""
    import gzip

    with tarfile.open(archive) as src, tarfile.open(out, "w") as dst:
        for info in src.getmembers():
            data = src.extractfile(info).read()  # type: ignore[union-attr]
            if info.name == member:
                raw = bytearray(gzip.decompress(data))
                raw[raw.index(b"\t") - 1] ^= 0x01
                data = gzip.compress(bytes(raw))
                info.size = len(data)
            dst.addfile(info, io.BytesIO(data))


def test_a_damaged_archive_restores_nothing_and_says_which_table(db, tmp_path, empty_database, monkeypatch, capsys):
    from app.web import create_app

    app = create_app(Settings(database_url=db.url, auto_migrate=False, log_level="WARNING"))
    try:
        assert app.test_client().post("/v1/states/prod", data=counted_state(1, 3)).status_code == 200
    finally:
        app.extensions["kilolock"].db.close()
    archive, damaged = tmp_path / "good.backup", tmp_path / "bad.backup"
    monkeypatch.setenv("KL_DATABASE_URL", db.url)
    assert main(["backup", str(archive), "--quiet"]) == 0
    _damage(archive, damaged, "tables/resources.copy.gz")

    monkeypatch.setenv("KL_DATABASE_URL", empty_database)
    assert main(["restore", str(damaged), "--quiet"]) == 3
    err = capsys.readouterr().err
    assert "resources does not match its manifest" in err
    assert counts(empty_database)["states"] == 0  # the whole restore rolled back
    (tmp_path / "not.backup").write_bytes(b"hello")
    assert main(["restore", str(tmp_path / "not.backup"), "--quiet"]) == 3
    assert "not a kl backup" in capsys.readouterr().err
    assert main(["restore", str(archive), "--quiet"]) == 0
    assert counts(empty_database)["resources"] == 3
