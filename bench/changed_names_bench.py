"""Changed-names benchmark: the statement that records which attribute names a POST replacing every row changed.

Run from the repository root:

    .venv/bin/python -m bench.changed_names_bench --sizes 50000,200000 --rounds 3 --against main

For each size a scratch database (migrated) gets two whole-state writes through the store
(``app.store.states.write_state``, ``bench.states.counted_state``): serial 1, then serial 2 with every instance's
value changed, so every row is replaced. Then, alternating each round, it deletes the recorded
``resource_changes`` rows and runs the statement again over the same keys: this tree's
``history._CHANGED_NAMES`` and the one in ``app/store/history.py`` at the ``--against`` revision (``git show``).
Each answer is checked to be the same rows; the report gives each statement's median, range and the ratio.
Prints only (a Markdown table); ``--out`` also writes it as a section.
"""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

import psycopg

from app.domain.attributes import SECRET_NAME_PATTERN
from app.domain.principal import default_principal
from app.store import history, states
from app.store.db import Database
from app.store.migrate import migrate
from bench import common
from bench.scale_bench import s
from bench.states import counted_state

SECTION = "## Changed attribute names of a POST replacing every row"
_RESULT = ("SELECT r.address, c.names, c.sensitive FROM resource_changes c JOIN resources r ON r.id = c.resource_id "
           "ORDER BY r.address")


def statement_at(revision: str) -> str:
    source = subprocess.run(["git", "show", f"{revision}:app/store/history.py"], check=True, capture_output=True,
                            text=True).stdout
    found = re.search(r'_CHANGED_NAMES = """(.*?)"""', source, re.S)
    if found is None:
        raise common.BenchError(f"no _CHANGED_NAMES in app/store/history.py at {revision}")
    return found.group(1)


def measure(url: str, n: int, rounds: int, statements: dict[str, str]) -> dict[str, list[float]]:
    db = Database(url)
    try:
        who = default_principal("bench")
        states.write_state(db, who, "names", counted_state(1, n), lock_id=None)
        states.write_state(db, who, "names", counted_state(2, n, value="w"), lock_id=None)
    finally:
        db.close()
    times: dict[str, list[float]] = {k: [] for k in statements}
    with psycopg.connect(url) as conn:
        (state_id,) = conn.execute("SELECT id FROM states WHERE name = 'names'").fetchone() or (0,)
        keys = conn.execute("SELECT address, deposed FROM resources WHERE state_id = %s AND create_serial = 2 "
                            "AND delete_serial IS NULL", (state_id,)).fetchall()
        params = {"secret": SECRET_NAME_PATTERN, "state": state_id, "serial": 2,
                  "addresses": [a for a, _ in keys], "deposed": [d for _, d in keys]}
        expected = conn.execute(_RESULT).fetchall()
        if len(expected) != n:
            raise common.BenchError(f"{len(expected)} recorded changes, expected {n}")
        conn.commit()
        for k in range(rounds):
            for label, statement in statements.items():
                conn.execute("DELETE FROM resource_changes")
                conn.commit()
                started = time.perf_counter()
                conn.execute(statement, params)
                conn.commit()
                times[label].append(time.perf_counter() - started)
                if conn.execute(_RESULT).fetchall() != expected:
                    raise common.BenchError(f"{label} recorded other names than the write did")
                conn.rollback()
            common.log(f"  {n} round {k + 1}: " + ", ".join(f"{lb} {t[-1]:.2f}s" for lb, t in times.items())
                       + f" (load {common.load_average()})")
    return times


def main(argv: Sequence[str] | None = None) -> int:
    p = common.bench_parser("changed_names_bench", __doc__ or "", section=SECTION, json_help=None,
                            out_help="also write the table as a section of this Markdown file")
    p.add_argument("--sizes", default="50000", help="instance counts, comma separated (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="rounds per size (default: %(default)s)")
    p.add_argument("--against", default="main", help="git revision of the other statement (default: %(default)s)")
    args = p.parse_args(argv)
    common.stop_cleanly_on_signals()
    statements = {args.against: statement_at(args.against), "this tree": history._CHANGED_NAMES}
    rows: list[list[str]] = []
    for size in (int(x) for x in args.sizes.split(",") if x.strip()):
        with common.scratch_database(args.database_url, "kl_bench_names") as url:
            migrate(url)
            load = common.load_average()
            times = measure(url, size, args.rounds, statements)
        before, after = (statistics.median(t) for t in times.values())
        rows.append([f"{size:,}", load, *(f"{s(statistics.median(t))} ({s(min(t))}-"
                                          f"{s(max(t))})" for t in times.values()), f"{after / before:.2f}x"])
    section = (f"{SECTION}\n\nCommand: `{common.command_line('changed_names_bench', argv)}`; median of "
               f"{args.rounds} alternating rounds (range). Load average at the end: {common.load_average()}.\n\n"
               + common.table(["instances", "load before", args.against, "this tree", "ratio"], rows) + "\n")
    print(section)
    if args.out is not None:
        common.write_section(args.out, SECTION, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
