"""The store's lookups of resource rows by address at scale: the plan each gets and its execution time.

Run from the repository root:

    .venv/bin/python -m bench.address_lookups_bench --size 200000

It migrates a scratch database and writes one state through ``states.write_state``: ``--size`` instances as
``module.mK.terraform_data.x[i]`` in modules of 1,000, each depending on its module's
``terraform_data.base``; then serial 2, which changes the instances of the first ten modules (so the table
holds closed lifecycles and changed names, as after real writes). Each lookup is the product's own SQL
constant with parameters of one kind a request sends (an exact address, a module's prefix, a page of the
dashboard, the keys a commit closes, ...). For each it prints the indexes the plan reads (or ``Seq Scan``) and
the median ``Execution Time`` of ``EXPLAIN ANALYZE`` over ``--repeat`` runs; a statement that writes runs in a
transaction that is rolled back. It prints only. To compare two revisions run it from a checkout of each and
compare the lines.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg

from bench import common
from bench.states import instance, resource, state

MODULE = 1000  # instances per module


def _body(serial: int, size: int, changed_modules: int = 0) -> bytes:
    resources = []
    for k in range(size // MODULE):
        value = "w" if k < changed_modules else "v"
        module = f"module.m{k}"
        resources.append(resource("base", [instance(None, f"b{k}")], module=module))
        resources.append(resource("x", [instance(i, f"{value}{k}-{i}", deps=[f"{module}.terraform_data.base"])
                                        for i in range(MODULE)], module=module))
    return state(serial, resources)


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _lookups(state_id: int) -> list[tuple[str, str, Any]]:
    from app.store import commit, dashboard, graph, history, resources

    one = "module.m7.terraform_data.x[3]"
    keys = [f"module.m7.terraform_data.x[{i}]" for i in range(100)]
    changed = [f"module.m{k}.terraform_data.x[{i}]" for k in range(10) for i in range(MODULE)]
    escaped = "module.m7"
    list_prefix = resources._LIST.format(instance="", prefix="AND " + resources._PREFIX)
    return [
        ("slice: one exact address (graph._UNDER_GLOBS)", graph._UNDER_GLOBS,
         {"state": state_id, "exact": [one], "prefixes": []}),
        ("slice: one module's prefix, 1,000 rows (graph._UNDER_GLOBS)", graph._UNDER_GLOBS,
         {"state": state_id, "exact": [], "prefixes": ["module.m7.", "module.m7["]}),
        ("dashboard: first page of the head (dashboard._HEAD_RESOURCES)", dashboard._HEAD_RESOURCES,
         {"state_id": state_id, "pattern": None, "limit": 100}),
        ("dashboard: filtered page (dashboard._HEAD_RESOURCES)", dashboard._HEAD_RESOURCES,
         {"state_id": state_id, "pattern": "%m7.terraform_data.x[1%", "limit": 100}),
        ("dashboard: upstream of one instance (dashboard._UPSTREAM)", dashboard._UPSTREAM, (state_id, one, 100)),
        ("dashboard: downstream of one resource (dashboard._DOWNSTREAM)", dashboard._DOWNSTREAM,
         (state_id, "module.m7.terraform_data.base", 100)),
        ("commit: close 100 keys (commit._CLOSE_KEYS)", commit._CLOSE_KEYS, (3, keys, [""] * 100, state_id)),
        ("commit: base rows of 100 addresses (commit._BASE_ROWS)", commit._BASE_ROWS, (state_id, keys, 2, 2)),
        ("history: changed names of 10,000 keys (history._CHANGED_NAMES)",
         history._CHANGED_NAMES,
         {"secret": "^$", "state": state_id, "serial": 2, "addresses": changed, "deposed": [""] * len(changed)}),
        ("history: addresses under a prefix (history._UNDER_PREFIX)", history._UNDER_PREFIX,
         {"state": state_id, "prefix": "module.m7.", "after": "", "limit": 100}),
        ("history: lifecycles of 100 addresses (history._LIFECYCLES)", history._LIFECYCLES,
         {"state": state_id, "addresses": keys, "per": 20}),
        ("listing under a prefix at the head (resources._LIST)", list_prefix,
         {"state_id": state_id, "serial": 2, "prefix": escaped, "like_dot": escaped + ".%",
          "like_key": escaped + "[%"}),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    p = common.printing_parser("address_lookups_bench", __doc__ or "", size=200000)
    p.add_argument("--repeat", type=int, default=5, help="EXPLAIN ANALYZE runs per lookup (default: %(default)s)")
    args = p.parse_args(argv)
    from app.domain.principal import Principal
    from app.store import states
    from app.store.db import Database
    from app.store.migrate import migrate

    who = Principal(tenant_id=1, actor="bench")
    with common.scratch_database(args.database_url, "kl_bench_lookups") as url:
        migrate(url)
        db = Database(url)
        try:
            states.write_state(db, who, "lookups", _body(1, args.size), lock_id=None)
            states.write_state(db, who, "lookups", _body(2, args.size, changed_modules=10), lock_id=None)
        finally:
            db.close()
        print(f"{args.size} instances in modules of {MODULE}; load {common.load_average()}")
        with psycopg.connect(url) as conn:
            conn.execute("ANALYZE resources")
            conn.commit()
            (state_id,) = conn.execute("SELECT id FROM states WHERE name = 'lookups'").fetchone() or (0,)
            for label, query, params in _lookups(state_id):
                times, indexes = [], set()
                for _ in range(args.repeat):
                    conn.execute("DELETE FROM resource_changes")  # _CHANGED_NAMES inserts what the write did
                    (plan,) = conn.execute(("EXPLAIN (ANALYZE, FORMAT JSON) " + query).encode(),
                                           params).fetchone() or (None,)
                    conn.rollback()
                    top = (plan if isinstance(plan, list) else json.loads(plan))[0]
                    times.append(top["Execution Time"])
                    for node in _nodes(top["Plan"]):
                        if "Index Name" in node:
                            indexes.add(node["Index Name"])
                        elif node["Node Type"] == "Seq Scan":
                            indexes.add(f"Seq Scan {node['Relation Name']}")
                print(f"{label}: {statistics.median(times):.2f} ms; {', '.join(sorted(indexes))}")
        print(f"load at end {common.load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
