"""What a stored assembly position would move: the read without its sort, against the index's cost per write.

The first GET with no splice base reads a version's rows sorted into the state's order
(``resources._STREAM_FOR_ASSEMBLY``); the sort is about half of what Postgres spends on that statement. A
column holding each row's position in that order, with an index on ``(state_id, position)``, would let
Postgres read the rows in order with no sort, at the cost of keeping that index on every write. This bench
prices both before anything is built. Over one scratch database holding ``bench.states.counted_state``
(written by ``states.write_state``), it copies the state's rows into a table with such a position (their
rank in the statement's order), and times, alternating, ``--rounds`` times each:

- inserting those rows into an empty copy of ``resources`` (every index of ``resources``), with and without
  the position's index: what a whole-state POST of that many rows would pay;
- the assembly's statement over the copy, streamed to this process as the assembly reads it (rows dropped),
  sorted as today and ordered by the position's index;
- the check a POST would add before numbering its rows: that the parsed rows come in the assembly's order
  (``row_order`` of each, each key below the next), Python CPU, fastest of the rounds, on the body of one
  counted resource and on that of as many resources of one instance each (``bench.filescoped_bench``'s
  shape), beside the POST's floor for each (``json.loads`` and sha256 of the body, fastest of three).

Run: ``python -m bench.assembly_position_bench --sizes 200000 --rounds 3`` (``--quick``: 20,000 instances,
1 round, no document).
"""

from __future__ import annotations

import hashlib
import json
import operator
import statistics
import sys
import time
from typing import Any

import psycopg

SECTION = "## First GET from all rows: a stored assembly position, measured before building it"
STATE = "big"


def _timed(conn: psycopg.Connection, statement: str) -> float:
    wall = time.perf_counter()
    conn.execute(statement.encode())
    return time.perf_counter() - wall


def _streamed(conn: psycopg.Connection, statement: str) -> float:
    wall = time.perf_counter()
    with conn.transaction():
        for _ in conn.cursor(binary=True).stream(statement.encode(), size=1000):
            pass
    return time.perf_counter() - wall


def measure(url: str, rounds: int) -> dict[str, list[float]]:
    """The four timings (see the module's docstring), ``rounds`` of each."""
    from app.store import resources
    from bench import common

    statement = resources._STREAM_FOR_ASSEMBLY
    start, end = common.assembly_sort(statement)
    order = statement[start:end]
    got: dict[str, list[float]] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET jit = off")  # as the server's pool sets it
        state_id, serial = conn.execute("SELECT id, current_serial FROM states WHERE name = %s",
                                        (STATE,)).fetchone() or (0, 0)
        conn.execute(f"CREATE TABLE bench_ranked AS SELECT *, (row_number() OVER ({order}))::bigint AS position "
                     f"FROM resources WHERE state_id = {int(state_id)}".encode())
        columns = ", ".join(name for (name,) in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'bench_ranked' "
            "AND column_name <> 'id' ORDER BY ordinal_position"))
        read = statement.replace("%(state_id)s", str(int(state_id))).replace("%(serial)s", str(int(serial))) \
            .replace("FROM resources", "FROM bench_copy")
        start, end = common.assembly_sort(read)
        by_position = read[:start] + "ORDER BY position " + read[end:]
        for _ in range(rounds):
            for indexed in (False, True):
                conn.execute("DROP TABLE IF EXISTS bench_copy")
                conn.execute("CREATE TABLE bench_copy (LIKE resources INCLUDING ALL)")
                conn.execute("ALTER TABLE bench_copy ADD COLUMN position bigint")
                if indexed:
                    conn.execute("CREATE INDEX ON bench_copy (state_id, position)")
                name = "insert, with the position's index" if indexed else "insert, the indexes of today"
                got.setdefault(name, []).append(
                    _timed(conn, f"INSERT INTO bench_copy ({columns}) SELECT {columns} FROM bench_ranked"))
            conn.execute("VACUUM ANALYZE bench_copy")
            got.setdefault("read, sorted (today)", []).append(_streamed(conn, read))
            got.setdefault("read, in the position's order", []).append(_streamed(conn, by_position))
        plan = conn.execute(f"EXPLAIN {by_position}".encode()).fetchall()
        if not any("Index Scan" in line for (line,) in plan) or any("Sort" in line for (line,) in plan):
            raise SystemExit("the read by position was not planned as an index scan without a sort")
        conn.execute("DROP TABLE IF EXISTS bench_copy, bench_ranked")
    return got


def order_check(count: int, rounds: int) -> dict[str, float]:
    """The parse's order check (see the module's docstring), CPU seconds, for ``count`` instances."""
    from bench.filescoped_bench import PER_FILE, state_body
    from bench.states import counted_state

    got: dict[str, float] = {}
    for shape, make in (("one resource", lambda: counted_state(1, count)),
                        ("N resources", lambda: state_body(max(1, count // PER_FILE), seed=7))):
        got[f"order check, {shape}"], got[f"POST floor, {shape}"] = _order_check_of(make(), rounds)
    return got


def _order_check_of(body: bytes, rounds: int) -> tuple[float, float]:
    """The order check's CPU on ``body``'s parsed rows (fastest of ``rounds``), and the body's POST floor."""
    from analyzer.state import parse_state
    from analyzer.state_assembly import row_order

    floor = min(_cpu(lambda: (json.loads(body), hashlib.sha256(body).digest())) for _ in range(3))
    parsed: Any = parse_state(body)
    rows = parsed.instances

    def check() -> None:
        keys = list(map(row_order, rows))
        if not all(map(operator.lt, keys, keys[1:])):
            raise SystemExit("the bench's body is not in the assembly's order")

    return min(_cpu(check) for _ in range(rounds)), floor


def _cpu(call: Any) -> float:
    cpu = time.process_time()
    call()
    return time.process_time() - cpu


def main(argv: list[str] | None = None) -> int:
    from bench import common
    from bench.states import counted_state

    p = common.bench_parser("assembly_position_bench", __doc__ or "", section=SECTION, json_help=None,
                            quick_help="20,000 instances, 1 round; writes no document unless --out is given")
    run = common.start_sized_run(p, "assembly_position_bench", argv, rounds=3,
                                 rounds_help="timings of each kind per size, alternating")
    args, out, command, sizes, rounds = run.args, run.out, run.command, run.sizes, run.rounds
    load_before = common.load_average()
    rows = []
    for count in sizes:
        with common.state_database(args.database_url, "kl_bench_position", STATE, counted_state(1, count)) as url:
            got = measure(url, rounds)
        common.log(f"{count}: {got}")
        for name, times in got.items():
            rows.append([f"{count:,}", name, f"{statistics.median(times):.2f} s",
                         ", ".join(f"{t:.2f}" for t in times)])
        checks = order_check(count, rounds)
        common.log(f"{count}: {checks}")
        rows += [[f"{count:,}", f"{name} (CPU, fastest)", f"{cpu:.2f} s", "-"] for name, cpu in checks.items()]
    section = "\n".join([
        SECTION, "",
        f"Command: `{command}`. Rounds: {rounds}. Load average before: {load_before}; after: "
        f"{common.load_average()}.", "",
        common.table(["instances", "measure", "median", "each round (s)"], rows),
    ])
    common.publish(out, SECTION, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
