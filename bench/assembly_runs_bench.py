"""What runs of instances joined by Postgres would move in a first GET from all rows, before building it.

A first GET with no splice base reads one row per instance object (``resources._STREAM_FOR_ASSEMBLY``) and
then joins the texts of up to 500 of one resource's instances again (``analyzer.state_assembly``'s run) to
encode them with one orjson call each way. The rows' decoding and the per-row loop are most of the Python
time. Postgres could hand over the runs themselves: one row per run of a resource's instances, their texts
joined by ``string_agg``, their keys in an array. This bench prices that before anything is built, over one
scratch database holding one resource's instances (written by ``states.write_state``), for two shapes:
``count`` (integer keys, ``bench.states.counted_state``) and ``for_each`` (string keys).

The run statement sorts the rows into the state's order and groups them by that sort's own leading keys
(the resource, the key's type, and the integer key divided by 500), so Postgres sorts once and aggregates
the sorted rows as they come; the texts are joined in that order. A string key has no such bucket bounded
in size, so a ``for_each`` resource's instances each form a run of one (what the ``for_each`` shape
measures). Postgres 15 sorts again inside each group for an aggregate with its own ``ORDER BY``, so the run
statement has none: it relies on the group's rows arriving in the sort's order, which the bench checks on
each run's keys.

Timed, alternating, ``--rounds`` times each (wall and this process's CPU), over the same version:

- the assembly as a first GET runs it today (``assembly.from_rows``, pieces dropped): the reference;
- today's statement, its rows joined into runs of 500 of one resource and each run's text parsed and
  written indented by orjson (what the assembly's run encoding costs, without its field order, header and
  escapes);
- the run statement, each run's text parsed and written the same way.

Run: ``python -m bench.assembly_runs_bench --sizes 200000 --rounds 3`` (``--quick``: 20,000 instances,
1 round, no document).
"""

from __future__ import annotations

import operator
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import psycopg

SECTION = "## First GET from all rows: runs joined by Postgres, measured before building it"
STATE = "big"
_RUN = 500
# The run statement: the rows sorted into the state's order (``resources._STREAM_FOR_ASSEMBLY``'s, with the
# bucket of an integer key, and the string key, before the integer key itself: the same order, as a number
# key has no string key and a string key no number) and grouped by the leading keys of that sort, so
# Postgres sorts once and aggregates each group's rows in the order they come.
_KEY_NUMBER = "CASE WHEN jsonb_typeof(index_key) = 'number' THEN (index_key)::numeric END"
_RUNS = f"""
SELECT min(module), min(mode), min(type), min(name), min(provider), max(provider), min(key_type), count(*),
       string_agg(convert_to(instance::text, 'UTF8'), ','::bytea), array_agg(key_text), array_agg(deposed)
FROM (SELECT module COLLATE "C" AS module, mode COLLATE "C" AS mode, type COLLATE "C" AS type,
             name COLLATE "C" AS name, provider, jsonb_typeof(index_key) AS key_type,
             CASE jsonb_typeof(index_key) WHEN 'number' THEN 1 WHEN 'string' THEN 2 ELSE 0 END AS key_rank,
             least(greatest({_KEY_NUMBER}, -9e18), 9e18)::bigint / {_RUN} AS bucket,
             CASE WHEN jsonb_typeof(index_key) = 'string' THEN index_key #>> '{{}}' END COLLATE "C" AS string_key,
             least(greatest({_KEY_NUMBER}, -9e18), 9e18)::bigint AS big_key, {_KEY_NUMBER} AS number_key,
             deposed COLLATE "C" AS deposed, index_key #>> '{{}}' AS key_text, instance
      FROM resources
      WHERE state_id = %(state_id)s AND create_serial <= %(serial)s
        AND (delete_serial IS NULL OR delete_serial > %(serial)s)
      ORDER BY module, mode, type, name, key_rank, bucket, string_key, big_key, number_key, deposed
      OFFSET 0) AS sorted
GROUP BY module, mode, type, name, key_rank, bucket, string_key
"""


def _encode(joined: bytes) -> int:
    """A run's text parsed and written indented, as the assembly's run encoding does; its length."""
    import orjson

    return len(orjson.dumps([[[orjson.loads(b"[" + joined + b"]")]]], option=orjson.OPT_INDENT_2))


def _timed(call: Callable[[], int]) -> tuple[float, float, int]:
    wall, cpu = time.perf_counter(), time.process_time()
    got = call()
    return time.perf_counter() - wall, time.process_time() - cpu, got


