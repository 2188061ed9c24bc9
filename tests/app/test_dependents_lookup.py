"""The dependents lookup of ``edges`` never takes the state as an index condition: through the btree on
``state_id`` it would read every row of the state (the planner's choice for a state holding a small share of the
table), where the dependencies index finds the few rows that name what a change writes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from app.domain.principal import default_principal
from app.store import Database, graph, states
from tests.helpers import instance, resource, state

WHO = default_principal("dependents-test")


def _body(count: int, dep: str) -> bytes:
    rows = [instance(i, f"v-{i}", deps=[f"terraform_data.{dep}"]) for i in range(count)]
    return state(1, [resource("item", rows)])


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def test_the_dependents_of_a_small_state_beside_a_large_one_are_not_looked_up_by_state(db: Database) -> None:
    states.write_state(db, WHO, "small", _body(300, "dep"), lock_id=None)
    states.write_state(db, WHO, "large", _body(states.BULK_ROWS * 2, "other"), lock_id=None)  # statistics refreshed
    names = sorted(f"terraform_data.item{k}" for k in range(100)) + ["terraform_data.dep"]
    with db.transaction() as conn:
        small = states.find_state(conn, WHO, "small")
        conn.execute("SET LOCAL enable_seqscan = off")  # as _dependents runs it
        row = conn.execute("EXPLAIN (FORMAT JSON) " + graph._DEPENDENTS,
                           {"state": small.id, "names": names}).fetchone()
        found = graph._dependents(conn, small.id, names)
    assert row is not None
    plan = (row[0] if isinstance(row[0], list) else json.loads(row[0]))[0]["Plan"]
    by_state = [n for n in _nodes(plan) if "state_id" in n.get("Index Cond", "")]
    assert by_state == [], plan
    assert len(found) == 300  # every row of the small state names terraform_data.dep, none of the large one's


def test_the_dependencies_index_holds_only_rows_that_name_a_dependency_and_serves_the_lookup(db: Database) -> None:
    """Rows without dependencies (which no ``&&`` lookup can match) are left out of the GIN index, and the
    dependents lookup still goes through it and finds every row that names what a change writes."""
    rows = [instance(i, f"v-{i}", deps=["terraform_data.dep"] if i % 3 == 0 else []) for i in range(600)]
    states.write_state(db, WHO, "mixed", state(1, [resource("item", rows)]), lock_id=None)
    with db.transaction() as conn:
        mixed = states.find_state(conn, WHO, "mixed")
        predicate = conn.execute(
            "SELECT pg_get_expr(i.indpred, i.indrelid) FROM pg_index i"
            " WHERE i.indexrelid = 'resources_alive_deps_gin'::regclass").fetchone()
        conn.execute("SET LOCAL enable_seqscan = off")  # as _dependents runs it
        row = conn.execute("EXPLAIN (FORMAT JSON) " + graph._DEPENDENTS,
                           {"state": mixed.id, "names": ["terraform_data.dep"]}).fetchone()
        found = graph._dependents(conn, mixed.id, ["terraform_data.dep"])
        none = graph._dependents(conn, mixed.id, ["terraform_data.absent"])
    assert predicate is not None and "cardinality(dependencies) > 0" in predicate[0], predicate
    assert row is not None
    plan = (row[0] if isinstance(row[0], list) else json.loads(row[0]))[0]["Plan"]
    assert "resources_alive_deps_gin" in [n.get("Index Name") for n in _nodes(plan)], plan
    assert sorted(address for address, _ in found) == sorted(f"terraform_data.item[{i}]" for i in range(0, 600, 3))
    assert none == []
