"""The dependents lookup of ``edges`` with the dependencies index's pending list full and folded in.

Run from the repository root:

    .venv/bin/python -m bench.edges_pending_bench --size 500000

It creates a scratch database, writes one state of ``--size`` resources of one instance each through
``states.write_state`` (each depending on one of the resources before it), with the store's fold of the
GIN pending list switched off for that write (as the code before the fold left it), and times
``graph.edges_touching`` for the 100 resources of one file (the lookup ``kl apply -f`` makes). Then it folds
the pending list in with ``gin_clean_pending_list`` (as every bulk write now does) and times the same lookup
again, in the same process and database. Prints only; the numbers go to docs/benchmarks.md by hand.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Sequence

import psycopg

from bench import common
from bench.states import instance, resource, state

perf = time.perf_counter


def _body(size: int) -> bytes:
    resources = [resource(f"r{i}", [instance(None, f"v{i}", deps=[f"terraform_data.r{i // 2}"] if i else [])])
                 for i in range(size)]
    return state(1, resources)


def main(argv: Sequence[str] | None = None) -> int:
    p = common.printing_parser("edges_pending_bench", __doc__ or "", size=200000, what="resources")
    p.add_argument("--reps", type=int, default=7, help="lookups timed each way (default: %(default)s)")
    args = p.parse_args(argv)
    from app.domain.principal import Principal
    from app.store import graph, states
    from app.store.db import Database
    from app.store.migrate import migrate

    who = Principal(tenant_id=1, actor="bench")
    middle = args.size // 2
    globs = [f"terraform_data.r{i}" for i in range(middle, middle + 100)]
    with common.scratch_database(args.database_url, "kl_bench_edges") as url:
        migrate(url)
        db = Database(url)
        try:
            fold = states._FOLD_PENDING
            states._FOLD_PENDING = "SELECT 0"  # the write as before the fold
            try:
                start = perf()
                states.write_state(db, who, "edges", _body(args.size), lock_id=None)
                written = perf() - start
            finally:
                states._FOLD_PENDING = fold
            print(f"{args.size} resources written in {written:.1f} s; load {common.load_average()}")
            for label in ("pending list as the write left it", "after the fold"):
                if label == "after the fold":
                    with psycopg.connect(url, autocommit=True) as conn:
                        start = perf()
                        row = conn.execute(fold).fetchone()
                        pages = row[0] if row else 0
                        print(f"fold: {pages} pending pages in {perf() - start:.2f} s")
                times = []
                for _ in range(args.reps):
                    start = perf()
                    edges = graph.edges_touching(db, who, "edges", globs)
                    times.append(perf() - start)
                print(f"{label}: edges for 100 resources, median {statistics.median(times) * 1000:.0f} ms "
                      f"(min {min(times) * 1000:.0f}, max {max(times) * 1000:.0f}), {len(edges)} edges")
        finally:
            db.close()
    print(f"load at end {common.load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
