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
