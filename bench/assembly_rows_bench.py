"""The assembly from all rows in-process: wall time, Python CPU and Postgres CPU of one checkout against another.

For each size, one scratch database holds a state of that many instances (``bench.states.counted_state``,
written by ``states.write_state``). Each round runs, for each checkout in turn, one assembly of the head from
all its rows (``assembly.from_rows`` with the cache writer's piece writes as that checkout's read makes them,
between the row fetches or all after the last piece; the final UPDATE left out) in a
child process whose code is that checkout's: its wall time, its CPU (``time.process_time``) and the CPU of its
Postgres backend (``/proc/<pid>/stat``), which the machine's load inflates less than wall time, and the sha256
of the bytes, which must be the same for every checkout. The wall time is until the last piece (what a reader
waits for); both CPU figures include the pieces' writes. The table gives the medians over the rounds.

``--parts`` adds, for this checkout, where one assembly's time goes, each part alone in each round (in a
child process, the medians in a second table): the statement by itself inside Postgres, as the assembly
runs it and without its sort, its instances' text, or both (``SELECT count(*), sum(octet_length(..))``
over it, so no row leaves Postgres); the rows fetched by the assembly's stream and dropped (wall, Python CPU,
Postgres CPU); and the encoding alone (``stream_state`` over those rows held in memory, Python CPU), each
beside the assembly of the same round.

Run: ``python -m bench.assembly_rows_bench --sizes 200000 --rounds 5 --baseline PATH`` (PATH: another checkout,
e.g. ``git archive main | tar -x -C PATH``; ``--quick``: 20,000 instances, 2 rounds, no document).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

SECTION = "## First GET from all rows in-process: one checkout against another"
STATE = "big"


def _backend_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one(url: str) -> dict[str, Any]:
    """One assembly of the head from all rows, by whichever checkout's ``app`` is first on the path."""
    from app.store import assembly

    with psycopg.connect(url) as conn:
        conn.execute("SET jit = off")  # as the server's pool sets it
        state_id, serial, lineage, version = conn.execute(
            "SELECT s.id, v.serial, v.lineage, v.terraform_version FROM states s "
            "JOIN state_versions v ON v.state_id = s.id AND v.serial = s.current_serial WHERE s.name = %s",
            (STATE,)).fetchone() or (0, 0, "", "")
        conn.commit()
        pid = conn.info.backend_pid
        cpu, pg, wall = time.process_time(), _backend_cpu(pid), time.perf_counter()
        digest, size = hashlib.sha256(), 0
        parameters = inspect.signature(assembly.from_rows).parameters
        held = "between" in parameters  # a checkout with pipelined fetches
        # A checkout whose writer sends pieces only when asked takes no ``held``; an older one needs it.
        keeps = "held" in inspect.signature(assembly.CacheWriter).parameters
        writer = assembly.CacheWriter(conn, held=True) if held and keeps else assembly.CacheWriter(conn)
        extra: dict[str, Any] = {"between": writer.flush_due} if held else {}
        if "alone" in parameters:  # a checkout whose read streams the rows and writes the pieces after them
            extra = {"alone": True}
        for piece in assembly.from_rows(conn, state_id, serial, lineage, version, [], **extra):
            writer.add(piece)
            digest.update(piece)
            size += len(piece)
        last_piece = time.perf_counter() - wall  # what the reader waits for
        writer.finish_with("SELECT %(id)s, %(sha256)s, %(size)s, %(format)s", {"id": 0})
        result = {"wall": last_piece, "python_cpu": time.process_time() - cpu,
                  "postgres_cpu": _backend_cpu(pid) - pg, "sha256": digest.hexdigest(), "bytes": size}
        conn.rollback()
    return result


# The assembly's statement without its sort, without its instances' text, or both: the parts Postgres
# spends its time on, measured alone (``parts``).
_TEXT, _NO_TEXT = "convert_to(instance::text, 'UTF8')", "length(address)::text"
_PART_NAMES = ("statement as the assembly runs it", "without the sort", "without the instances' text",
               "without either")


def _statement_parts(statement: str) -> dict[str, str]:
    from bench import common

    start, end = common.assembly_sort(statement)
    if _TEXT not in statement:
        raise SystemExit("the assembly's statement no longer has the text this bench takes apart")
    unsorted = statement[:start] + statement[end:]
    variants = (statement, unsorted, statement.replace(_TEXT, _NO_TEXT), unsorted.replace(_TEXT, _NO_TEXT))
    return dict(zip(_PART_NAMES, variants, strict=True))


