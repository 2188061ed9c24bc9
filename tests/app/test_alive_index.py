"""The live rows of ``resources`` have one index by address (``resources_alive_uq``, under ``text_pattern_ops``),
which every row a write opens pays for once. It still keeps at most one live row per instance object, and the
store's exact and prefix lookups of live rows are index scans of it (read from the plans, not timed)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from app.domain.principal import default_principal
from app.store import Database, commit, graph, states
from app.store.migrate import migrate
from tests.helpers import instance, resource, state

WHO = default_principal("alive-index-test")
MODULES = 12
PER_MODULE = 1000  # 12,000 rows: a bulk write, so the planner has the table's statistics


def _body(serial: int) -> bytes:
    return state(serial, [resource("x", [instance(i, f"v{k}-{i}") for i in range(PER_MODULE)], module=f"module.m{k}")
                          for k in range(MODULES)])


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _plan(conn: psycopg.Connection, query: str, params: Any) -> dict[str, Any]:
    row = conn.execute(("EXPLAIN (FORMAT JSON) " + query).encode(), params).fetchone()
    assert row is not None
    return (row[0] if isinstance(row[0], list) else json.loads(row[0]))[0]["Plan"]  # type: ignore[no-any-return]


def _address_scans(plan: dict[str, Any]) -> list[tuple[str, str]]:
    """(index, index condition) of every scan of resources in ``plan``."""
    return [(n.get("Index Name", n["Node Type"]), n.get("Index Cond", "")) for n in _nodes(plan)
            if "Scan" in n["Node Type"]
            and (n.get("Relation Name") == "resources" or "resources" in n.get("Index Name", ""))]


def _live_address_indexes(conn: psycopg.Connection) -> list[tuple[str, str]]:
    return conn.execute("""
        SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
        WHERE i.indrelid = 'resources'::regclass
          AND pg_get_expr(i.indpred, i.indrelid) = '(delete_serial IS NULL)'
          AND i.indkey[0] = (SELECT attnum FROM pg_attribute WHERE attrelid = i.indrelid AND attname = 'state_id')
          AND i.indkey[1] = (SELECT attnum FROM pg_attribute WHERE attrelid = i.indrelid AND attname = 'address')
        ORDER BY 1""").fetchall()


def test_one_index_keys_the_live_rows_by_address(db: Database) -> None:
    with db.transaction() as conn:
        found = _live_address_indexes(conn)
    assert [name for name, _ in found] == ["resources_alive_uq"], found
    assert "UNIQUE" in found[0][1] and "text_pattern_ops" in found[0][1], found


def test_at_most_one_live_row_per_state_address_and_deposed(db: Database) -> None:
    body = state(1, [resource("x", [instance(0, "a")])])
    states.write_state(db, WHO, "one", body, lock_id=None)
    states.write_state(db, WHO, "other", body, lock_id=None)  # the same address live in another state
    copy = """
        INSERT INTO resources (tenant_id, state_id, address, resource_address, module, mode, type, name, index_key,
                               deposed, status, provider, instance, attributes_hash, dependencies, create_serial)
        SELECT tenant_id, state_id, address, resource_address, module, mode, type, name, index_key, %s, status,
               provider, instance, attributes_hash, dependencies, create_serial
        FROM resources WHERE address = 'terraform_data.x[0]' AND state_id = %s"""
    with pytest.raises(psycopg.errors.UniqueViolation), db.transaction() as conn:
        one = states.find_state(conn, WHO, "one").id
        conn.execute(copy, ("", one))
    with db.transaction() as conn:
        conn.execute(copy, ("0a1b2c3d", one))  # a deposed object of the same instance is another object
        conn.execute("UPDATE resources SET delete_serial = 2 WHERE state_id = %s AND deposed = ''", (one,))
        conn.execute(copy.replace("FROM resources WHERE", "FROM resources WHERE delete_serial = 2 AND"), ("", one))
        live = conn.execute("SELECT state_id = %s, deposed FROM resources WHERE delete_serial IS NULL ORDER BY 1, 2",
                            (one,)).fetchall()
    assert live == [(False, ""), (True, ""), (True, "0a1b2c3d")]  # its row closed, the instance opened a new one


def test_exact_and_prefix_lookups_of_live_rows_are_scans_of_the_one_index(db: Database) -> None:
    states.write_state(db, WHO, "large", _body(1), lock_id=None)  # statistics refreshed: a bulk write
    keys = [f"module.m3.terraform_data.x[{i}]" for i in range(20)]
    with db.transaction() as conn:
        state_id = states.find_state(conn, WHO, "large").id
        exact = _plan(conn, graph._UNDER_GLOBS, {"state": state_id, "exact": keys[:1], "prefixes": []})
        prefix = _plan(conn, graph._UNDER_GLOBS, {"state": state_id, "exact": [],
                                                  "prefixes": ["module.m3.", "module.m3["]})
        close = _plan(conn, commit._CLOSE_KEYS, (2, keys, [""] * len(keys), state_id))
        rows = graph._rows_under(conn, state_id, graph.GlobLookup((), ("module.m3.",), False))
    for plan, condition in ((exact, "address = e.address"), (prefix, "address ~>=~ p.prefix"),
                            (close, "address = k.address")):
        scans = _address_scans(plan)
        assert {index for index, _ in scans} == {"resources_alive_uq"}, plan  # never a scan of the state
        assert any(condition in cond and "state_id" in cond for _, cond in scans), plan
    assert len(rows) == PER_MODULE


@pytest.fixture
def scratch_url(database_url: str) -> Iterator[str]:
    name = f"kl_test_alive_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = psycopg.conninfo.make_conninfo(database_url, dbname=name)
    yield url
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def test_the_migration_merges_the_indexes_of_a_populated_table(scratch_url: str) -> None:
    migrate(scratch_url, upto=28)
    db = Database(scratch_url, pool_size=1)
    try:
        states.write_state(db, WHO, "before", state(1, [resource("x", [instance(i, "a") for i in range(50)])]),
                           lock_id=None)
        states.write_state(db, WHO, "before", state(2, [resource("x", [instance(i, "b") for i in range(50)])]),
                           lock_id=None)
        with db.transaction() as conn:
            assert len(_live_address_indexes(conn)) == 2
        assert [m.version for m in migrate(scratch_url, upto=29)] == [29]
        with db.transaction() as conn:
            assert [name for name, _ in _live_address_indexes(conn)] == ["resources_alive_uq"]
            counts = conn.execute("SELECT count(*), count(*) FILTER (WHERE delete_serial IS NULL) FROM resources")
            assert counts.fetchone() == (100, 50)
        states.write_state(db, WHO, "before", state(3, [resource("x", [instance(i, "c") for i in range(50)])]),
                           lock_id=None)
        with db.transaction() as conn:
            live = conn.execute("SELECT count(*) FROM resources WHERE delete_serial IS NULL").fetchone()
        assert live == (50,)
    finally:
        db.close()
