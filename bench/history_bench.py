"""History benchmark: one address's history and a 1,000-address glob, at 50,000 instances with 200 versions.

Run from the repository root:

    .venv/bin/python -m bench.history_bench            # full size, rewrites its section of docs/benchmarks.md
    .venv/bin/python -m bench.history_bench --quick    # 5,000 instances, 20 versions, prints only

A scratch database (migrated) holds one state. Serial 1 is a whole-state write through the store
(``app.store.states.write_state``) of 49,000 ``terraform_data.cold`` instances and 1,000
``module.hot.terraform_data.x`` instances. Each later serial, up to 200, is built directly in the store as
a commit that changes every hot instance would leave it: the hot rows closed and reopened with a new value
(one UPDATE and one INSERT … SELECT), the version row, and the product's own
``history.record_changed_names`` over the 1,000 rows replaced (its time is reported: it is what a commit adds). So
each hot address has 200 lifecycles and the table 249,000 rows: the worst case of the targets.

Timed at the store, in process (``app.store.graph.blame``, whose queries are index range scans): one hot
address's whole history (200 changes), and the glob ``module.hot.*`` as one page of 1,000 addresses with
their newest 20 changes each (the default) and with 1 each. The baseline, in the same run, is the existing
single-address read ``app.store.graph.resource_history`` (every lifecycle with its instance object).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from app.domain.principal import default_principal
from app.store import graph, history, states
from app.store.db import Database
from app.store.migrate import migrate
from bench import common
from bench.states import instance, resource, state

SECTION = "## History and blame"
STATE = "hist"


def _build(db: Database, url: str, instances: int, hot: int, versions: int) -> float:
    """Serial 1 through write_state, then ``versions - 1`` hot commits; the median record_changed_names time."""
    body = state(1, [resource("cold", [instance(i, f"c{i}") for i in range(instances - hot)]),
                     resource("x", [instance(i, f"h{i}") for i in range(hot)], module="module.hot")])
    states.write_state(db, default_principal("bench"), STATE, body, lock_id=None)
    timings = []
    with psycopg.connect(url, autocommit=False) as conn:
        (state_id,) = conn.execute("SELECT id FROM states WHERE name = %s", (STATE,)).fetchone() or (0,)
        for serial in range(2, versions + 1):
            conn.execute("""
                WITH closed AS (
                    UPDATE resources SET delete_serial = %(serial)s
                    WHERE state_id = %(state)s AND delete_serial IS NULL AND address ~>=~ 'module.hot.'
                      AND address ~<~ 'module.hot/' RETURNING *)
                INSERT INTO resources (tenant_id, state_id, address, resource_address, module, mode, type, name,
                                       index_key, deposed, status, provider, instance, attributes_hash,
                                       dependencies, create_serial)
                SELECT tenant_id, state_id, address, resource_address, module, mode, type, name, index_key, deposed,
                       status, provider,
                       jsonb_set(instance, '{attributes,output}',
                                 jsonb_build_object('value', %(serial)s::text, 'type', 'string')),
                       md5(address || %(serial)s::text), dependencies, %(serial)s
                FROM closed""", {"serial": serial, "state": state_id})
            conn.execute("""
                INSERT INTO state_versions (tenant_id, state_id, serial, lineage, source, actor, token_name)
                VALUES (1, %s, %s, '11111111-2222-3333-4444-555555555555', 'http', 'bench', 'ci')""",
                         (state_id, serial))
            started = time.perf_counter()
            history.record_changed_names(conn, state_id=state_id, serial=serial)
            timings.append(time.perf_counter() - started)
            conn.execute("UPDATE states SET current_serial = %s WHERE id = %s", (serial, state_id))
            conn.commit()
        conn.execute("ANALYZE resources")
        conn.commit()
    return statistics.median(timings)


def _median(fn: Callable[[], Any], repeat: int) -> float:
    fn()  # warm
    found = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        found.append(time.perf_counter() - started)
    return statistics.median(found)


def main(argv: Sequence[str] | None = None) -> int:
    parser = common.bench_parser("history_bench", __doc__ or "", section=SECTION,
                                 quick_help="5,000 instances and 20 versions; prints only", json_help=None)
    args = parser.parse_args(argv)
    out, command = common.start_run(args, "history_bench", argv)
    instances, hot, versions = (5_000, 1_000, 20) if args.quick else (50_000, 1_000, 200)
    with common.scratch_database(args.database_url, "kl_bench_history") as url:
        migrate(url)
        db = Database(url)
        try:
            common.log(f"building {instances} instances x {versions} versions ...")
            started = time.perf_counter()
            changed_names = _build(db, url, instances, hot, versions)
            built = time.perf_counter() - started
            who = default_principal("bench")
            one = "module.hot.terraform_data.x[500]"
            page = graph.blame(db, who, STATE, "module.hot.*", limit=1000, changes=20)
            assert len(page.instances) == hot and len(page.instances[0].changes) == min(20, versions)
            rows = {
                "baseline: one address, every lifecycle with its instance (?address=)":
                    _median(lambda: graph.resource_history(db, who, STATE, one), 15),
                f"one address's history ({versions} changes, attributed)":
                    _median(lambda: graph.blame(db, who, STATE, one, changes=min(200, versions)), 15),
                "glob module.hot.*: 1,000 addresses x newest 20 changes":
                    _median(lambda: graph.blame(db, who, STATE, "module.hot.*", limit=1000, changes=20), 5),
                "glob module.hot.*: 1,000 addresses x newest change":
                    _median(lambda: graph.blame(db, who, STATE, "module.hot.*", limit=1000, changes=1), 5),
                "commit side: record_changed_names for 1,000 changed instances":
                    changed_names,
            }
        finally:
            db.close()
        baseline = next(iter(rows.values()))
        table = common.table(["read (median)", "time", "vs baseline"],
                             [[k, common.ms(v), f"{v / baseline:.2f}x"] for k, v in rows.items()])
        section = (f"{SECTION}\n\n{(__doc__ or '').split(chr(10) * 2)[0]}\n\n"
                   f"Command: `{command}`. Load average at the end: {common.load_average()}. "
                   f"{instances} instances, {versions} versions, {hot} hot instances changed in every version; "
                   f"built in {built:.0f} s.\n\n{table}\n")
        print(section)
        if out is not None:
            common.write_section(out, SECTION, section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
