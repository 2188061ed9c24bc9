"""What the indexes of ``resources`` cost the row COPY of a large write, in Postgres's CPU time.

Run from the repository root:

    .venv/bin/python -m bench.index_upkeep_bench --size 200000 --rounds 5
    .venv/bin/python -m bench.index_upkeep_bench --before 29      # the schema before migration 0029 beside it
    .venv/bin/python -m bench.index_upkeep_bench --drop-index resources_created_ix   # without one index

It migrates two scratch databases, one to the current schema and one to the schema before migration
``--before`` (or, with ``--drop-index``, the current schema without those indexes), parses one body of
``--size`` instances (``bench.states.counted_state``) once, and then, round by round and alternating between
the two, empties ``resources`` (``TRUNCATE``) and COPYs every row into it with the store's own
``resources.insert_rows``, in one transaction, as the first whole-state POST into an empty state does. It
prints, per schema, the median over the rounds of the COPY's wall time and of the CPU time of the Postgres
backend that ran it (read from ``/proc``, so the server must run on this machine), and the size of each
index after the last round. The backend's CPU time counts the work of the heap and every index and the
insert trigger, and little of what a busy machine adds to the wall time. It prints only.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Sequence

import psycopg
from psycopg import sql

from bench import common
from bench.states import counted_state

TICKS = os.sysconf("SC_CLK_TCK")


def _backend_cpu(pid: int) -> float:
    """User and system CPU seconds of a process on this machine, from ``/proc/PID/stat``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def main(argv: Sequence[str] | None = None) -> int:
    p = common.printing_parser("index_upkeep_bench", __doc__ or "", size=200000)
    p.add_argument("--rounds", type=int, default=5, help="COPYs into each schema (default: %(default)s)")
    p.add_argument("--before", type=int, default=29,
                   help="compare with the schema before this migration (default: %(default)s)")
    p.add_argument("--drop-index", action="append", default=[], metavar="NAME",
                   help="compare with the current schema without this index instead (repeatable)")
    args = p.parse_args(argv)
    from analyzer.staterows import ParsedState
    from app.domain.principal import Principal
    from app.store import resources, states
    from app.store.db import Database
    from app.store.migrate import migrate

    parsed = states.parse_body(counted_state(1, args.size))
    assert isinstance(parsed, ParsedState)
    other = f"without {', '.join(args.drop_index)}" if args.drop_index else f"before migration {args.before:04d}"
    print(f"{args.size} rows; load {common.load_average()}")
    with common.scratch_database(args.database_url, "kl_bench_upkeep") as current_url, \
            common.scratch_database(args.database_url, "kl_bench_upkeep") as other_url:
        migrate(current_url)
        migrate(other_url, upto=None if args.drop_index else args.before - 1)
        schemas = {"current": current_url, other: other_url}
        conns = {}
        for label, url in schemas.items():
            db = Database(url)
            try:  # the state the rows belong to
                states.write_state(db, Principal(tenant_id=1, actor="bench"), "upkeep",
                                   counted_state(1, 1), lock_id=None)
            finally:
                db.close()
            conn = psycopg.connect(url)
            for index in args.drop_index if label == other else ():
                conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(index)))
            conn.commit()
            conns[label] = conn
        wall: dict[str, list[float]] = {label: [] for label in schemas}
        cpu: dict[str, list[float]] = {label: [] for label in schemas}
        try:
            for _ in range(args.rounds):
                for label, conn in conns.items():
                    (state_id,) = conn.execute("SELECT id FROM states WHERE name = 'upkeep'").fetchone() or (0,)
                    conn.execute("TRUNCATE resources CASCADE")
                    conn.commit()
                    pid = conn.info.backend_pid
                    cpu_start, start = _backend_cpu(pid), time.perf_counter()
                    resources.insert_rows(conn, tenant_id=1, state_id=state_id, serial=1, rows=parsed.instances)
                    conn.commit()
                    wall[label].append(time.perf_counter() - start)
                    cpu[label].append(_backend_cpu(pid) - cpu_start)
            for label, conn in conns.items():
                sizes = conn.execute("""
                    SELECT c.relname, pg_relation_size(c.oid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
                    WHERE i.indrelid = 'resources'::regclass ORDER BY c.relname""").fetchall()
                print(f"{label}: COPY {statistics.median(wall[label]):.2f} s wall "
                      f"({min(wall[label]):.2f}-{max(wall[label]):.2f}), "
                      f"backend CPU {statistics.median(cpu[label]):.2f} s "
                      f"({min(cpu[label]):.2f}-{max(cpu[label]):.2f}); indexes "
                      + ", ".join(f"{name} {size / 2**20:.1f} MB" for name, size in sizes))
        finally:
            for conn in conns.values():
                conn.close()
    print(f"load at end {common.load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
