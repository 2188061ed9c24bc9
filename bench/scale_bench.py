"""Scale benchmark: the backend lane's whole-state and row-level paths on states of 50,000 to 500,000
instances, each beside its physical floor measured in the same run.

Run from the repository root:

    .venv/bin/python -m bench.scale_bench                          # 50k, 200k and 500k; rewrites its section
    .venv/bin/python -m bench.scale_bench --sizes 50000,200000     # chosen sizes
    .venv/bin/python -m bench.scale_bench --sizes 5000 --out /tmp/s.md   # a smoke run, written elsewhere

For each size it builds the state with the project's generator (``bench.states.counted_state``: one
``terraform_data``-shaped resource with N instances), creates a scratch database (``bench.backend_bench``'s
``Harness``), serves the app with gunicorn in its own process (``bench.body_memory_bench.start_server``, one
worker) and samples that worker's RSS from ``/proc`` (``bench.body_memory_bench.Sampler``). It times, over
HTTP: the first whole-state POST (every row new), a POST that changes one instance, a GET of the head (its
raw bytes are stored: the raw-GET floor), 12 one-instance row-level commits through the engine lane
(``bench.commit_bench.commit_cycle``; the commit request is what is timed), the first GET after them (the
version is assembled from rows) and the GET after that (cached). The POST floor is ``json.loads`` +
``hashlib.sha256`` of the same body in the benchmark process, best of 3. Every answer is checked (status,
rows, bytes); a wrong one stops the run with exit status 1 and writes nothing.
"""

from __future__ import annotations

import gc
import hashlib
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import requests

from bench import common
from bench.backend_bench import Harness
from bench.body_memory_bench import Sampler, _status, start_server, stop_server
from bench.commit_bench import STATE, commit_cycle
from bench.common import BenchError, log, table
from bench.filescoped_bench import PER_FILE, state_body
from bench.states import counted_state

SECTION = "## States of 50,000 to 500,000 instances"
COMMITS = 12
DEFAULT_SIZES = "50000,200000,500000"
perf = time.perf_counter


@dataclass
class SizeResult:
    instances: int
    body_bytes: int = 0
    floor: float = 0.0
    first_post: float = 0.0
    change_post: float = 0.0
    raw_get: float = 0.0
    commits: list[float] = field(default_factory=list)
    first_get: float = 0.0
    cached_get: float = 0.0
    rss_idle: int = 0
    rss_post: int = 0
    rss_first_get: int = 0
    load: str = ""
    wide_bytes: int = 0      # the same count of instances as one resource each (bench.filescoped_bench)
    wide_floor: float = 0.0
    wide_first_post: float = 0.0
    wide_change_post: float = 0.0


