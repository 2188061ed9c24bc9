"""Where a whole-state POST spends its time, phase by phase, at the store (no HTTP).

Run from the repository root:

    .venv/bin/python -m bench.post_phases --size 200000               # with every constraint of the schema
    .venv/bin/python -m bench.post_phases --size 200000 --drop-fk     # the same with resources' foreign keys dropped
    .venv/bin/python -m bench.post_phases --drop-index resources_alive_deps_gin   # without one index
    .venv/bin/python -m bench.post_phases --upkeep-after              # the refresh after the timed write
    .venv/bin/python -m bench.post_phases --first-only                # only the first POST
    .venv/bin/python -m bench.post_phases --first-only --wide         # N resources of one instance each

It creates a scratch database, calls ``states.write_state`` twice on one state (the first POST into an empty
state, then serial 2 with every instance's value changed; ``bench.states.counted_state``; with ``--wide``, N
resources of one instance each, ``bench.filescoped_bench.state_body``, the scale bench's N-resources shape), and
prints the
wall time of each write, the process's CPU time in it, and the wall time of the store functions it passes
through (wrapped with ``bench.common.shim_target``), and the time from the return of the state's row lock
(``locked_row``, the last time it was taken) to the write's return: what other writers of the state wait for.
A first POST streams its rows into their COPY while it parses (``parse_state_watched``, which therefore
includes the row COPY, and ``insert_version``, which then runs in a thread of its own beside the parse); the
second write parses (``parse_body``) and projects. ``--drop-fk`` drops any
foreign key of ``resources`` on the scratch database first, to price its per-row check (since migration 0028
``resources.state_id`` has none, so this prices a schema before it), and ``--drop-index`` an index, to price
its upkeep; the product never runs without either. ``--upkeep-after`` hands a bulk write's statistics refresh
out of the write (``after_bulk``), and the changed attribute names of a write that replaced many rows
(``later``), as the server does (``app.web.upkeep``), and runs them in that order, timed on their own, after
the write's timer stops, so the write's time is what a client waits for. The floor is
``json.loads`` + sha256 of the first body, best of 3. It prints only.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg import sql

from bench import common
from bench.filescoped_bench import PER_FILE, state_body
from bench.states import counted_state

perf = time.perf_counter


LOCKED_AT = "locked_row returned"


def _wrap(owner: object, attr: str, totals: dict[str, float], marks: dict[str, float]) -> None:
    original: Callable[..., Any] = common.shim_target(owner, attr)

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = perf()
        try:
            return original(*args, **kwargs)
        finally:
            end = perf()
            totals[attr] = totals.get(attr, 0.0) + end - start
            if attr == "locked_row":
                marks[LOCKED_AT] = end

    setattr(owner, attr, timed)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.post_phases", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--size", type=int, default=200000, help="instances (default: %(default)s)")
    p.add_argument("--drop-fk", action="store_true", help="drop resources' foreign key on the scratch database")
    p.add_argument(
        "--database-url",
        default=common.DEFAULT_DATABASE_URL,
        help="Postgres server to create the scratch database on (default: %(default)s)",
    )
    p.add_argument(
        "--drop-index",
        action="append",
        default=[],
        metavar="NAME",
        help="drop this index of resources on the scratch database first (repeatable)",
    )
    p.add_argument("--first-only", action="store_true", help="time only the first POST")
    p.add_argument("--wide", action="store_true", help="N resources of one instance each (implies --first-only)")
    p.add_argument(
        "--upkeep-after",
        action="store_true",
        help="run a bulk write's statistics refresh and changed names after the write's timer, as the server does",
    )
    args = p.parse_args(argv)
    from app.domain.principal import Principal
    from app.store import history, rawwrite, resources, states
    from app.store.db import Database
    from app.store.migrate import migrate

    totals: dict[str, float] = {}
    marks: dict[str, float] = {}
    for owner, attr in (
        (states, "parse_state_watched"),
        (states, "parse_body"),
        (states, "locked_row"),
        (resources, "remember_open_set"),
        (rawwrite, "insert_version"),
        (resources, "load_open_set"),
        (resources, "copy_new_rows"),
        (resources, "project"),
        (history, "record_changed_names_after_commit"),
        (states, "refresh_statistics"),
    ):
        _wrap(owner, attr, totals, marks)
    name = f"kl_bench_phases_{time.time_ns()}"
    with psycopg.connect(args.database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = common.with_dbname(args.database_url, name)
    try:
        migrate(url)
        with psycopg.connect(url, autocommit=True) as conn:
            for index in args.drop_index:
                conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(index)))
            if args.drop_fk:
                for (con,) in conn.execute(
                    "SELECT conname FROM pg_constraint WHERE conrelid = 'resources'::regclass AND contype = 'f'"
                ).fetchall():
                    conn.execute(sql.SQL("ALTER TABLE resources DROP CONSTRAINT {}").format(sql.Identifier(con)))
        if args.wide:
            bodies = [state_body(max(1, args.size // PER_FILE), seed=7)]
        else:
            bodies = [counted_state(1, args.size), counted_state(2, args.size, value="w")][:1 if args.first_only else 2]
        floor = min(_floor(bodies[0]) for _ in range(3))
        print(
            f"{args.size} instances, {len(bodies[0]) / 1e6:.0f} MB; floor {floor:.2f} s; load {common.load_average()}"
        )
        db = Database(url)
        try:
            for label, body in zip(("first POST", "every row new"), bodies, strict=False):
                totals.clear()
                marks.clear()
                asked: list[None] = []
                handed: list[Callable[[], object]] = []
                after_bulk = functools.partial(asked.append, None) if args.upkeep_after else None
                later = handed.append if args.upkeep_after else None
                start, cpu = perf(), time.process_time()
                states.write_state(
                    db, Principal(tenant_id=1, actor="bench"), "phases", body, lock_id=None, after_bulk=after_bulk,
                    later=later,
                )
                end = perf()
                wall = end - start
                phases = ", ".join(f"{k} {v:.2f} s" for k, v in totals.items())
                if LOCKED_AT in marks:
                    phases += f"; under the row lock {end - marks[LOCKED_AT]:.2f} s"
                totals.clear()
                if asked or handed:
                    upkeep_start = perf()
                    if asked:
                        states.refresh_statistics(db)
                    for work in handed:
                        work()
                    phases += f"; after the write ({perf() - upkeep_start:.2f} s): " + ", ".join(
                        f"{k} {v:.2f} s" for k, v in totals.items())
                print(f"{label}: {wall:.2f} s ({wall / floor:.2f}x), CPU {time.process_time() - cpu:.2f} s; {phases}")
        finally:
            db.close()
        print(f"load at end {common.load_average()}")
    finally:
        with psycopg.connect(args.database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    return 0


def _floor(body: bytes) -> float:
    start = perf()
    json.loads(body)
    hashlib.sha256(body).digest()
    return perf() - start


if __name__ == "__main__":
    sys.exit(main())
