"""First GET after row-level commits: the streamed assembly against the raw GET floor, with server RSS.

For each size (50,000 and 200,000 instances by default) on a fresh database and a fresh gunicorn server
(one worker, four threads, in a child process so ``/proc`` shows the server alone):

- POST a state of that many instances (``bench.states.counted_state``) and GET it: the raw GET floor, the
  stored bytes of a Terraform write;
- make 12 one-instance commits through the engine lane, then GET: the first GET after commits, which
  assembles the head (and caches it): spliced from the POST's splice base once the server has built it, from
  all rows with ``--no-splice-base``; the server's RSS growth during it (``VmHWM`` after a reset);
- GET again: the cached GET;
- make one more one-instance commit, then GET: the first GET spliced from the cached bytes of the
  version before and the changed rows.

``--repeats N`` keeps the fastest of N timings of each GET (on a loaded machine the spread is wide).
``--baseline-tree PATH`` measures a second checkout (e.g. a worktree of main) the same way in the same
run, size by size, so the table shows both side by side.

Run: ``python -m bench.assembly_bench`` (``--quick``: 20,000 instances only, no document).
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path

import psycopg
import requests
from psycopg import sql

from app.store import assembly
from app.store.migrate import migrate
from bench import common
from bench.body_memory_bench import Sampler, _status, start_server, stop_server
from bench.states import counted_state

SECTION = "First GET after commits (streamed assembly)"
COMMITS = 12


def _commit(http: requests.Session, url: str, index: int, base: int) -> int:
    address = f"terraform_data.item[{index}]"
    run = http.post(f"{url}/v1/engine/states/big/runs", json={
        "actor": f"dev{index}", "base_serial": base, "reservations": [{"glob": address, "mode": "write"}]})
    run.raise_for_status()
    doc = json.loads(counted_state(base, 1))
    doc["resources"][0]["instances"][0]["index_key"] = index
    doc["resources"][0]["instances"][0]["attributes"]["input"]["value"] = f"commit-{index}"
    done = http.post(f"{url}/v1/engine/runs/{run.json()['run']['id']}/commit",
                     json={"holder": f"dev{index}", "state": doc, "slice_addresses": [address]})
    done.raise_for_status()
    return int(done.json()["commit"]["serial"])


def _timed_get(http: requests.Session, url: str, worker: int) -> tuple[float, int, int]:
    before = _status(worker, "VmRSS")
    with Sampler(worker) as sampler:
        started = time.perf_counter()
        got = http.get(url, timeout=900)
        elapsed = time.perf_counter() - started
    got.raise_for_status()
    return elapsed, sampler.peak - before, len(got.content)


# The head, whose cached assembly is removed again so the next GET assembles (or splices) it once more.
_HEAD = "SELECT id FROM state_versions ORDER BY serial DESC LIMIT 1"


def _best(http: requests.Session, url: str, worker: int, repeats: int,
          uncache: str | None = None) -> tuple[float, int, int]:
    """The fastest of ``repeats`` timed GETs (the largest RSS growth among them); ``uncache`` (a database
    URL) removes the head's cached bytes before each GET after the first, so each one assembles."""
    runs = []
    for i in range(repeats):
        if uncache is not None and i > 0:
            with psycopg.connect(uncache, autocommit=True) as conn:
                head = conn.execute(_HEAD).fetchone()
                if head is None or not assembly.forget_assembly(conn, head[0]):
                    raise SystemExit("the head is not an apply version with cached bytes to remove")
        runs.append(_timed_get(http, url, worker))
    return min(r[0] for r in runs), max(r[1] for r in runs), runs[0][2]