def best_of(runs: int, fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(runs):
        gc.collect()
        started = perf()
        fn()
        best = min(best, perf() - started)
    return best


def timed_request(session: requests.Session, method: str, url: str, *, body: bytes | None = None,
                  ) -> tuple[float, bytes]:
    headers = {"Content-Type": "application/json"} if body is not None else {}
    started = perf()
    resp = session.request(method, url, data=body, headers=headers, timeout=3600)
    content = resp.content
    elapsed = perf() - started
    if resp.status_code != 200:
        raise BenchError(f"{method} {url} answered {resp.status_code}: {content[:300]!r}")
    return elapsed, content


def measure(database_url: str, n: int) -> SizeResult:
    res = SizeResult(instances=n, load=common.load_average())
    body = counted_state(1, n)
    changed = counted_state(2, n, changed=n // 2)
    res.body_bytes = len(body)
    res.floor = best_of(3, lambda: (json.loads(body), hashlib.sha256(body).digest()))
    log(f"  {n}: {len(body) / 1e6:.0f} MB, floor {res.floor:.2f}s")
    with Harness(database_url) as h:
        server = start_server(h.url, max_large_bodies=2, large_body_bytes=8 * 1024 * 1024)
        try:
            session = requests.Session()
            url = f"{server.url}/v1/states/{STATE}"
            res.rss_idle = _status(server.worker, "VmRSS")
            with Sampler(server.worker) as peak:
                res.first_post, _ = timed_request(session, "POST", url, body=body)
            res.rss_post = peak.peak
            res.change_post, _ = timed_request(session, "POST", url, body=changed)
            res.raw_get, got = timed_request(session, "GET", url)
            if got != changed:
                raise BenchError("GET of the POSTed head did not return its bytes")
            serial = 2
            for k in range(COMMITS):
                serial, seconds = commit_cycle(session, server.url, (k * 7919) % n, f"scale-{k}", serial)
                res.commits.append(seconds)
            with Sampler(server.worker) as peak:
                res.first_get, first = timed_request(session, "GET", url)
            res.rss_first_get = peak.peak
            res.cached_get, again = timed_request(session, "GET", url)
            doc = json.loads(first)
            if first != again or doc["serial"] != serial or len(doc["resources"][0]["instances"]) != n:
                raise BenchError("the GETs after the commits do not agree with the commits")
            wide_posts(session, server.url, res)
            log(f"  {n}: first POST {res.first_post:.2f}s, one-change POST {res.change_post:.2f}s, "
                f"first GET {res.first_get:.2f}s (raw {res.raw_get:.2f}s)")
        finally:
            stop_server(server)
    return res


def wide_posts(session: requests.Session, base: str, res: SizeResult) -> None:
    """The two POSTs again on a state of as many resources of one instance each, the shape of
    ``bench.filescoped_bench`` (each resource's header is read per instance)."""
    body = state_body(max(1, res.instances // PER_FILE), seed=7)
    doc = json.loads(body)
    doc["serial"] = 2
    doc["resources"][len(doc["resources"]) // 2]["instances"][0]["attributes"]["input"]["value"] = "changed"
    changed = (json.dumps(doc, indent=2) + "\n").encode()
    del doc
    res.wide_bytes = len(body)
    res.wide_floor = best_of(3, lambda: (json.loads(body), hashlib.sha256(body).digest()))
    url = f"{base}/v1/states/scale-wide"
    res.wide_first_post, _ = timed_request(session, "POST", url, body=body)
    res.wide_change_post, _ = timed_request(session, "POST", url, body=changed)
    _, got = timed_request(session, "GET", url)
    if got != changed:
        raise BenchError("GET of the wide state did not return the POSTed bytes")


def s(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1e3:.0f} ms"


def render(command: str, machine: list[tuple[str, str]], results: Sequence[SizeResult]) -> str:
    mb = lambda b: f"{b / 1e6:,.0f} MB"  # noqa: E731
    rows: list[list[str]] = []
    header = ["measure", *(f"{r.instances:,} ({mb(r.body_bytes)})" for r in results)]

    def row(label: str, cell: Callable[[SizeResult], str]) -> None:
        rows.append([label, *(cell(r) for r in results)])

    row("floor: json.loads + sha256 of the body (best of 3)", lambda r: s(r.floor))
    row("whole-state POST, every row new", lambda r: f"{s(r.first_post)} ({r.first_post / r.floor:.1f}x floor)")
    row("whole-state POST, one instance changed",
        lambda r: f"{s(r.change_post)} ({r.change_post / r.floor:.1f}x floor)")
    row("N resources of one instance each: body", lambda r: mb(r.wide_bytes))
    row("  floor: json.loads + sha256", lambda r: s(r.wide_floor))
    row("  whole-state POST, every row new",
        lambda r: f"{s(r.wide_first_post)} ({r.wide_first_post / r.wide_floor:.1f}x floor)")
    row("  whole-state POST, one instance changed",
        lambda r: f"{s(r.wide_change_post)} ({r.wide_change_post / r.wide_floor:.1f}x floor)")
    row("one-instance commit at the store (median of 12)", lambda r: s(statistics.median(r.commits)))
    row("raw GET (stored bytes): the GET floor", lambda r: s(r.raw_get))
    row("first GET after 12 commits (assembled from rows)",
        lambda r: f"{s(r.first_get)} ({r.first_get / r.raw_get:.1f}x raw GET)")
    row("GET after that (cached)", lambda r: f"{s(r.cached_get)} ({r.cached_get / r.raw_get:.1f}x raw GET)")
    row("server RSS idle (worker)", lambda r: mb(r.rss_idle))
    row("server peak RSS during the first POST",
        lambda r: f"{mb(r.rss_post)} ({(r.rss_post - r.rss_idle) / r.body_bytes:.1f}x body growth)")
    row("server peak RSS during the first GET",
        lambda r: f"{mb(r.rss_first_get)} ({(r.rss_first_get - r.rss_idle) / r.body_bytes:.1f}x body growth)")
    row("load average before the size", lambda r: r.load)
    return "\n".join([
        SECTION, "",
        f"Produced by `bench/scale_bench.py` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} "
        "(see `bench/README.md`): gunicorn with one worker over a scratch database, driven over HTTP; the state "
        "is one `terraform_data`-shaped resource with N instances. Ratios are to floors measured in the same "
        "run on the same body.", "",
        "### Machine", "", table(["", "value"], [list(m) for m in machine]), "",
        "### Command", "", "```", command, "```", "",
        "### Results", "", table(header, rows), "",
        "Not measured by this script yet: `kl plan -f` and `kl apply -f` on one file of the state, and vanilla "
        "`terraform plan -refresh=false` over the whole configuration (`bench/filescoped_bench.py` measures "
        "the plans at its sizes).", "",
    ])


def main(argv: Sequence[str] | None = None) -> int:
    p = common.bench_parser("scale_bench", __doc__ or "", section=SECTION, json_help=None)
    p.add_argument("--sizes", default=DEFAULT_SIZES, help="instance counts, comma separated (default: %(default)s)")
    args = p.parse_args(argv)
    out, command = common.start_run(args, "scale_bench", argv)
    sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    try:
        machine = common.machine_info(args.database_url)
        results = [measure(args.database_url, n) for n in sizes]
        machine.append(("Load average at end", common.load_average()))
    except BenchError as exc:
        log(f"scale_bench: {exc}")
        return 1
    except KeyboardInterrupt:
        return 130
    section = render(command, machine, results)
    print(section)
    if out is not None:
        common.write_section(out, SECTION, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