def _today_runs(rows: Iterable[Any]) -> Iterable[bytes]:
    """Today's rows joined into the assembly's runs: up to 500 consecutive instances of one resource."""
    group: tuple[str, str, str, str] | None = None
    texts: list[bytes] = []
    for row in rows:
        key = (row.module, row.mode, row.type, row.name)
        if key != group or len(texts) >= _RUN:
            if texts:
                yield b",".join(texts)
            group, texts = key, []
        texts.append(row.instance_json)
    if texts:
        yield b",".join(texts)


def measure(url: str, rounds: int) -> dict[str, list[tuple[float, float]]]:
    """The three timings (see the module's docstring), ``rounds`` of each."""
    from app.store import assembly, resources

    got: dict[str, list[tuple[float, float]]] = {}
    with psycopg.connect(url) as conn:
        conn.execute("SET jit = off")  # as the server's pool sets it
        state_id, serial, lineage = conn.execute(
            "SELECT s.id, s.current_serial, v.lineage FROM states s "
            "JOIN state_versions v ON v.state_id = s.id AND v.serial = s.current_serial WHERE s.name = %s",
            (STATE,)).fetchone() or (0, 0, "")
        conn.rollback()
        params = {"state_id": state_id, "serial": serial}
        expected = conn.execute(
            "SELECT count(*) FROM resources WHERE state_id = %s AND delete_serial IS NULL", (state_id,)).fetchone()
        conn.rollback()

        def assembled() -> int:
            pieces = assembly.from_rows(conn, state_id, serial, lineage, "1.15.5", [], alone=True)
            return sum(map(len, pieces))

        def today() -> int:
            rows = resources.stream_assembly_rows(conn, state_id=state_id, serial=serial, alone=True)
            return sum(map(_encode, _today_runs(rows)))

        def runs() -> int:
            size = instances = 0
            previous: tuple[Any, ...] | None = None
            cur = conn.cursor(binary=True)
            for *resource, provider, last_provider, key_type, count, joined, keys, deposed in cur.stream(
                    _RUNS.encode(), params, size=8):
                orders = list(zip(map(int, keys) if key_type == "number" else keys, deposed, strict=True))
                if provider != last_provider or len(orders) != count or not all(
                        map(operator.lt, orders, orders[1:])):
                    raise SystemExit("a run's rows did not come in the state's order")
                if key_type is not None and previous is not None and previous[0] == resource \
                        and not previous[1] < orders[0]:
                    raise SystemExit("two runs of one resource did not come in the state's order")
                previous = (resource, orders[-1])
                size += _encode(joined)
                instances += count
            if instances != expected[0]:
                raise SystemExit(f"the runs held {instances} instances, not {expected[0]}")
            return size

        for _ in range(rounds):
            for name, call in (("the assembly today (from_rows)", assembled),
                               ("today's rows, joined into runs and encoded", today),
                               ("runs joined by Postgres, encoded", runs)):
                wall, cpu, _size = _timed(call)
                conn.rollback()
                got.setdefault(name, []).append((wall, cpu))
    return got


def _state(count: int, shape: str) -> bytes:
    from bench.states import counted_state, instance, resource, state

    if shape == "count":
        return counted_state(1, count)
    return state(1, [resource("item", [instance(f"key-{i:07d}", f"v-{i}") for i in range(count)])])


def main(argv: list[str] | None = None) -> int:
    from bench import common

    p = common.bench_parser("assembly_runs_bench", __doc__ or "", section=SECTION, json_help=None,
                            quick_help="20,000 instances, 1 round; writes no document unless --out is given")
    run = common.start_sized_run(p, "assembly_runs_bench", argv, rounds=3,
                                 rounds_help="timings of each kind per size, alternating")
    args, out, command, sizes, rounds = run.args, run.out, run.command, run.sizes, run.rounds
    load_before = common.load_average()
    rows = []
    for count in sizes:
        for shape in ("count", "for_each"):
            with common.state_database(args.database_url, "kl_bench_runs", STATE, _state(count, shape)) as url:
                got = measure(url, rounds)
            common.log(f"{count} {shape}: {got}")
            for name, times in got.items():
                rows.append([f"{count:,}", shape, name, f"{statistics.median(w for w, _ in times):.2f} s",
                             f"{statistics.median(c for _, c in times):.2f} s",
                             ", ".join(f"{w:.2f}" for w, _ in times)])
    section = "\n".join([
        SECTION, "",
        f"Command: `{command}`. Rounds: {rounds}. Load average before: {load_before}; after: "
        f"{common.load_average()}.", "",
        common.table(["instances", "keys", "read", "wall (median)", "Python CPU (median)", "each round, wall (s)"],
                     rows),
    ])
    common.publish(out, SECTION, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