def parts(url: str) -> dict[str, Any]:
    """Where one assembly's time goes (see the module's docstring), by this checkout's code."""
    from analyzer.state_assembly import stream_state
    from app.store import resources

    result: dict[str, Any] = {}
    with psycopg.connect(url) as conn:
        conn.execute("SET jit = off")
        state_id, serial = conn.execute(
            "SELECT s.id, s.current_serial FROM states s WHERE s.name = %s", (STATE,)).fetchone() or (0, 0)
        params = {"state_id": state_id, "serial": serial}
        for name, statement in _statement_parts(resources._STREAM_FOR_ASSEMBLY).items():
            wall = time.perf_counter()
            conn.execute(f"SELECT count(*), sum(octet_length(q.t)) FROM ({statement}) "
                         "AS q(m, o, y, n, a, k, j, d, p, t)".encode(), params).fetchone()
            result[name] = time.perf_counter() - wall
            conn.rollback()
        pid = conn.info.backend_pid
        cpu, pg, wall = time.process_time(), _backend_cpu(pid), time.perf_counter()
        rows = list(resources.stream_assembly_rows(conn, state_id=state_id, serial=serial, alone=True))
        result["rows"] = {"wall": time.perf_counter() - wall, "python_cpu": time.process_time() - cpu,
                          "postgres_cpu": _backend_cpu(pid) - pg}
        conn.rollback()
    cpu = time.process_time()
    for _ in stream_state(serial=serial, lineage="bench", terraform_version="1.15.0", outputs=(),
                          instances=rows, plain_numbers=True):
        pass
    result["encoding"] = time.process_time() - cpu
    return result


def _run(tree: Path | None, url: str, what: str = "--one") -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree or Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), what, url], cwd=tree, env=env,
                          capture_output=True, text=True, check=True)
    return dict(json.loads(done.stdout))


def _parts_rows(count: int, assemblies: list[dict[str, Any]], got: list[dict[str, Any]]) -> list[list[str]]:
    """The ``--parts`` table's rows for one size: each part's median beside the assembly's."""
    def median(values: Any) -> str:
        return f"{statistics.median(values):.2f} s"

    size = f"{count:,}"
    table = [[size, "the assembly (rows fetched and encoded)", median(r["wall"] for r in assemblies),
              median(r["python_cpu"] for r in assemblies), median(r["postgres_cpu"] for r in assemblies)]]
    table += [[size, f"in Postgres alone: {name}", median(r[name] for r in got), "-", "-"] for name in _PART_NAMES]
    table.append([size, "the rows fetched and dropped", median(r["rows"]["wall"] for r in got),
                  median(r["rows"]["python_cpu"] for r in got), median(r["rows"]["postgres_cpu"] for r in got)])
    table.append([size, "the encoding alone (rows in memory)", "-", median(r["encoding"] for r in got), "-"])
    return table


def main(argv: list[str] | None = None) -> int:
    from bench import common
    from bench.states import counted_state

    p = common.bench_parser("assembly_rows_bench", __doc__ or "", section=SECTION, json_help=None,
                            quick_help="20,000 instances, 2 rounds; writes no document unless --out is given")
    p.add_argument("--baseline", type=Path, default=None, help="another checkout, measured in the same rounds")
    p.add_argument("--parts", action="store_true", help="also where this checkout's assembly spends its time")
    run = common.start_sized_run(p, "assembly_rows_bench", argv, rounds=5, quick_rounds=2,
                                 rounds_help="assemblies per checkout and size, alternating")
    args, out, command, sizes, rounds = run.args, run.out, run.command, run.sizes, run.rounds
    trees: list[Path | None] = [None] if args.baseline is None else [args.baseline.resolve(), None]
    load_before = common.load_average()
    rows, part_rows = [], []
    for count in sizes:
        with common.state_database(args.database_url, "kl_bench_rows", STATE, counted_state(1, count)) as url:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("VACUUM ANALYZE resources")
            runs: dict[Path | None, list[dict[str, Any]]] = {tree: [] for tree in trees}
            split: list[dict[str, Any]] = []
            for _ in range(rounds):
                for tree in trees:
                    runs[tree].append(_run(tree, url))
                    common.log(f"{count} {tree or 'this checkout'}: {runs[tree][-1]}")
                if args.parts:
                    split.append(_run(None, url, "--parts"))
                    common.log(f"{count} parts: {split[-1]}")
        digests = {r["sha256"] for got in runs.values() for r in got}
        if len(digests) != 1:
            raise SystemExit(f"the checkouts assembled different bytes: {sorted(digests)}")
        for tree, got in runs.items():
            med = {k: statistics.median(r[k] for r in got) for k in ("wall", "python_cpu", "postgres_cpu")}
            rows.append([str(tree or "this checkout"), f"{count:,}", f"{got[0]['bytes'] / 1e6:.0f} MB",
                         f"{med['wall']:.2f} s", f"{min(r['wall'] for r in got):.2f} s", f"{med['python_cpu']:.2f} s",
                         f"{med['postgres_cpu']:.2f} s", got[0]["sha256"][:12]])
        if split:
            part_rows += _parts_rows(count, runs[None], split)
    section = "\n".join([
        SECTION, "",
        f"Command: `{command}`. Rounds: {rounds}. Load average before: {load_before}; after: "
        f"{common.load_average()}.", "",
        common.table(["code", "instances", "assembled", "wall (median)", "wall (fastest)", "Python CPU (median)",
                      "Postgres CPU (median)", "sha256"], rows),
    ] + (["", "Where this checkout's assembly spends its time (medians over the rounds):", "",
          common.table(["instances", "part", "wall", "Python CPU", "Postgres CPU"], part_rows)] if part_rows else []))
    common.publish(out, SECTION, section)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        print(json.dumps(one(sys.argv[2])))
        sys.exit(0)
    if sys.argv[1:2] == ["--parts"]:
        print(json.dumps(parts(sys.argv[2])))
        sys.exit(0)
    sys.exit(main())
