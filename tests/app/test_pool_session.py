"""Every pooled connection runs with JIT compilation off, including the ones the pool opens to replace a
retired connection, so a row lookup whose cost estimate follows the state's size is never compiled."""

from __future__ import annotations

import json

from app.store import graph
from app.store.db import LARGE_VALUE_BYTES, Database, retire


def _jit(db: Database) -> tuple[int, str]:
    with db.transaction() as conn:
        row = conn.execute("SELECT pg_backend_pid(), current_setting('jit')").fetchone()
    assert row is not None
    return int(row[0]), str(row[1])


def test_pooled_connections_run_without_jit(db: Database) -> None:
    _, setting = _jit(db)
    assert setting == "off"
    with db.transaction() as conn:
        first = conn.info.backend_pid
        conn.execute("SELECT convert_to(repeat('x', %s), 'UTF8')", (LARGE_VALUE_BYTES,), binary=True).fetchone()
        retire(conn)
    replaced, setting = _jit(db)
    assert replaced != first and setting == "off"


def test_the_slice_lookup_is_not_compiled_whatever_its_estimate(db: Database) -> None:
    """With the JIT threshold at zero every statement would be compiled when JIT is on; the slice's row lookup
    on a pooled connection reports no JIT in its executed plan."""
    lookup = graph.glob_lookup(graph._parse_globs(["terraform_data.a", "module.m.*"]))
    with db.transaction() as conn:
        conn.execute("SET LOCAL jit_above_cost = 0")
        row = conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + graph._UNDER_GLOBS,
            {"state": 1, "exact": list(lookup.exact), "prefixes": list(lookup.prefixes)},
        ).fetchone()
    assert row is not None
    plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
    assert "Plan" in plan[0] and "JIT" not in plan[0], plan[0].keys()
