"""First-GET benchmark: the backend lane's first GET after row commits, assembled from all rows and spliced
from an earlier version's cached bytes, beside the raw GET of a state of the same size, each against a
baseline checkout served in the same run.

Run from the repository root:

    .venv/bin/python -m bench.first_get_bench --sizes 50000,200000 --baseline /work/main
    .venv/bin/python -m bench.first_get_bench --sizes 2000 --reps 1          # a smoke run, no baseline

For each size and each tree (this checkout, then ``--baseline``) it builds the state with
``bench.states.counted_state``, makes a scratch database (``bench.backend_bench.Harness``), serves the tree
with gunicorn in its own process (``bench.body_memory_bench.start_server``: 1 worker, 4 threads) and times,
over HTTP with one keep-alive session: the raw GET of the POSTed head (the floor); 12 one-instance commits
(``bench.commit_bench.commit_cycle``) and the first GET after them, **assembled from all rows** (the head's
base is the POSTed version, whose bytes are Terraform's layout and never a base); 12 more commits and the
first GET after them, **spliced** from the bytes the previous GET cached; the wall time until that
version's bytes are stored (polled in the database); and the GET after that (on the same connection, so
it waits for a cache write still running). The server worker's peak RSS over its RSS just before, and
its CPU time (``/proc``), are taken from the start of each first GET until its bytes are stored. Every
body is checked (serial, instance count, the changed values, and the spliced bytes equal to a later
GET's); a wrong one stops the run with exit status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg
import requests

from bench import common
from bench.backend_bench import Harness
from bench.body_memory_bench import Sampler, Server, _status, start_server, stop_server
from bench.commit_bench import STATE, commit_cycle
from bench.common import BenchError, log, table
from bench.states import counted_state

COMMITS = 12
perf = time.perf_counter


@dataclass
class Run:
    tree: str
    instances: int
    body_bytes: int = 0
    raw_get: float = 0.0
    rows: FirstGet | None = None  # assembled from all rows
    spliced: FirstGet | None = None  # spliced from the bytes the first cached
    cached_get: float = 0.0
    load: str = ""
    base_after: float | None = None  # with --settle: seconds from the POST's answer until its splice base is stored


@dataclass
class FirstGet:
    body: bytes
    seconds: float  # until the reader has the body
    stored: float  # until the bytes are stored
    cpu: float  # the server worker's CPU seconds meanwhile
    rss_before: int
    rss_peak: int


def _get(session: requests.Session, url: str) -> tuple[float, bytes]:
    started = perf()
    resp = session.get(url, timeout=3600)
    content = resp.content
    elapsed = perf() - started
    if resp.status_code != 200:
        raise BenchError(f"GET {url} answered {resp.status_code}: {content[:300]!r}")
    return elapsed, content


def _cpu(pid: int) -> float:
    """The process's user + system CPU seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _stored_after(database_url: str, serial: int, started: float) -> float:
    """Seconds from ``started`` until the version at ``serial`` has bytes stored."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        while True:
            row = conn.execute("SELECT raw_state IS NOT NULL FROM state_versions WHERE serial = %s",
                               (serial,)).fetchone()
            if row is not None and row[0]:
                return perf() - started
            if perf() - started > 3600:
                raise BenchError(f"serial {serial} was not cached within an hour")
            time.sleep(0.01)


def _base_after(database_url: str, started: float, limit: float) -> float | None:
    """Seconds from ``started`` until the POSTed version's splice base is stored; None when none is stored
    within ``limit`` seconds (a tree that builds none)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        while perf() - started < limit:
            if conn.execute("SELECT to_regclass('state_version_bases') IS NOT NULL").fetchone() == (True,) and \
                    conn.execute("SELECT 1 FROM state_version_bases").fetchone() is not None:
                return perf() - started
            time.sleep(0.05)
    return None


def _commits(session: requests.Session, base: str, n: int, values: dict[int, str], serial: int, label: str,
             step: int, offset: int) -> int:
    """COMMITS one-instance commits, recorded in ``values``; the new head serial."""
    for k in range(COMMITS):
        index = (k * step + offset) % n
        serial, _ = commit_cycle(session, base, index, f"{label}-{k}", serial)
        values[index] = f"{label}-{k}"
    return serial


