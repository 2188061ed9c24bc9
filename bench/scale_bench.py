"""Scale benchmark: the backend lane's whole-state and row-level paths on states of 50,000 to 500,000
instances, each beside its physical floor measured in the same run.

Run from the repository root:

    .venv/bin/python -m bench.scale_bench                          # 50k, 200k and 500k; rewrites its section
    .venv/bin/python -m bench.scale_bench --sizes 50000,200000     # chosen sizes
    .venv/bin/python -m bench.scale_bench --sizes 50000,200000 --skip-vanilla   # without vanilla Terraform
    .venv/bin/python -m bench.scale_bench --vanilla-timeout 30     # give vanilla plans 30 minutes each
    .venv/bin/python -m bench.scale_bench --sizes 500 --skip-vanilla --reps 1 --out /tmp/s.md   # a smoke run
    .venv/bin/python -m bench.scale_bench --sizes 200000 --http-only --out /tmp/s.md   # the HTTP rows only

For each size it builds the state with the project's generator (``bench.states.counted_state``: one
``terraform_data``-shaped resource with N instances), creates a scratch database (``bench.backend_bench``'s
``Harness``), serves the app with gunicorn in its own process (``bench.body_memory_bench.start_server``, one
worker) and samples that worker's RSS from ``/proc`` (``bench.body_memory_bench.Sampler``). It times, over
HTTP: the first whole-state POST (every row new), a POST that changes one instance, three GETs of the head
(its raw bytes are stored: the raw-GET floor is their median), 12 one-instance row-level commits through the
engine lane (``bench.commit_bench.commit_cycle``; the commit request is what is timed), the first GET after
them (the version is assembled from all rows: the POSTed version is never a splice base), taken three times
on that version with its cached bytes removed in the database before each repeat (the table gives the
median), the GET after that (cached), and, after 12 more commits, the first GET spliced from those cached
bytes. That server builds no splice bases (``KL_SPLICE_BASE_BYTES=0``); a second one, which builds one
after every POST, then takes a one-change POST, waits until its version's splice base is stored (timing the
wait from the POST's answer), and times the first GET after 12 commits over it, spliced from that base. The
POST floor is ``json.loads`` + ``hashlib.sha256`` of the same body in the benchmark process, best of 3.

Before each timed POST and GET after the first POST it waits until the server is idle: until its
``/metrics`` gauge ``kilolock_background_pending`` (this one worker's queues: the upkeep thread's statistics
refresh, pending-list fold and changed attribute names after a bulk write, and the splice base builder) reads
0 for every queue. A write's background work is then never timed as part of the next read or write; the
waits are logged, not reported (they are the upkeep's time, not a client's).

Then, on the shape of ``bench.filescoped_bench`` (N ``terraform_data`` resources of one instance, 100 per
file, served by the in-process ``Harness``) and with its code: ``kl plan -f`` of one file with 100 edited
resources, cold and warm parse cache (``filescoped_bench.SizeBench``); a one-instance ``kl apply -f``
(``apply_flat_bench.measure_apply``); and, unless ``--skip-vanilla``, vanilla ``terraform plan
-refresh=false`` over the whole configuration, killed past ``--vanilla-timeout`` minutes (reported as not
finished). Every answer is checked (status, rows, bytes, planned addresses, serials); a wrong one stops the
run with exit status 1 and writes nothing. The report shows each measure beside its floor or peer, the
ratio, the target and whether it is met.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import requests

from app.store import assembly
from bench import common
from bench.apply_flat_bench import install_request_times, measure_apply
from bench.backend_bench import Harness
from bench.body_memory_bench import Sampler, Server, _status, start_server, stop_server
from bench.commit_bench import STATE, commit_cycle
from bench.common import BenchError, log, table
from bench.filescoped_bench import PER_FILE, VENV_BIN, SizeBench, TimedOut, run, state_body
from bench.states import counted_state

SECTION = "## States of 50,000 to 500,000 instances"
COMMITS = 12
DEFAULT_SIZES = "50000,200000,500000"
DEFAULT_VANILLA_MINUTES = 20.0
# The targets each measure is judged against (Kilolock / its floor or peer, at most).
POST_TARGET = 2.5            # whole-state POST / (json.loads + sha256 of the body)
FIRST_GET_TARGET = 2.0       # first GET after row commits / raw GET of the same state
FIRST_GET_RSS_TARGET = 1.5   # server RSS growth during the first GET / the state's size
APPLY_GROWTH_TARGET = 1.25   # kl apply -f at the largest size / at the smallest (50,000) size
GET_SAMPLES = 3  # raw GETs, and first GETs from all rows, per size: the table gives their medians
perf = time.perf_counter


@dataclass
class SizeResult:
    instances: int
    body_bytes: int = 0
    floor: float = 0.0
    first_post: float = 0.0
    change_post: float = 0.0
    raw_get: float = 0.0  # the median of raw_gets
    raw_gets: list[float] = field(default_factory=list)
    commits: list[float] = field(default_factory=list)
    first_get: float = 0.0  # the median of first_gets
    first_gets: list[float] = field(default_factory=list)
    cached_get: float = 0.0
    spliced_get: float = 0.0
    base_stored: float = 0.0  # seconds from a POST's answer to its version's splice base in the database
    based_get: float = 0.0    # the first GET after 12 commits over that POSTed version, spliced from its base
    rss_idle: int = 0
    rss_post: int = 0
    rss_before_get: int = 0  # the worker just before the first GET: what the POSTs and commits left behind
    rss_first_get: int = 0
    load: str = ""
    wide_bytes: int = 0      # the same count of instances as one resource each (bench.filescoped_bench)
    wide_floor: float = 0.0
    wide_first_post: float = 0.0
    wide_change_post: float = 0.0
    # kl plan -f / kl apply -f / vanilla plan on the wide shape (bench.filescoped_bench)
    plan_cold: list[float] = field(default_factory=list)
    plan_warm: list[float] = field(default_factory=list)
    apply: list[float] = field(default_factory=list)
    vanilla: float | None = None           # seconds; None: not run, or did not finish (vanilla_note says which)
    vanilla_note: str = ""
    slice_load: str = ""
    idle_waits: list[float] = field(default_factory=list)  # seconds each wait for the server's idle upkeep took


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
        # The first sequence with no splice bases, so its first GET is the assembly from all rows.
        server = _server(h.url, splice_bases=False)
        try:
            session = requests.Session()
            url = f"{server.url}/v1/states/{STATE}"
            res.rss_idle = _status(server.worker, "VmRSS")
            with Sampler(server.worker) as peak:
                res.first_post, _ = timed_request(session, "POST", url, body=body)
            res.rss_post = peak.peak
            idle(server, session, res)
            res.change_post, _ = timed_request(session, "POST", url, body=changed)
            idle(server, session, res)
            for _ in range(GET_SAMPLES):
                seconds, got = timed_request(session, "GET", url)
                if got != changed:
                    raise BenchError("GET of the POSTed head did not return its bytes")
                res.raw_gets.append(seconds)
            res.raw_get = statistics.median(res.raw_gets)
            serial = 2
            for k in range(COMMITS):
                serial, seconds = commit_cycle(session, server.url, (k * 7919) % n, f"scale-{k}", serial)
                res.commits.append(seconds)
            idle(server, session, res)
            uncached = _VersionCache(h.url, serial)
            res.rss_before_get = _status(server.worker, "VmRSS")
            with Sampler(server.worker) as peak:
                seconds, first = timed_request(session, "GET", url)
            res.rss_first_get = peak.peak
            res.first_gets.append(seconds)
            idle(server, session, res)
            for _ in range(GET_SAMPLES - 1):  # the same first read again, its cached bytes removed before it
                uncached.clear()
                seconds, again = timed_request(session, "GET", url)
                if again != first:
                    raise BenchError("a repeated first GET from all rows gave other bytes")
                res.first_gets.append(seconds)
                idle(server, session, res)
            res.first_get = statistics.median(res.first_gets)
            res.cached_get, again = timed_request(session, "GET", url)
            doc = json.loads(first)
            if first != again or doc["serial"] != serial or len(doc["resources"][0]["instances"]) != n:
                raise BenchError("the GETs after the commits do not agree with the commits")
            for k in range(COMMITS):
                serial, _ = commit_cycle(session, server.url, (k * 104729 + 1) % n, f"splice-{k}", serial)
            idle(server, session, res)
            res.spliced_get, spliced = timed_request(session, "GET", url)
            doc = json.loads(spliced)
            if doc["serial"] != serial or len(doc["resources"][0]["instances"]) != n:
                raise BenchError("the spliced GET does not agree with the commits")
            wide_posts(session, server.url, res)
            log(f"  {n}: first POST {res.first_post:.2f}s, one-change POST {res.change_post:.2f}s, "
                f"first GET {res.first_get:.2f}s (raw {res.raw_get:.2f}s); waited for the server's upkeep "
                f"{', '.join(f'{w:.1f}s' for w in res.idle_waits)}")
        finally:
            stop_server(server)
        server = _server(h.url, splice_bases=True)
        try:
            based_get(h.url, requests.Session(), f"{server.url}/v1/states/{STATE}", server.url, res, serial)
            log(f"  {n}: splice base stored {res.base_stored:.2f}s after the POST, "
                f"first GET over it {res.based_get:.2f}s")
        finally:
            stop_server(server)
    return res


class _VersionCache:
    """One apply version whose cached bytes the bench removes again (``assembly.forget_assembly``), so the
    next GET is that version's first read from all rows again (no other apply version below it has bytes
    cached, so no splice base exists)."""

    def __init__(self, database_url: str, serial: int) -> None:
        self._url = database_url
        with psycopg.connect(database_url, autocommit=True) as conn:
            row = conn.execute(_UNCACHED_VERSION, (STATE, serial)).fetchone()
        if row is None or not row[1]:
            raise BenchError(f"serial {serial} is not an uncached apply version")
        self._id = row[0]

    def clear(self) -> None:
        with psycopg.connect(self._url, autocommit=True) as conn:
            if not assembly.forget_assembly(conn, self._id):
                raise BenchError("the apply version's cached bytes could not be removed")


_UNCACHED_VERSION = """
SELECT v.id, v.raw_state IS NULL AND v.source = 'apply'
FROM state_versions v JOIN states s ON s.id = v.state_id WHERE s.name = %s AND v.serial = %s
"""


def idle(server: Server, session: requests.Session, res: SizeResult) -> None:
    """Wait until ``server`` has no upkeep or splice base build queued or running (``/metrics``'
    ``kilolock_background_pending``), so the timed request that follows runs alone."""
    res.idle_waits.append(common.wait_until_idle(server.url, session))


def _server(database_url: str, *, splice_bases: bool) -> Server:
    """The bench's server; ``splice_bases`` False switches off the splice base built after a large POST."""
    saved = os.environ.get("KL_SPLICE_BASE_BYTES")
    os.environ["KL_SPLICE_BASE_BYTES"] = "1" if splice_bases else "0"  # 1: every POST, whatever the size
    try:
        return start_server(database_url, max_large_bodies=2, large_body_bytes=8 * 1024 * 1024)
    finally:
        if saved is None:
            del os.environ["KL_SPLICE_BASE_BYTES"]
        else:
            os.environ["KL_SPLICE_BASE_BYTES"] = saved