def measure(database_url: str, count: int, tree: Path | None = None, repeats: int = 1) -> dict[str, float]:
    dbname = f"kl_bench_asm_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    url = common.with_dbname(database_url, dbname)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    try:
        migrate(url)
        server = start_server(url, max_large_bodies=2, large_body_bytes=16 * 1024 * 1024, tree=tree)
        try:
            http = requests.Session()
            http.post(f"{server.url}/v1/states/big", data=counted_state(1, count), timeout=900).raise_for_status()
            head = f"{server.url}/v1/states/big"
            raw, raw_growth, size = _best(http, head, server.worker, repeats)
            serial = 1
            for i in range(COMMITS):
                serial = _commit(http, server.url, i, serial)
            first, first_growth, first_size = _best(http, head, server.worker, repeats, uncache=url)
            cached, cached_growth, _ = _best(http, head, server.worker, repeats)
            serial = _commit(http, server.url, COMMITS, serial)
            spliced, spliced_growth, _ = _best(http, head, server.worker, repeats, uncache=url)
        finally:
            stop_server(server)
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))
    return {"count": count, "bytes": first_size, "raw": raw, "raw_growth": raw_growth, "first": first,
            "first_growth": first_growth, "cached": cached, "cached_growth": cached_growth, "raw_bytes": size,
            "spliced": spliced, "spliced_growth": spliced_growth}


def main(argv: list[str] | None = None) -> int:
    p = common.bench_parser("assembly_bench", __doc__ or "", section=SECTION,
                            quick_help="20,000 instances only; writes no document unless --out is given")
    p.add_argument("--sizes", default="50000,200000", help="instance counts, comma-separated")
    p.add_argument("--baseline-tree", type=Path, default=None,
                   help="another checkout to measure the same way in the same run (its server runs its code)")
    p.add_argument("--repeats", type=int, default=1,
                   help="time each GET this many times and keep the fastest (the first and the spliced GET "
                        "assemble again each time: the bench removes the head's cached bytes in between)")
    p.add_argument("--no-splice-base", action="store_true",
                   help="servers build no splice base after a large POST (KL_SPLICE_BASE_BYTES=0), so the first "
                        "GET after commits is assembled from all rows rather than spliced from the POST's base")
    args = p.parse_args(argv)
    out, command = common.start_run(args, "assembly_bench", argv)
    if args.no_splice_base:
        os.environ["KL_SPLICE_BASE_BYTES"] = "0"  # the servers inherit the environment
    sizes = [20_000] if args.quick else [int(s) for s in args.sizes.split(",")]
    load_before = common.load_average()
    results = []
    trees = [None] if args.baseline_tree is None else [args.baseline_tree.resolve(), None]
    for count in sizes:
        for tree in trees:
            r = measure(args.database_url, count, tree, args.repeats)
            label = "this checkout" if tree is None else f"baseline {tree}"
            print(json.dumps({"code": label, **r}), file=sys.stderr)
            results.append((label, r))
    rows = [[label, f"{int(r['count']):,}", f"{r['bytes'] / 1e6:.0f} MB", f"{r['raw']:.2f} s",
             f"{r['first']:.2f} s", f"{r['first'] / r['raw']:.2f}x", f"{r['cached']:.2f} s",
             f"{r['first_growth'] / 1e6:.0f} MB", f"{r['first_growth'] / r['bytes']:.2f}x", f"{r['spliced']:.2f} s",
             f"{r['spliced'] / r['raw']:.2f}x",
             f"{r['first'] / r['spliced']:.1f}x", f"{r['spliced_growth'] / 1e6:.0f} MB"] for label, r in results]
    section = "\n".join([
        f"Command: `{command}`. Load average before: {load_before}; after: {common.load_average()}.", "",
        common.table(["code", "instances", "state", "raw GET (floor)", f"first GET after {COMMITS} commits", "ratio",
                      "cached GET", "server RSS growth, first GET", "growth / state",
                      "first GET after 1 more commit (spliced)", "spliced / raw", "from rows / spliced",
                      "server RSS growth, spliced"], rows), "",
        "The first GET assembles the head from its rows as a stream (server-side cursor, pieces written to the "
        "response and to the cache as they come); targets: at most 2x the raw GET, RSS growth at most 1.5x "
        "the state. The spliced GET keeps the cached bytes of the version before and re-encodes only the changed "
        "instance; it holds those bytes (about the state's size) while it writes.",
    ])
    common.publish(out, SECTION, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