def _first_get(session: requests.Session, server: Server, url: str, database_url: str, serial: int) -> FirstGet:
    before, cpu = _status(server.worker, "VmRSS"), _cpu(server.worker)
    with Sampler(server.worker) as peak:
        started = perf()
        seconds, body = _get(session, url)
        stored = _stored_after(database_url, serial, started)
    return FirstGet(body, seconds, stored, _cpu(server.worker) - cpu, before, peak.peak)


def _check(body: bytes, serial: int, n: int, values: dict[int, str]) -> None:
    doc = json.loads(body)
    instances = doc["resources"][0]["instances"]
    if doc["serial"] != serial or len(instances) != n:
        raise BenchError(f"a first GET returned serial {doc['serial']} with {len(instances)} instances")
    for index, value in values.items():
        if instances[index]["attributes"]["input"]["value"] != value:
            raise BenchError(f"a first GET lost the commit of item[{index}]")


def measure(database_url: str, n: int, tree: Path | None, settle: float = 0.0) -> Run:
    res = Run(tree="this checkout" if tree is None else str(tree), instances=n, load=common.load_average())
    body = counted_state(1, n)
    res.body_bytes = len(body)
    with Harness(database_url) as h:
        server = start_server(h.url, max_large_bodies=2, large_body_bytes=8 * 1024 * 1024, tree=tree)
        try:
            session = requests.Session()
            url = f"{server.url}/v1/states/{STATE}"
            posted = session.post(url, data=body, headers={"Content-Type": "application/json"}, timeout=3600)
            if posted.status_code != 200:
                raise BenchError(f"POST answered {posted.status_code}")
            if settle:
                res.base_after = _base_after(h.url, perf(), settle if tree is None else 0.0)
            res.raw_get, got = _get(session, url)
            if got != body:
                raise BenchError("GET of the POSTed head did not return its bytes")
            values: dict[int, str] = {}
            serial = _commits(session, server.url, n, values, 1, "rows", 7919, 0)
            rows = _first_get(session, server, url, h.url, serial)
            _check(rows.body, serial, n, values)
            serial = _commits(session, server.url, n, values, serial, "splice", 104729, 1)
            spliced = _first_get(session, server, url, h.url, serial)
            _check(spliced.body, serial, n, values)
            res.rows, res.spliced = rows, spliced
            second = spliced.body
            res.cached_get, again = _get(session, url)
            if again != second:
                raise BenchError("the cached GET differs from the spliced first GET")
            log(f"  {res.tree} {n}: raw {res.raw_get:.2f}s, after POST+commits {rows.seconds:.2f}s, "
                f"spliced {spliced.seconds:.2f}s (stored after {spliced.stored:.2f}s)")
        finally:
            stop_server(server)
    return res


def _rows(r: Run) -> list[str]:
    cells = [f"{r.instances:,}", r.tree, f"{r.body_bytes / 1e6:.0f} MB", f"{r.raw_get:.2f}"]
    for got in (r.rows, r.spliced):
        assert got is not None
        cells += [f"{got.seconds:.2f} ({got.seconds / r.raw_get:.1f}x)", f"{got.stored:.2f}", f"{got.cpu:.2f}",
                  f"{(got.rss_peak - got.rss_before) / r.body_bytes:.2f}x"]
    base = "-" if r.base_after is None else f"{r.base_after:.2f}"
    return [*cells, f"{r.cached_get:.2f}", base, r.load]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="50000,200000", help="instance counts, comma-separated")
    parser.add_argument("--baseline", type=Path, help="a checkout to measure the same way in the same run")
    parser.add_argument("--reps", type=int, default=1, help="runs per size and tree")
    parser.add_argument("--database-url", default=common.DEFAULT_DATABASE_URL)
    parser.add_argument("--settle", type=float, default=0.0,
                        help="after the POST, wait up to this many seconds for its splice base (this checkout "
                             "only) before the commits: the user's next read after a background build")
    args = parser.parse_args(argv)
    trees: list[Path | None] = [None] if args.baseline is None else [None, args.baseline]
    runs = []
    try:
        for n in (int(s) for s in args.sizes.split(",")):
            for _ in range(args.reps):
                for tree in trees:
                    runs.append(measure(args.database_url, n, tree, args.settle))
    except BenchError as exc:
        log(f"FAILED: {exc}")
        return 1
    print(table(["instances", "tree", "state", "raw GET s", "first GET after POST + 12 commits s (x raw)",
                 "stored after s", "server CPU s", "RSS growth", "first GET spliced s (x raw)", "stored after s",
                 "server CPU s", "RSS growth", "next GET s", "base stored after s", "load"], [_rows(r) for r in runs]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