_BASE_OF_SERIAL = """
SELECT 1 FROM state_version_bases b JOIN state_versions v ON v.id = b.version_id
JOIN states s ON s.id = v.state_id WHERE s.name = %s AND v.serial = %s
"""


def based_get(database_url: str, session: requests.Session, url: str, base_url: str, res: SizeResult,
              serial: int) -> None:
    """A one-change POST at the next serial, the wait until its splice base is stored, 12 commits, and the
    first GET after them (spliced from that base): what a reader gets when the commits come after the build."""
    n = res.instances
    serial += 1
    posted = perf()
    timed_request(session, "POST", url, body=counted_state(serial, n, changed=n // 3))
    deadline = time.monotonic() + 1800
    with psycopg.connect(database_url, autocommit=True) as conn:
        while conn.execute(_BASE_OF_SERIAL, (STATE, serial)).fetchone() is None:
            if time.monotonic() > deadline:
                raise BenchError(f"no splice base for serial {serial} within 30 minutes")
            time.sleep(0.1)
    res.base_stored = perf() - posted
    for k in range(COMMITS):
        serial, _ = commit_cycle(session, base_url, (k * 6007 + 3) % n, f"based-{k}", serial)
    res.idle_waits.append(common.wait_until_idle(base_url, session))
    res.based_get, got = timed_request(session, "GET", url)
    doc = json.loads(got)
    if doc["serial"] != serial or len(doc["resources"][0]["instances"]) != n:
        raise BenchError("the GET spliced from the POSTed version's base does not agree with the commits")


def measure_slices(database_url: str, res: SizeResult, reps: int, vanilla_timeout: float | None) -> None:
    """``kl plan -f`` (cold and warm) and ``kl apply -f`` of one file, and the time-boxed vanilla plan, on a state
    of ``res.instances`` resources of one instance, 100 per file."""
    files = max(1, res.instances // PER_FILE)
    res.slice_load = common.load_average()
    work = Path(tempfile.mkdtemp(prefix="kl-bench-scale-"))
    try:
        # The one-resource-per-instance state outgrows the default body limit past about 400,000 instances.
        with Harness(database_url, max_body_bytes=1 << 30) as h:
            times = install_request_times(h)
            (work / "plan").mkdir()
            plan = SizeBench(h, times, work / "plan", files, log)
            plan.setup(check_vanilla=False)
            for _ in range(reps):
                res.plan_cold.append(plan.kl_plan(cold=True)[1].seconds)
                res.plan_warm.append(plan.kl_plan()[1].seconds)
            log(f"  {res.instances}: kl plan -f cold {statistics.median(res.plan_cold):.2f}s, "
                f"warm {statistics.median(res.plan_warm):.2f}s")
            (work / "apply").mkdir()
            res.apply = measure_apply(h, work / "apply", files, reps, times=times).seconds
            log(f"  {res.instances}: kl apply -f {statistics.median(res.apply):.2f}s")
            if vanilla_timeout is None:
                res.vanilla_note = "not run (--skip-vanilla)"
                return
            plan.init()
            try:
                res.vanilla = plan.vanilla(timeout=vanilla_timeout).seconds
                log(f"  {res.instances}: vanilla terraform plan {res.vanilla:.1f}s")
            except TimedOut:
                res.vanilla_note = f"did not finish within {vanilla_timeout / 60:g} min"
                log(f"  {res.instances}: vanilla terraform plan {res.vanilla_note}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


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
    res.idle_waits.append(common.wait_until_idle(base, session))
    res.wide_first_post, _ = timed_request(session, "POST", url, body=body)
    res.idle_waits.append(common.wait_until_idle(base, session))
    res.wide_change_post, _ = timed_request(session, "POST", url, body=changed)
    _, got = timed_request(session, "GET", url)
    if got != changed:
        raise BenchError("GET of the wide state did not return the POSTed bytes")


def s(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1e3:.0f} ms"


def mb(n: float) -> str:
    return f"{n / 1e6:,.0f} MB"


def spread(values: Sequence[float]) -> str:
    return f"{s(statistics.median(values))} ({s(min(values))}-{s(max(values))})" if values else "-"


def _median_of(median: float, samples: Sequence[float]) -> str:
    """A median with the samples it was taken of (more than one)."""
    if len(samples) < 2:
        return s(median)
    return f"{s(median)} (median of {', '.join(s(x) for x in samples)})"


def ratio(x: float) -> str:
    return f"{x:.2f}x" if x >= 0.1 else f"1/{1 / x:.0f}"


def verdict(value: float, target: float) -> str:
    return f"<= {target:g}x: {'met' if value <= target else 'MISSED'}"


def size_rows(r: SizeResult) -> list[list[str]]:
    """One size: each measure, its floor or peer, the ratio of the two, and the target if there is one."""
    rows: list[list[str]] = []
    med = statistics.median
    vanilla = s(r.vanilla) if r.vanilla is not None else r.vanilla_note
    for label, runs in (("`kl plan -f` one file (100 resources edited), warm parse cache", r.plan_warm),
                        ("`kl plan -f` one file, cold parse cache", r.plan_cold)):
        rows.append([label, spread(runs), f"vanilla `terraform plan -refresh=false`: {vanilla}",
                     ratio(med(runs) / r.vanilla) if r.vanilla and runs else "-", "-"])
    rows.append([f"one-instance commit at the store (median of {COMMITS})", s(med(r.commits)), "-", "-", "-"])
    rows.append(["`kl apply -f` one instance", spread(r.apply), "-", "-", "see below"])
    posts = (("whole-state POST, every row new", r.first_post, r.floor, r.body_bytes),
             ("whole-state POST, one instance changed", r.change_post, r.floor, r.body_bytes),
             ("whole-state POST, N resources, every row new", r.wide_first_post, r.wide_floor, r.wide_bytes),
             ("whole-state POST, N resources, one changed", r.wide_change_post, r.wide_floor, r.wide_bytes))
    for label, seconds, floor, size in posts:
        rows.append([f"{label} ({mb(size)})", s(seconds), f"`json.loads` + sha256 of the body: {s(floor)}",
                     ratio(seconds / floor), verdict(seconds / floor, POST_TARGET)])
    rows.append([f"**first GET after {COMMITS} commits** (assembled from rows)", _median_of(r.first_get, r.first_gets),
                 f"raw GET of the stored bytes: {_median_of(r.raw_get, r.raw_gets)}", ratio(r.first_get / r.raw_get),
                 verdict(r.first_get / r.raw_get, FIRST_GET_TARGET)])
    rows.append(["GET after that (cached; waits for the cache write on the same connection)", s(r.cached_get),
                 f"raw GET: {s(r.raw_get)}", ratio(r.cached_get / r.raw_get), "-"])
    if r.spliced_get:
        rows.append([f"first GET after {COMMITS} more commits (spliced from the cached bytes)", s(r.spliced_get),
                     f"raw GET: {s(r.raw_get)}", ratio(r.spliced_get / r.raw_get),
                     verdict(r.spliced_get / r.raw_get, FIRST_GET_TARGET)])
    if r.based_get:
        rows.append([f"first GET after a one-change POST, its splice base ({s(r.base_stored)} after the POST) and "
                     f"{COMMITS} commits", s(r.based_get), f"raw GET: {s(r.raw_get)}",
                     ratio(r.based_get / r.raw_get), verdict(r.based_get / r.raw_get, FIRST_GET_TARGET)])
    own = (r.rss_first_get - r.rss_before_get) / r.body_bytes
    rows.append(["server peak RSS during the first GET, growth over the worker just before it",
                 f"{mb(r.rss_first_get)} (+{mb(r.rss_first_get - r.rss_before_get)})",
                 f"the state: {mb(r.body_bytes)} (worker before the GET {mb(r.rss_before_get)})",
                 f"{own:.2f}x growth", verdict(own, FIRST_GET_RSS_TARGET)])
    growth = (r.rss_first_get - r.rss_idle) / r.body_bytes
    rows.append(["server peak RSS during the first GET, growth over the idle worker before the first POST "
                 "(includes what the POSTs and commits left)",
                 f"{mb(r.rss_first_get)} (+{mb(r.rss_first_get - r.rss_idle)})",
                 f"the state: {mb(r.body_bytes)} (idle worker {mb(r.rss_idle)})", f"{growth:.2f}x growth", "-"])
    growth = (r.rss_post - r.rss_idle) / r.body_bytes
    rows.append(["server peak RSS during the first POST", f"{mb(r.rss_post)} (+{mb(r.rss_post - r.rss_idle)})",
                 f"the state: {mb(r.body_bytes)}", f"{growth:.1f}x growth", "-"])
    return rows


def apply_growth(results: Sequence[SizeResult]) -> list[str]:
    """The median one-instance ``kl apply -f`` at each larger size against the smallest size of the run."""
    small = results[0]
    lines = []
    for r in results[1:] if small.apply else ():
        if not r.apply:
            continue
        g = statistics.median(r.apply) / statistics.median(small.apply)
        lines.append(f"- `kl apply -f` one instance, {r.instances:,} / {small.instances:,} instances: "
                     f"{statistics.median(r.apply):.2f} s / {statistics.median(small.apply):.2f} s = {g:.2f}x "
                     f"(target {verdict(g, APPLY_GROWTH_TARGET)}).")
    return lines


def targets(results: Sequence[SizeResult]) -> list[str]:
    """Each target, at each size: met or missed."""
    lines = []
    for r in results:
        missed = [row[0].replace("**", "") for row in size_rows(r) if row[4].endswith("MISSED")]
        lines.append(f"- {r.instances:,} instances: " + (f"missed: {'; '.join(missed)}." if missed
                                                          else "every target met."))
    return lines + apply_growth(results)


def render(command: str, machine: list[tuple[str, str]], results: Sequence[SizeResult]) -> str:
    parts = [
        SECTION, "",
        f"Produced by `bench/scale_bench.py` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} "
        "(see `bench/README.md`). The HTTP rows: gunicorn with one worker over a scratch database, driven over "
        "HTTP; the state is one `terraform_data`-shaped resource with N instances (the N-resources POST rows: "
        "N resources of one instance each). The `kl plan -f`, `kl apply -f` and vanilla rows: N "
        "`terraform_data` resources, 100 per file, served in process (`bench/filescoped_bench.py`'s shape). "
        "Floors and peers are measured in the same run on the same body; ratio = Kilolock / floor. The first "
        "GET after the commits follows a POSTed version, whose bytes (Terraform's layout) are never a splice "
        "base: it is the assembly from all rows; the spliced row is the first GET after more commits over the "
        "bytes that GET cached. Each GET's cache write follows its body. The raw GET is taken "
        f"{GET_SAMPLES} times and the first GET from all rows {GET_SAMPLES} times on the same version (its cached "
        "bytes removed in the database before each repeat); the ratio is of their medians. The other rows are "
        "one sample each.", "",
        "### Machine", "", table(["", "value"], [list(m) for m in machine]), "",
        "### Command", "", "```", command, "```", "",
    ]
    for r in results:
        parts += [f"### {r.instances:,} instances ({mb(r.body_bytes)}; {mb(r.wide_bytes)} as N resources)", "",
                  f"Load average before the HTTP rows {r.load}"
                  + (f"; before the `kl` rows {r.slice_load}." if r.slice_load else "."), "",
                  table(["measure", "Kilolock", "floor / peer", "ratio", "target"], size_rows(r)), ""]
    parts += ["### Targets", "", *targets(results), ""]
    return "\n".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    p = common.bench_parser("scale_bench", __doc__ or "", section=SECTION, json_help=None)
    p.add_argument("--sizes", default=DEFAULT_SIZES, help="instance counts, comma separated (default: %(default)s)")
    p.add_argument("--reps", type=int, default=3, help="kl plan -f and kl apply -f runs per size (default: 3)")
    p.add_argument("--vanilla-timeout", type=float, default=DEFAULT_VANILLA_MINUTES, metavar="MINUTES",
                   help="kill a vanilla terraform plan past this many minutes (default: %(default)g)")
    p.add_argument("--skip-vanilla", action="store_true", help="do not run vanilla terraform plan")
    p.add_argument("--http-only", action="store_true",
                   help="only the HTTP rows (POSTs, commits, GETs, RSS): no kl plan -f, kl apply -f or vanilla")
    args = p.parse_args(argv)
    vanilla_timeout = None if args.skip_vanilla else args.vanilla_timeout * 60
    out, command = common.start_run(args, "scale_bench", argv)
    sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    try:
        machine = common.machine_info(args.database_url)
        tf = run([str(VENV_BIN / "kl-terraform"), "version"], cwd=common.REPO, env=dict(os.environ)).output
        version = next((line for line in tf.splitlines() if line.startswith("Terraform v")), "unknown")
        machine.insert(4, ("Terraform", f"{version} (embedded kl-terraform)"))
        results = []
        for n in sizes:
            res = measure(args.database_url, n)
            if args.http_only:
                res.vanilla_note = "not run (--http-only)"
            else:
                measure_slices(args.database_url, res, args.reps, vanilla_timeout)
            results.append(res)
        machine.append(("Load average at end", common.load_average()))
    except BenchError as exc:
        log(f"scale_bench: {exc}")
        return 1
    except KeyboardInterrupt:
        return 130
    section = render(command, machine, results)
    common.publish(out, SECTION, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
