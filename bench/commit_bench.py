"""Row-level commit benchmark: what one commit costs as the state grows, how many commits a shared state takes
per second, what the first GET after many commits costs, and what an apply version stores.

Run from the repository root:

    .venv/bin/python -m bench.commit_bench                                  # full size, rewrites its section
    .venv/bin/python -m bench.commit_bench --quick                          # smoke test (~1 minute), prints only
    .venv/bin/python -m bench.commit_bench --baseline-tree /tmp/before      # also runs an older tree, side by side

The real server (``app.web.create_app`` on a threaded werkzeug server on a loopback port, over a scratch
database: ``bench.backend_bench.Harness``) serves the state; every request goes through HTTP. For each size
(1,000 / 10,000 / 50,000 instances of one counted ``terraform_data``), from an empty database:

(1) the state is created by one POST (what ``terraform apply`` does through the backend);
(2) one-instance commits, one after another: open a run reserving ``terraform_data.item[k]`` (write), then
    commit a slice changing only that instance. The commit request is timed at the client and, in the
    server thread, at the store (``app.store.commit.commit_run``) and from the moment the commit takes the
    state's row lock (the database's clock when ``commit.read_locked``'s pipeline was granted it; for older
    code, once ``runs.locked_live_run`` returns: any wait for the lock is not counted) until its
    transaction ends: what every other writer of the state waits for;
(3) the storage of those apply versions: the version row, its outputs and the resource rows it opened
    (``pg_column_size``, so after TOAST compression), against the state's size and its POSTed version's
    stored bytes.

At the largest size also:

(4) throughput: 16 committer processes, each with its own HTTP session and its own instances, open a run
    and commit in a loop; commits per second over the wall time of all cycles (run opening included);
(5) 50 more one-instance commits, then the first GET of the head (the code under test assembles it from
    the rows when no bytes are stored), a second GET, and how many apply versions hold bytes afterwards;
    against the in-process floor of reading such a state (``json.loads`` + ``sha256`` of the body) and
    a POST of the same state at the next serial.

Every GET must parse, carry the head's serial and every committed value. ``--baseline-tree DIR`` runs this
same script first inside DIR (an export of an older revision, say ``git archive main | tar -x -C DIR``),
in a subprocess with DIR first on the import path, and renders both runs side by side.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import requests

from bench import common
from bench.backend_bench import Harness
from bench.common import DEFAULT_OUT, BenchError, table
from bench.states import counted_state

SECTION = "## Row-level commits at scale"
STATE = "bench-commit"
perf = time.perf_counter


@dataclass(frozen=True)
class Sizes:
    instances: tuple[int, ...]
    commits: int         # one-after-another commits per size in (2)
    committers: int      # threads in (4)
    cycles_each: int     # commits per thread in (4)
    get_after: int       # commits before the GET in (5)


FULL = Sizes(instances=(1_000, 10_000, 50_000), commits=6, committers=16, cycles_each=6, get_after=50)
QUICK = Sizes(instances=(200, 1_000, 2_000), commits=3, committers=4, cycles_each=3, get_after=10)


# --- server-side timers -----------------------------------------------------------------------------

class StoreTimers:
    """Wraps ``commit_run`` in the server's modules, and the point where a commit holds the state's row lock:
    per commit, the store time and the time from taking the state's row lock to the end of the transaction.

    Code that reads under the lock in one pipeline (``commit.read_locked``) reports when the database granted
    the lock (``Locked.locked_at``, the server's clock); older code is timed from ``runs.locked_live_run``'s
    return."""

    def __init__(self) -> None:
        from app.store import commit, runs

        self._commit, self._runs = commit, runs
        self._orig_commit, self._orig_lock = commit.commit_run, runs.locked_live_run
        self._orig_read = getattr(commit, "read_locked", None)
        self._local = threading.local()
        self._mutex = threading.Lock()
        self.store: list[float] = []
        self.locked: list[float] = []
        local = self._local

        def locked_live_run(*args: Any, **kwargs: Any) -> Any:
            found = self._orig_lock(*args, **kwargs)
            local.locked_at = time.time()  # the state's row lock is taken (and waited for) in there
            return found

        def read_locked(*args: Any, **kwargs: Any) -> Any:
            assert self._orig_read is not None
            locked = self._orig_read(*args, **kwargs)
            local.locked_at = locked.locked_at.timestamp()
            return locked

        def commit_run(*args: Any, **kwargs: Any) -> Any:
            local.locked_at = None
            started = perf()
            try:
                return self._orig_commit(*args, **kwargs)
            finally:
                ended, ended_at = perf(), time.time()
                with self._mutex:
                    self.store.append(ended - started)
                    if local.locked_at is not None:
                        self.locked.append(max(ended_at - local.locked_at, 0.0))

        commit.commit_run = commit_run
        if self._orig_read is not None:
            commit.read_locked = read_locked
        else:
            runs.locked_live_run = locked_live_run

    def take(self) -> tuple[list[float], list[float]]:
        with self._mutex:
            store, locked = self.store, self.locked
            self.store, self.locked = [], []
        return store, locked

    def close(self) -> None:
        self._commit.commit_run, self._runs.locked_live_run = self._orig_commit, self._orig_lock
        if self._orig_read is not None:
            self._commit.read_locked = self._orig_read


# --- the state and commits --------------------------------------------------------------------------

def slice_doc(index: int, value: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(counted_state(1, 1))
    inst = doc["resources"][0]["instances"][0]
    inst["index_key"] = index
    inst["attributes"]["input"]["value"] = inst["attributes"]["output"]["value"] = value
    return doc


def commit_cycle(session: requests.Session, base: str, index: int, value: str, base_serial: int,
                 ) -> tuple[int, float]:
    """Open a run on item[index] and commit a new value; returns (serial, seconds of the commit request)."""
    address = f"terraform_data.item[{index}]"
    opened = session.post(f"{base}/v1/engine/states/{STATE}/runs", timeout=600, json={
        "actor": f"bench-{index}", "base_serial": base_serial, "reservations": [{"glob": address, "mode": "write"}]})
    if opened.status_code != 201:
        raise BenchError(f"opening a run on {address} answered {opened.status_code}: {opened.text[:300]}")
    run_id = opened.json()["run"]["id"]
    started = perf()
    done = session.post(f"{base}/v1/engine/runs/{run_id}/commit", timeout=600, json={
        "holder": f"bench-{index}", "state": slice_doc(index, value), "slice_addresses": [address]})
    elapsed = perf() - started
    if done.status_code != 200:
        # Release what the refused commit still holds, so the state's later writes are not refused for it.
        session.post(f"{base}/v1/engine/runs/{run_id}/abort", json={"reason": "benchmark commit refused"}, timeout=600)
        raise BenchError(f"committing {address} answered {done.status_code}: {done.text[:300]}")
    return int(done.json()["commit"]["serial"]), elapsed


def check_head(body: bytes, serial: int, expected: dict[int, str], count: int) -> None:
    doc = json.loads(body)
    if doc["serial"] != serial:
        raise BenchError(f"GET returned serial {doc['serial']}, expected {serial}")
    instances = doc["resources"][0]["instances"]
    if len(instances) != count:
        raise BenchError(f"GET returned {len(instances)} instances, expected {count}")
    by_key = {i.get("index_key"): i["attributes"]["input"]["value"] for i in instances}
    wrong = [k for k, v in expected.items() if by_key.get(k) != v]
    if wrong:
        raise BenchError(f"GET misses committed values at {wrong[:5]}")


@dataclass
class SizeResult:
    instances: int
    state_bytes: int
    post_seconds: float
    commit_client: list[float]
    commit_store: list[float]
    commit_locked: list[float]
    version_bytes: list[int]            # per apply version: version row + outputs + rows it opened
    posted_stored_bytes: int            # the POSTed version's raw_state as stored (compressed)


@dataclass
class LargeResult:
    instances: int
    committers: int
    cycles: int         # commits that landed
    refused: int        # cycles that failed (say, 503: no database connection free while others wait)
    wall: float
    throughput: float
    store_median: float
    locked_median: float
    locked_max: float
    get_commits: int
    first_get: float
    second_get: float
    versions_with_bytes: int
    apply_versions: int
    floor: float
    post_seconds: float


@dataclass
class Result:
    label: str
    sizes: list[SizeResult] = field(default_factory=list)
    large: LargeResult | None = None


_VERSION_STORAGE = """
SELECT v.serial,
       pg_column_size(v.*)
       + coalesce((SELECT sum(pg_column_size(o.*)) FROM outputs o WHERE o.state_version_id = v.id), 0)
       + coalesce((SELECT sum(pg_column_size(r.*)) FROM resources r
                   WHERE r.state_id = v.state_id AND r.create_serial = v.serial), 0)
FROM state_versions v JOIN states s ON s.id = v.state_id
WHERE s.name = %s AND v.source = 'apply' ORDER BY v.serial
"""
_POSTED_STORED = """
SELECT pg_column_size(v.raw_state) FROM state_versions v JOIN states s ON s.id = v.state_id
WHERE s.name = %s AND v.serial = 1
"""
_WITH_BYTES = """
SELECT count(*) FILTER (WHERE v.raw_state IS NOT NULL), count(*) FROM state_versions v
JOIN states s ON s.id = v.state_id WHERE s.name = %s AND v.source = 'apply'
"""


class Bench:
    def __init__(self, h: Harness, sz: Sizes, timers: StoreTimers, log: Callable[[str], None]) -> None:
        self.h, self.sz, self.timers, self.log = h, sz, timers, log
        self.expected: dict[int, str] = {}
        self.serial = 1

    def create(self, count: int) -> tuple[bytes, float]:
        self.h.reset()
        self.expected, self.serial = {}, 1
        body = counted_state(1, count)
        started = perf()
        self.h.request("POST", STATE, body=body)
        return body, perf() - started

    def one_after_another(self, count: int, n: int, offset: int) -> list[float]:
        times = []
        for k in range(n):
            index = (offset + k * 7919) % count
            value = f"c{self.serial + 1}"
            self.serial, elapsed = commit_cycle(self.h.session, self.h.base, index, value, self.serial)
            self.expected[index] = value
            times.append(elapsed)
        return times

    def size(self, count: int) -> SizeResult:
        body, post_seconds = self.create(count)
        self.timers.take()
        self.one_after_another(count, 1, 1)  # warm the code path, not counted
        self.timers.take()
        client = self.one_after_another(count, self.sz.commits, 3)
        store, locked = self.timers.take()
        storage = [int(b) for _, b in self.h.side.execute(_VERSION_STORAGE, (STATE,)).fetchall()]
        (posted,) = self.h.side.execute(_POSTED_STORED, (STATE,)).fetchone() or (0,)
        self.log(f"  {count:,} instances: commit median {med(client) * 1000:.0f} ms (store "
                 f"{med(store) * 1000:.0f} ms, row lock {med(locked) * 1000:.0f} ms), apply version "
                 f"{med(storage):,.0f} bytes")
        return SizeResult(count, len(body), post_seconds, client, store, locked, storage, int(posted or 0))

    def large(self, count: int) -> LargeResult:
        self.timers.take()
        # Committers are separate processes (as kl apply runs are), so their HTTP clients do not compete
        # with the server for this process's interpreter lock.
        ctx = multiprocessing.get_context("spawn")
        ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
        procs = [ctx.Process(target=committer_process, args=(
            self.h.base, count, t, self.sz.cycles_each, ready, results, go)) for t in range(self.sz.committers)]
        for proc in procs:
            proc.start()
        for _ in procs:
            ready.get(timeout=600)
        began = time.time()
        go.set()
        errors: list[str] = []
        done_serials: list[int] = []
        ended = began
        for _ in procs:
            landed, refused, finished = results.get(timeout=7200)
            for index, value, serial in landed:
                self.expected[index] = value
                done_serials.append(serial)
            errors.extend(refused)
            ended = max(ended, finished)
        for proc in procs:
            proc.join(timeout=60)
        wall = ended - began
        cycles = len(done_serials)
        if sorted(done_serials) != list(range(self.serial + 1, self.serial + 1 + cycles)):
            raise BenchError("concurrent commits did not land at consecutive serials")
        self.serial += cycles
        store, locked = self.timers.take()
        self.log(f"  {self.sz.committers} committers: {cycles / wall:.1f} commits/s, {len(errors)} refused "
                 f"(row lock median {med(locked) * 1000:.0f} ms, max {max(locked, default=0) * 1000:.0f} ms)")
        if errors:
            self.log(f"  first refusal: {errors[0][:300]}")

        self.one_after_another(count, self.sz.get_after, 11)
        started = perf()
        first = self.h.request("GET", STATE).body
        first_get = perf() - started
        started = perf()
        second = self.h.request("GET", STATE).body
        second_get = perf() - started
        if first != second:
            raise BenchError("two GETs of the same head returned different bytes")
        check_head(first, self.serial, self.expected, count)
        with_bytes, apply_versions = self.h.side.execute(_WITH_BYTES, (STATE,)).fetchone() or (0, 0)
        floor = min(timed(lambda: (json.loads(first), hashlib.sha256(first).digest())) for _ in range(3))
        # A refused cycle may have left its run holding its reservation (its abort refused as well): end every
        # run, so the POST below is not refused for them.
        self.h.side.execute("UPDATE apply_runs SET status = 'aborted' WHERE status IN ('reserved', 'running')")
        self.h.side.execute("DELETE FROM resource_reservations")
        doc = json.loads(first)
        doc["serial"] = self.serial + 1
        again = json.dumps(doc, indent=2).encode()
        started = perf()
        self.h.request("POST", STATE, body=again)
        post_seconds = perf() - started
        self.log(f"  GET after {self.sz.get_after} commits: first {first_get * 1000:.0f} ms, second "
                 f"{second_get * 1000:.0f} ms; {with_bytes} of {apply_versions} apply versions hold bytes")
        return LargeResult(count, self.sz.committers, cycles, len(errors), wall, cycles / wall, med(store),
                           med(locked), max(locked, default=0.0), self.sz.get_after, first_get, second_get,
                           int(with_bytes), int(apply_versions), floor, post_seconds)


def committer_process(base: str, count: int, t: int, cycles: int, ready: Any, results: Any, go: Any) -> None:
    """One concurrent committer: waits for the start, then opens and commits ``cycles`` runs on its own
    instances; reports (landed (index, value, serial) triples, refusals, wall-clock end)."""
    session = requests.Session()
    landed: list[tuple[int, str, int]] = []
    refused: list[str] = []
    ready.put(t)
    go.wait()
    for c in range(cycles):
        index = (count // 2 + t * cycles + c) % count
        value = f"t{t}-{c}"
        try:
            serial, _ = commit_cycle(session, base, index, value, 1)
        except BenchError as exc:  # counted and reported; the others go on
            refused.append(str(exc))
            continue
        landed.append((index, value, serial))
    session.close()
    results.put((landed, refused, time.time()))


def timed(fn: Callable[[], object]) -> float:
    started = perf()
    fn()
    return perf() - started


def med(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def run(args: argparse.Namespace, sz: Sizes, label: str, log: Callable[[str], None]) -> Result:
    result = Result(label=label)
    timers = StoreTimers()
    try:
        with Harness(args.database_url) as h:
            log(f"{label}: scratch database {h.dbname}, server {h.base}")
            b = Bench(h, sz, timers, log)
            for count in sz.instances:
                result.sizes.append(b.size(count))
            result.large = b.large(sz.instances[-1])
    finally:
        timers.close()
    return result


# --- report -----------------------------------------------------------------------------------------

def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms" if seconds >= 0.01 else f"{seconds * 1000:.1f} ms"


def size_table(results: Sequence[Result]) -> str:
    rows = []
    for res in results:
        small = res.sizes[0]
        for sr in res.sizes:
            rows.append([res.label, f"{sr.instances:,}", ms(med(sr.commit_client)), ms(med(sr.commit_store)),
                         ms(med(sr.commit_locked)), f"{med(sr.commit_client) / med(small.commit_client):.2f}x"])
    return table(["code", "instances", "commit (client, median)", "at the store", "state row lock held",
                  "vs the smallest"], rows)


def storage_table(results: Sequence[Result]) -> str:
    rows = []
    for res in results:
        for sr in res.sizes:
            per = med([float(b) for b in sr.version_bytes])
            rows.append([res.label, f"{sr.instances:,}", f"{sr.state_bytes:,}", f"{sr.posted_stored_bytes:,}",
                         f"{per:,.0f}", f"{per / sr.state_bytes * 100:.3f}%"])
    return table(["code", "instances", "state (bytes)", "POSTed version stored", "one-instance apply version",
                  "of the state"], rows)


def large_table(results: Sequence[Result]) -> str:
    rows = []
    for res in results:
        lr = res.large
        assert lr is not None
        tried = lr.cycles + lr.refused
        rows.append([res.label, f"{lr.committers} x {tried // lr.committers}", str(lr.cycles), str(lr.refused),
                     f"{lr.wall:.1f} s", f"{lr.throughput:.2f}", ms(lr.store_median),
                     f"{ms(lr.locked_median)} / {ms(lr.locked_max)}"])
    return table(["code", "committers x commits", "landed", "refused", "wall", "commits/s", "store (median)",
                  "row lock held (median / max)"], rows)


def get_table(results: Sequence[Result]) -> str:
    rows = []
    for res in results:
        lr = res.large
        assert lr is not None
        rows.append([res.label, str(lr.get_commits), ms(lr.first_get), ms(lr.second_get), ms(lr.floor),
                     f"{lr.first_get / lr.floor:.1f}x", ms(lr.post_seconds),
                     f"{lr.versions_with_bytes} of {lr.apply_versions}"])
    return table(["code", "commits before", "first GET", "second GET", "floor (json.loads + sha256)",
                  "first GET / floor", "POST of that state", "apply versions holding bytes"], rows)


def verdicts(res: Result) -> list[str]:
    small, large = res.sizes[0], res.sizes[-1]
    lr = res.large
    assert lr is not None
    ratio = med(large.commit_client) / med(small.commit_client)
    per = med([float(b) for b in large.version_bytes]) / large.state_bytes
    return [
        f"- {large.instances:,}-instance commit ≤ 1.5× the {small.instances:,} figure: "
        f"{'met' if ratio <= 1.5 else 'missed'} ({ratio:.2f}×).",
        f"- ≤ 60 ms at the store at {large.instances:,}: {'met' if med(large.commit_store) <= 0.06 else 'missed'} "
        f"({ms(med(large.commit_store))}).",
        f"- ≥ 20 commits/s from {lr.committers} committers: {'met' if lr.throughput >= 20 else 'missed'} "
        f"({lr.throughput:.1f}/s).",
        f"- an apply version under 1% of the state: {'met' if per < 0.01 else 'missed'} ({per * 100:.3f}%).",
        f"- one assembly for {lr.get_commits} commits and a GET: {lr.versions_with_bytes} apply version(s) hold "
        "bytes afterwards.",
    ]


def render(command: str, machine: list[tuple[str, str]], results: Sequence[Result], elapsed: float) -> str:
    after = results[-1]
    lines = [
        SECTION, "",
        "Produced by `bench/commit_bench.py` (module docstring: method). Command:", "",
        f"    {command}", "",
        table(["machine", ""], [[k, v] for k, v in machine]), "",
        f"Run time {elapsed / 60:.1f} min. One-instance commits through the engine lane of the real server; "
        "\"at the store\" is `commit_run` in the server thread, \"row lock held\" from the commit taking the "
        "state's row lock (after any wait for it) to the end of its transaction (what Terraform's LOCK/POST, "
        "reservation requests and other commits on the state wait for).", "",
        "### Commit latency by state size", "", size_table(results), "",
        "### Storage per apply version", "",
        "Version row + outputs + the resource rows the version opened, as stored (`pg_column_size`, after "
        "compression); the POSTed version's stored bytes for comparison.", "",
        storage_table(results), "",
        "### Concurrent committers", "", large_table(results), "",
        "### GET after many commits", "", get_table(results), "",
        f"### Targets ({after.label})", "", *verdicts(after), "",
    ]
    return "\n".join(lines) + "\n"


# --- main -------------------------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = common.bench_parser("commit_bench", __doc__ or "", section=SECTION, default_out=DEFAULT_OUT,
                     quick_help=f"smoke-test sizes ({', '.join(map(str, QUICK.instances))} instances); writes no "
                                "document unless --out is given")
    p.add_argument("--baseline-tree", type=Path, default=None,
                   help="an export of older code: run this benchmark there first and show both side by side")
    p.add_argument("--label", default="this tree", help="what the code under test is called in the tables")
    p.add_argument("--baseline-label", default="baseline", help="what the --baseline-tree code is called")
    p.add_argument("--cycles-each", type=int, default=None,
                   help="commits per concurrent committer in (4) (default: 6; 3 for --quick)")
    p.add_argument("--get-after", type=int, default=None,
                   help="commits before the GET in (5) (default: 50; 10 for --quick)")
    p.add_argument("--baseline-cycles-each", type=int, default=1,
                   help="--cycles-each for the baseline run (default: %(default)s: its commits cost seconds each)")
    p.add_argument("--baseline-get-after", type=int, default=5, help="--get-after for the baseline run")
    p.add_argument("--baseline-json", type=Path, default=None,
                   help="reuse the baseline measurements saved by --save-baseline instead of running them again")
    p.add_argument("--save-baseline", type=Path, default=None, help="save the baseline run's measurements here")
    p.add_argument("--commits", type=int, default=None, help="one-after-another commits per size in (2) (default: 6)")
    p.add_argument("--baseline-commits", type=int, default=3, help="--commits for the baseline run")
    return p.parse_args(argv)


def baseline(args: argparse.Namespace, log: Callable[[str], None]) -> Result:
    tree = args.baseline_tree.resolve()
    work = Path(tempfile.mkdtemp(prefix="kl-commit-bench-"))
    try:
        shutil.copytree(Path(__file__).resolve().parent, tree / "bench", dirs_exist_ok=True)
        out = work / "baseline.json"
        argv = [sys.executable, "-m", "bench.commit_bench", "--json", str(out), "--label", args.baseline_label,
                "--database-url", args.database_url, "--cycles-each", str(args.baseline_cycles_each),
                "--get-after", str(args.baseline_get_after), "--commits", str(args.baseline_commits),
                *(["--quick"] if args.quick else [])]
        log(f"running the baseline in {tree}")
        proc = subprocess.run(argv, cwd=tree, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}, timeout=7200)
        if proc.returncode != 0:
            raise BenchError(f"the baseline run exited {proc.returncode}")
        if args.save_baseline is not None:
            shutil.copyfile(out, args.save_baseline)
        return load(json.loads(out.read_text()))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def load(doc: dict[str, Any]) -> Result:
    res = Result(label=doc["label"], sizes=[SizeResult(**s) for s in doc["sizes"]])
    res.large = LargeResult(**doc["large"]) if doc.get("large") else None
    return res


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out, command = common.start_run(args, "commit_bench", argv)
    sz = QUICK if args.quick else FULL
    sz = replace(sz, cycles_each=args.cycles_each or sz.cycles_each, get_after=args.get_after or sz.get_after,
                 commits=args.commits or sz.commits)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    started = perf()
    try:
        machine = common.machine_info(args.database_url)
        if args.baseline_json is not None:
            results = [load(json.loads(args.baseline_json.read_text()))]
        else:
            results = [baseline(args, log)] if args.baseline_tree else []
        results.append(run(args, sz, args.label, log))
    except (BenchError, KeyboardInterrupt) as exc:
        print(f"commit_bench: {exc}", file=sys.stderr)
        return 1
    if args.json:
        args.json.write_text(json.dumps(asdict(results[-1]), indent=2))
        if args.baseline_tree is None and args.baseline_json is None and out is None:
            return 0
    section = render(command, machine, results, perf() - started)
    common.publish(out, SECTION, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
