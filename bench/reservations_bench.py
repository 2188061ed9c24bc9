"""Reservations benchmark: acquire + release of an apply run through the engine lane, on states that
already hold 0, 1,000 and 10,000 live reservations of other runs.

Run from the repository root:

    .venv/bin/python -m bench.reservations_bench                   # full size, rewrites its section
    .venv/bin/python -m bench.reservations_bench --quick           # smoke test, prints only
    .venv/bin/python -m bench.reservations_bench --out /tmp/r.md   # full size, section written elsewhere
    .venv/bin/python -m bench.reservations_bench --heavy           # heavy clients (bench/heavy_reservations.py)

One cycle opens an apply run holding a write glob and a read glob (``POST /v1/engine/states/NAME/runs``)
and releases everything it holds (``POST /v1/engine/runs/ID/release``). The globs are keyed module
instances (``module.m123["b7"].*``) on the same module roots as the pre-loaded reservations, so every
conflict check reads a few candidate rows but the requests practically never conflict. Cells: 1, 4 and 16
concurrent clients (threads, one ``requests.Session`` each) over HTTP, and 1 client calling
``app.store.runs.open_run`` / ``release`` directly (with the candidates query both indexed and forced to a
sequential scan), for each size, which has its own state. Every cell is measured in several short slices,
and the slices of all cells take turns, so load from other processes on a shared machine spreads over all
cells. Then ``EXPLAIN (ANALYZE, BUFFERS)`` of the candidates query (``app.store.reservation_rows._CANDIDATES``) on the
largest state: the planner's plan, the same with index scans disabled, and the generic plan a prepared
statement may switch to; and whether Postgres does switch (on a fresh connection, as the app's pool uses
it). Finally 1,000 other states with 10 reservations each join the table, and the store cell and HTTP
cells (1 and 16 clients) are repeated on the largest state, as loaded and after ``CLUSTER`` on the root
index, each on fresh connections.

The scratch database, the migrated schema and the live loopback server come from
``bench.backend_bench.Harness``. Any HTTP status other than 201 (open), 409 (conflict: counted) and 200
(release), or a response that does not show the reservations taken or released, aborts with exit status 1
and writes nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import random
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import requests

from analyzer.globs import canonical, parse_glob
from app.domain.principal import default_principal
from app.domain.reservations import DEFAULT_LEASE, glob_root, parse_wanted
from app.errors import ReservationConflictError
from app.store import acquire as store_acquire
from app.store import reservation_rows
from app.store import runs as store_runs
from app.store.db import Database
from bench import common
from bench.backend_bench import Harness
from bench.common import DEFAULT_OUT, BenchError, log, ms, shim_target, table

SECTION = "## Reservations"
STATE_PREFIX = "bench-reservations-"  # one state per size: bench-reservations-0, -1000, -10000
MODULE_ROOTS = 2_000      # module.m0 .. module.m1999: shared by the pre-load and the bench's own globs
RESOURCE_ROOTS = 2_000    # aws_instance.r0 ..: pre-load only
DATA_ROOTS = 500          # data.aws_ami.a0 ..: pre-load only
BENCH_KEYS = 50           # the bench's keys b0..b49; the pre-load uses p0..p49, so they never intersect
PRELOAD_PREFIX = "pre_"
OTHER_PREFIX = "oth_"

perf = time.perf_counter


def state_name(live: int) -> str:
    return f"{STATE_PREFIX}{live}"


@dataclass(frozen=True)
class Sizes:
    levels: tuple[int, ...]     # live reservations pre-loaded, one state per size
    clients: tuple[int, ...]    # concurrent HTTP clients
    rounds: int                 # every cell is measured in this many slices, interleaved with the others
    seconds: float              # measured time per slice
    warmup: float               # unmeasured time at the start of each slice
    explain_runs: int           # EXPLAIN ANALYZE repeats (the last one is reported)
    other_states: int           # then: this many other states join the table ...
    other_each: int             # ... each holding this many reservations
    other_clients: tuple[int, ...]  # HTTP cells repeated on the big state among them


FULL = Sizes(levels=(0, 1_000, 10_000), clients=(1, 4, 16), rounds=5, seconds=1.0, warmup=0.2, explain_runs=5,
             other_states=1_000, other_each=10, other_clients=(1, 16))
QUICK = Sizes(levels=(0, 1_000, 10_000), clients=(1, 4, 16), rounds=1, seconds=1.0, warmup=0.2, explain_runs=2,
              other_states=1_000, other_each=10, other_clients=(1, 16))


# --- globs --------------------------------------------------------------------------------------


def preload_glob(rng: random.Random) -> tuple[str, str]:
    """One realistic reservation of another run: (canonical glob, mode)."""
    m, r, d = rng.randrange(MODULE_ROOTS), rng.randrange(RESOURCE_ROOTS), rng.randrange(DATA_ROOTS)
    key = f'"p{rng.randrange(BENCH_KEYS)}"'
    x = rng.random()
    if x < 0.35:
        text, mode = f"module.m{m}[{key}].*", "write"
    elif x < 0.50:
        text, mode = f"module.m{m}[{key}].module.db.*", "read"
    elif x < 0.60:
        text, mode = f"module.m{m}[{key}].aws_s3_bucket.logs", "write"         # exact, no '*'
    elif x < 0.75:
        text, mode = f"aws_instance.r{r}.*", "write"
    elif x < 0.90:
        text, mode = f"aws_instance.r{r}[{rng.randrange(8)}]", "read"          # exact, no '*'
    else:
        text, mode = f"data.aws_ami.a{d}", "read"                               # exact, no '*'
    return canonical(parse_glob(text)), mode


def bench_globs(rng: random.Random) -> list[dict[str, str]]:
    """What one measured cycle reserves: one write and one read glob on random module instances."""
    return [
        {"glob": f'module.m{rng.randrange(MODULE_ROOTS)}["b{rng.randrange(BENCH_KEYS)}"].*', "mode": "write"},
        {"glob": f'module.m{rng.randrange(MODULE_ROOTS)}["b{rng.randrange(BENCH_KEYS)}"].*', "mode": "read"},
    ]


# --- the database -------------------------------------------------------------------------------


class Scratch:
    """The bench's states and their pre-loaded reservations, through the harness's side connection."""

    def __init__(self, h: Harness) -> None:
        self.h = h

    def create_state(self, name: str) -> int:
        row = self.h.side.execute("INSERT INTO states (tenant_id, scope, name) VALUES (1, '', %s) RETURNING id",
                                  (name,)).fetchone()
        assert row is not None
        return int(row[0])

    def _copy(self, run_rows: list[tuple[Any, ...]], res_rows: list[tuple[Any, ...]]) -> None:
        with self.h.side.cursor() as cur:
            with cur.copy("COPY apply_runs (id, tenant_id, state_id, status, actor, lease_seconds, created_at, "
                          "started_at) FROM STDIN") as cp:
                for row in run_rows:
                    cp.write_row(row)
            with cur.copy("COPY resource_reservations (tenant_id, state_id, run_id, glob, root, mode, holder, "
                          "acquired_at, expires_at) FROM STDIN") as cp:
                for row in res_rows:
                    cp.write_row(row)

    @staticmethod
    def _rows(state_id: int, prefix: str, n: int, rng: random.Random) -> tuple[list[Any], list[Any]]:
        """``n`` live reservations on ``state_id``, two per run: (apply_runs rows, resource_reservations rows)."""
        now = datetime.now(UTC)
        expires = now + timedelta(hours=12)
        run_rows, res_rows = [], []
        for i in range(math.ceil(n / 2)):
            run_id = f"{prefix}{i:06d}"
            actor = f"team-{i % 37}"
            acquired = now - timedelta(seconds=rng.randrange(600))
            run_rows.append((run_id, 1, state_id, "reserved" if i % 3 else "running", actor, 43_200,
                             acquired, acquired))
            seen: set[tuple[str, str]] = set()
            while len(seen) < min(2, n - 2 * i):
                seen.add(preload_glob(rng))
            for text, mode in sorted(seen):
                res_rows.append((1, state_id, run_id, text, glob_root(text), mode, actor, acquired, expires))
        return run_rows, res_rows

    def add_other_states(self, states: int, each: int, seed: int) -> float:
        """Other states sharing the table, each holding ``each`` live reservations; returns seconds."""
        started = perf()
        rng = random.Random(seed)
        run_rows: list[Any] = []
        res_rows: list[Any] = []
        for k in range(states):
            row = self.h.side.execute("INSERT INTO states (tenant_id, scope, name) VALUES (1, '', %s) RETURNING id",
                                      (f"bench-other-{k}",)).fetchone()
            assert row is not None
            runs_k, res_k = self._rows(int(row[0]), f"{OTHER_PREFIX}{k:05d}_", each, rng)
            run_rows += runs_k
            res_rows += res_k
        self._copy(run_rows, res_rows)
        self.vacuum()
        return perf() - started

    def preload(self, state_id: int, n: int, seed: int) -> dict[str, float]:
        """``n`` live reservations of other runs (two per run) on the state."""
        side = self.h.side
        started = perf()
        run_rows, res_rows = self._rows(state_id, f"{PRELOAD_PREFIX}{state_id}_", n, random.Random(seed))
        self._copy(run_rows, res_rows)
        loaded = perf() - started
        self.vacuum()
        found = self.counts(state_id)
        if found != (n, 0):
            raise BenchError(f"pre-loaded {found[0]} reservations (and {found[1]} others), expected {n}")
        module_rooted = side.execute(
            "SELECT count(*) FROM resource_reservations WHERE state_id = %s AND root LIKE 'module.m%%'",
            (state_id,)).fetchone()
        per_root = (module_rooted[0] if module_rooted else 0) / MODULE_ROOTS
        return {"load_seconds": loaded, "runs": len(run_rows), "module_rooted": per_root * MODULE_ROOTS,
                "expected_candidates": 2 * per_root}

    def vacuum(self) -> None:
        self.h.side.execute("VACUUM (ANALYZE) resource_reservations")
        self.h.side.execute("VACUUM (ANALYZE) apply_runs")

    def counts(self, state_id: int) -> tuple[int, int]:
        """(pre-loaded reservations, any other reservations) on the state."""
        row = self.h.side.execute(
            "SELECT count(*) FILTER (WHERE run_id LIKE 'pre\\_%%'), count(*) FILTER (WHERE run_id NOT LIKE "
            "'pre\\_%%') FROM resource_reservations WHERE state_id = %s", (state_id,)).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])


# --- clients ------------------------------------------------------------------------------------


class Conflicted(Exception):
    """A 409 / ReservationConflictError: expected now and then, counted apart."""


class HttpClient:
    def __init__(self, base: str, state: str, actor: str) -> None:
        self.base = base
        self.state = state
        self.actor = actor
        self.session = requests.Session()

    def open(self, globs: list[dict[str, str]]) -> str:
        url = f"{self.base}/v1/engine/states/{self.state}/runs"
        try:
            resp = self.session.post(url, json={"actor": self.actor, "reservations": globs}, timeout=120)
        except requests.RequestException as exc:
            raise BenchError(f"POST {url} failed: {exc}") from exc
        if resp.status_code == 409:
            raise Conflicted()
        if resp.status_code != 201:
            raise BenchError(f"POST {url} answered HTTP {resp.status_code}, expected 201: {resp.text[:500]!r}")
        doc = resp.json()
        expected = len(parse_wanted((g["glob"], g["mode"]) for g in globs))  # a read under a write is dropped
        if len(doc.get("reservations", [])) != expected or doc["run"]["status"] != "reserved":
            raise BenchError(f"POST {url} answered 201 without the reservations asked for: {resp.text[:500]!r}")
        return str(doc["run"]["id"])

    def release(self, run_id: str) -> None:
        url = f"{self.base}/v1/engine/runs/{run_id}/release"
        try:
            resp = self.session.post(url, json={"holder": self.actor}, timeout=120)
        except requests.RequestException as exc:
            raise BenchError(f"POST {url} failed: {exc}") from exc
        if resp.status_code != 200:
            raise BenchError(f"POST {url} answered HTTP {resp.status_code}, expected 200: {resp.text[:500]!r}")
        if resp.json().get("reservations") != []:
            raise BenchError(f"POST {url} answered 200 but the run still holds reservations: {resp.text[:500]!r}")

    def close(self) -> None:
        self.session.close()


class StoreClient:
    """The same cycle without HTTP: ``app.store.runs.open_run`` and ``release`` on a private pool."""

    def __init__(self, db: Database, state: str, actor: str) -> None:
        self.db = db
        self.state = state
        self.actor = actor
        self.principal = default_principal()  # what the open auth mode gives an anonymous HTTP caller

    def open(self, globs: list[dict[str, str]]) -> str:
        wanted = parse_wanted((g["glob"], g["mode"]) for g in globs)
        try:
            run = store_runs.open_run(self.db, self.principal, self.state, actor=self.actor, wanted=wanted,
                                      lease=DEFAULT_LEASE)
        except ReservationConflictError as exc:
            raise Conflicted() from exc
        return run.id

    def release(self, run_id: str) -> None:
        store_runs.release(self.db, self.principal, run_id, holder=self.actor)

    def close(self) -> None:
        pass


# --- cells --------------------------------------------------------------------------------------


@dataclass
class Cell:
    lane: str                  # "http", "store", "store, candidates unindexed"
    live: int
    clients: int
    others: int = 0            # other states in the table (each with a few reservations)
    layout: str = ""           # "clustered": after CLUSTER resource_reservations USING the root index
    load1: float = 0.0         # the machine's 1-minute load average when the cell ended
    cycles: int = 0
    conflicts: int = 0
    elapsed: float = 0.0       # from the start of the measured window to the end of its last cycle
    slices: int = 0
    acquire: list[float] = field(default_factory=list)
    cycle: list[float] = field(default_factory=list)
    # probes around reservation_rows.candidates and find_conflicts (server side for HTTP: the server is in-process)
    probe_calls: int = 0
    probe_rows: int = 0
    probe_candidates: float = 0.0
    probe_checks: float = 0.0

    @property
    def rate(self) -> float:
        return self.cycles / self.elapsed if self.elapsed else 0.0

    @property
    def candidate_rows(self) -> float | None:
        return self.probe_rows / self.probe_calls if self.probe_calls else None

    @property
    def candidates_ms(self) -> float | None:
        return self.probe_candidates / self.probe_calls * 1e3 if self.probe_calls else None

    @property
    def conflict_check_ms(self) -> float | None:
        return self.probe_checks / self.probe_calls * 1e3 if self.probe_calls else None

    def add(self, other: Cell) -> None:
        """Fold one more slice of the same cell in."""
        self.slices += other.slices
        self.cycles += other.cycles
        self.conflicts += other.conflicts
        self.elapsed += other.elapsed
        self.acquire += other.acquire
        self.cycle += other.cycle
        self.probe_calls += other.probe_calls
        self.probe_rows += other.probe_rows
        self.probe_candidates += other.probe_candidates
        self.probe_checks += other.probe_checks
        self.load1 = max(self.load1, other.load1)


def pct(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(math.ceil(p / 100 * len(ordered)) - 1, 0))]


def run_cell(lane: str, live: int, make_client: Callable[[int], Any], clients: int, sz: Sizes, seed: int,
             others: int = 0) -> Cell:
    """``clients`` threads cycle open + release for warmup + seconds; cycles started in the measured
    window count. The first error stops every thread and is raised."""
    cell = Cell(lane, live, clients, others)
    errors: queue.Queue[BaseException] = queue.Queue()
    stop = threading.Event()
    window: dict[str, float] = {}
    lock = threading.Lock()
    ends: list[float] = []

    def set_window() -> None:
        window["w0"] = perf() + sz.warmup
        window["w1"] = window["w0"] + sz.seconds

    barrier = threading.Barrier(clients, action=set_window)

    def worker(i: int) -> None:
        rng = random.Random(seed * 1_000 + i)
        client: Any = None
        acquire: list[float] = []
        cycle: list[float] = []
        conflicts = 0
        last_end = 0.0
        try:
            client = make_client(i)
            barrier.wait()
            w0, w1 = window["w0"], window["w1"]
            while not stop.is_set():
                started = perf()
                if started >= w1:
                    break
                globs = bench_globs(rng)
                try:
                    run_id = client.open(globs)
                except Conflicted:
                    conflicts += started >= w0
                    continue
                acquired = perf()
                client.release(run_id)
                ended = perf()
                if started >= w0:
                    acquire.append(acquired - started)
                    cycle.append(ended - started)
                    last_end = ended
        except BaseException as exc:  # noqa: B036 - reported to the main thread, which raises it
            errors.put(exc)
            stop.set()
            barrier.abort()
        finally:
            if client is not None:
                client.close()
            with lock:
                cell.acquire.extend(acquire)
                cell.cycle.extend(cycle)
                cell.conflicts += conflicts
                ends.append(last_end)

    threads = [threading.Thread(target=worker, args=(i,), name=f"bench-client-{i}") for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if not errors.empty():
        exc = errors.get()
        if isinstance(exc, threading.BrokenBarrierError) and not errors.empty():
            exc = errors.get()
        raise exc if isinstance(exc, BenchError) else BenchError(f"{lane} cell failed: {exc!r}") from exc
    cell.cycles = len(cell.cycle)
    if not cell.cycles:
        raise BenchError(f"{lane} cell at {live} live reservations, {clients} clients completed no cycle")
    cell.elapsed = max(ends) - window["w0"]
    cell.load1 = os.getloadavg()[0]
    cell.slices = 1
    return cell


@dataclass
class Probe:
    calls: int = 0
    rows: int = 0
    candidates: float = 0.0
    conflict_checks: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)


_INDEXES_OFF = "SELECT set_config('enable_indexscan', 'off', true), set_config('enable_bitmapscan', 'off', true)"
_INDEXES_ON = "SELECT set_config('enable_indexscan', 'on', true), set_config('enable_bitmapscan', 'on', true)"


@contextmanager
def probes(probe: Probe, *, unindexed: bool) -> Iterator[None]:
    """Time ``reservation_rows.candidates`` and ``find_conflicts`` inside ``open_run`` (bench process only;
    restored on exit). With ``unindexed``, the candidates query runs with index and bitmap scans
    disabled for that one statement (transaction-local settings, set before and restored after)."""
    original_candidates = shim_target(reservation_rows, "candidates")
    original_find = shim_target(store_acquire, "find_conflicts")

    def candidates(conn: psycopg.Connection, state_id: int, roots: set[str]) -> list[Any]:
        if unindexed:
            conn.execute(_INDEXES_OFF)
        started = perf()
        found = original_candidates(conn, state_id, roots)
        spent = perf() - started
        if unindexed:
            conn.execute(_INDEXES_ON)
        with probe.lock:
            probe.candidates += spent
            probe.calls += 1
            probe.rows += len(found)
        return found

    def find_conflicts(*args: Any, **kwargs: Any) -> Any:
        started = perf()
        try:
            return original_find(*args, **kwargs)
        finally:
            spent = perf() - started
            with probe.lock:
                probe.conflict_checks += spent

    reservation_rows.candidates = candidates  # type: ignore[assignment]
    store_acquire.find_conflicts = find_conflicts  # type: ignore[assignment]
    try:
        yield
    finally:
        reservation_rows.candidates = original_candidates  # type: ignore[assignment]
        store_acquire.find_conflicts = original_find  # type: ignore[assignment]


def probed_slice(lane: str, live: int, make_client: Callable[[int], Any], clients: int, sz: Sizes, seed: int, *,
                 unindexed: bool = False, others: int = 0, layout: str = "") -> Cell:
    """One slice of a cell (``run_cell``) with probes around the candidates query and the conflict checks:
    the server runs in this process, so they time the HTTP cells' server side too (warm-up included)."""
    probe = Probe()
    with probes(probe, unindexed=unindexed):
        cell = run_cell(lane, live, make_client, clients, sz, seed, others)
    cell.layout = layout
    cell.probe_calls, cell.probe_rows = probe.calls, probe.rows
    cell.probe_candidates, cell.probe_checks = probe.candidates, probe.conflict_checks
    return cell


def store_slice(db: Database, live: int, sz: Sizes, seed: int, *, unindexed: bool, others: int = 0,
                layout: str = "") -> Cell:
    lane = "store, candidates unindexed" if unindexed else "store"
    state = state_name(live)
    return probed_slice(lane, live, lambda i: StoreClient(db, state, f"bench-s{i}"), 1, sz, seed,
                        unindexed=unindexed, others=others, layout=layout)


def http_slice(h: Harness, live: int, clients: int, sz: Sizes, seed: int, *, others: int = 0,
               layout: str = "") -> Cell:
    base, state = h.base, state_name(live)
    cell = probed_slice("http", live, lambda i: HttpClient(base, state, f"bench-c{i}"), clients, sz, seed,
                        others=others, layout=layout)
    drain(h)
    return cell


def measure(h: Harness, scratch: Scratch, state_ids: dict[int, int], plan: Sequence[tuple[str, int, int]], sz: Sizes,
            seed: int, log: Callable[[str], None], *, others: int = 0, layout: str = "") -> list[Cell]:
    """Every (lane, live, clients) of ``plan`` in ``sz.rounds`` slices, interleaved round by round (the
    order reversed every other round), so a burst of load from elsewhere spreads over all cells instead
    of landing on one. Starts on fresh connections (see ``fresh_app_connections``)."""
    cells: dict[tuple[str, int, int], Cell] = {}
    fresh_app_connections(h)
    db = Database(h.url, pool_size=2)
    try:
        for r in range(sz.rounds):
            for k, (lane, live, clients) in enumerate(plan if r % 2 == 0 else list(reversed(plan))):
                scratch.vacuum()
                slice_seed = seed + r * 1_000 + k
                if lane == "http":
                    got = http_slice(h, live, clients, sz, slice_seed, others=others, layout=layout)
                else:
                    got = store_slice(db, live, sz, slice_seed, unindexed=lane != "store", others=others,
                                      layout=layout)
                found = scratch.counts(state_ids[live])
                if found != (live, 0):
                    raise BenchError(f"after a {lane} slice the state {state_name(live)} holds {found[0]} "
                                     f"pre-loaded and {found[1]} other reservations; expected {live} and 0")
                if (lane, live, clients) in cells:
                    cells[(lane, live, clients)].add(got)
                else:
                    cells[(lane, live, clients)] = got
            log(f"  round {r + 1}/{sz.rounds} done")
    finally:
        db.close()
    return [cells[key] for key in plan]


def drain(h: Harness) -> None:
    """The harness's middleware queues a phase record per request; nobody reads them here."""
    try:
        while True:
            h.recorder.done.get_nowait()
    except queue.Empty:
        pass


# --- EXPLAIN ------------------------------------------------------------------------------------


@dataclass
class Plan:
    label: str
    text: str
    returned: int
    heap_rows_examined: int
    index_entries: int
    buffers_hit: int
    buffers_read: int
    execution_ms: float
    nodes: str


def _walk(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from _walk(child)


def _plan_numbers(label: str, doc: list[dict[str, Any]], text: str) -> Plan:
    top = doc[0]["Plan"]
    heap = entries = 0
    shapes = []
    for node in _walk(top):
        kind = node["Node Type"]
        loops = node.get("Actual Loops", 1)
        shapes.append(kind + (f" on {node['Index Name']}" if "Index Name" in node else ""))
        if kind in ("Seq Scan", "Index Scan", "Index Only Scan", "Bitmap Heap Scan"):
            heap += (node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
                     + node.get("Rows Removed by Index Recheck", 0)) * loops
        if kind in ("Index Scan", "Index Only Scan"):
            entries += (node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)) * loops
        if kind == "Bitmap Index Scan":
            entries += node.get("Actual Rows", 0) * loops
    return Plan(label=label, text=text, returned=int(top.get("Actual Rows", 0)), heap_rows_examined=int(heap),
                index_entries=int(entries), buffers_hit=int(top.get("Shared Hit Blocks", 0)),
                buffers_read=int(top.get("Shared Read Blocks", 0)),
                execution_ms=float(doc[0].get("Execution Time", 0.0)), nodes=" > ".join(shapes))


def _numbered(query: str) -> str:
    count = iter(range(1, 100))
    return re.sub(r"%s", lambda _m: f"${next(count)}", query)


@dataclass
class PlanChoice:
    """What Postgres did with the app's own prepared candidates statement (plan_cache_mode = auto)."""

    layout: str
    executions: int
    generic: int
    custom: int
    last_ms: float          # mean time of reservation_rows.candidates over the last 10 executions
    custom_cost: float      # mean estimated total cost of the custom plans for the roots asked for
    generic_cost: float     # estimated total cost of the generic plan
    planning_surcharge: float  # what Postgres adds to a custom plan's cost before comparing


@dataclass
class ExplainResult:
    live: int
    roots: list[str]
    query: str
    plans: list[Plan] = field(default_factory=list)
    choices: list[PlanChoice] = field(default_factory=list)


def typical_roots(seed: int) -> list[str]:
    return sorted({glob_root(g["glob"]) for g in bench_globs(random.Random(seed))})


def explain_plans(h: Harness, state_id: int, roots: list[str], sz: Sizes, *, suffix: str = "",
                  generic_only: bool = False) -> list[Plan]:
    """EXPLAIN (ANALYZE, BUFFERS) of the candidates query for ``roots``: as planned with the values (the
    custom plan), with index and bitmap scans disabled, and the generic plan of the prepared statement."""
    params = (state_id, roots, False)
    query = reservation_rows._CANDIDATES.strip()  # noqa: SLF001 - the query under test
    plans: list[Plan] = []
    with psycopg.connect(h.url, autocommit=True, prepare_threshold=None) as conn:
        cur = psycopg.ClientCursor(conn)  # literal parameters: the planner sees the values, as in a custom plan

        def run(label: str, setup: Sequence[str], statement: str) -> None:
            for s in setup:
                conn.execute(s)
            doc: Any = None
            text = ""
            for _ in range(sz.explain_runs):
                doc = cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, params).fetchone()
                text = "\n".join(r[0] for r in cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + statement,
                                                           params).fetchall())
            assert doc is not None
            plans.append(_plan_numbers(label + suffix, doc[0], text))
            conn.execute("RESET ALL")

        if not generic_only:
            run("as planned with the values (custom plan)", [], query)
            run("index and bitmap scans disabled (unindexed baseline)",
                ["SET enable_indexscan = off", "SET enable_bitmapscan = off"], query)
        conn.execute(f"PREPARE kl_candidates (bigint, text[], boolean) AS {_numbered(query)}")
        run("generic plan of the prepared statement (plan_cache_mode = force_generic_plan)",
            ["SET plan_cache_mode = force_generic_plan"], "EXECUTE kl_candidates (%s, %s, %s)")
        conn.execute("DEALLOCATE kl_candidates")
    return plans


def plan_choice(h: Harness, state_id: int, layout: str, seed: int, executions: int = 20) -> PlanChoice:
    """What the app's pool connections do: psycopg prepares a query on its 5th execution on a connection,
    and Postgres then chooses between custom plans and one generic plan itself (plan_cache_mode = auto):
    the generic plan once its estimated cost is below the custom plans' average plus a planning surcharge.
    Each execution asks for the roots of a new random acquire, as the bench's clients do."""
    times = []
    rng = random.Random(seed)
    asked: list[list[str]] = []
    with psycopg.connect(h.url) as conn:
        for _ in range(executions):
            roots = {glob_root(g["glob"]) for g in bench_globs(rng)}
            asked.append(sorted(roots))
            started = perf()
            reservation_rows.candidates(conn, state_id, roots)
            times.append(perf() - started)
        row = conn.execute(
            "SELECT coalesce(sum(generic_plans), 0), coalesce(sum(custom_plans), 0) FROM pg_prepared_statements "
            "WHERE statement LIKE '%%FROM resource_reservations r%%' AND statement LIKE '%%r.root = ANY%%'"
        ).fetchone()
        conn.rollback()
    generic, custom = (int(row[0]), int(row[1])) if row else (0, 0)
    query = reservation_rows._CANDIDATES.strip()  # noqa: SLF001 - the query under test
    with psycopg.connect(h.url, autocommit=True, prepare_threshold=None) as conn:
        cur = psycopg.ClientCursor(conn)

        def cost(statement: str, params: Sequence[Any]) -> float:
            doc = cur.execute("EXPLAIN (FORMAT JSON) " + statement, params).fetchone()
            assert doc is not None
            return float(doc[0][0]["Plan"]["Total Cost"])

        custom_cost = sum(cost(query, (state_id, r, False)) for r in asked) / len(asked)
        conn.execute(f"PREPARE kl_candidates (bigint, text[], boolean) AS {_numbered(query)}")
        conn.execute("SET plan_cache_mode = force_generic_plan")
        generic_cost = cost("EXECUTE kl_candidates (%s, %s, %s)", (state_id, asked[0], False))
        conn.execute("DEALLOCATE kl_candidates")
        op = conn.execute("SELECT current_setting('cpu_operator_cost')::float8").fetchone()
        # plancache.c: cached_plan_cost(plan, include_planner) adds 1000 * cpu_operator_cost * (relations + 1).
        surcharge = 1000.0 * float(op[0] if op else 0.0025) * 2
    return PlanChoice(layout=layout, executions=executions, generic=generic, custom=custom,
                      last_ms=sum(times[-10:]) / len(times[-10:]) * 1e3, custom_cost=custom_cost,
                      generic_cost=generic_cost, planning_surcharge=surcharge)


def fresh_app_connections(h: Harness) -> None:
    """Replace the app pool's connections, as a restart or the pool's max_lifetime (1 h by default) would:
    a prepared statement's plan choice is per connection and remembers the costs of its earlier custom plans."""
    db = h._app.extensions["kilolock"].db  # noqa: SLF001 - the harness's app
    db._pool.drain()  # noqa: SLF001 - psycopg_pool.ConnectionPool.drain()


def among_others(h: Harness, scratch: Scratch, state_ids: dict[int, int], explained: ExplainResult | None,
                 sz: Sizes, layout: str, seed: int, log: Callable[[str], None]) -> list[Cell]:
    """With the other states in the table: the generic plan, Postgres' plan choice, then the store cell and
    the HTTP cells again on the biggest state, on fresh connections."""
    live = sz.levels[-1]
    big = state_ids[live]
    what = f"{sz.other_states:,} other states" + (f", {layout}" if layout else "")
    if explained is not None:
        explained.plans += explain_plans(h, big, explained.roots, sz, generic_only=True, suffix=f", {what}")
        if layout:
            what_choice = f"+{sz.other_states:,} other states, after CLUSTER ... USING resource_reservations_root_ix"
        else:
            what_choice = f"+{sz.other_states:,} other states x {sz.other_each} reservations"
        choice = plan_choice(h, big, what_choice, seed=seed)
        explained.choices.append(choice)
        log(f"  {what}: generic plan examines {explained.plans[-1].heap_rows_examined} rows; Postgres made "
            f"{choice.custom} custom and {choice.generic} generic plans (costs {choice.custom_cost:.2f} + "
            f"{choice.planning_surcharge:.1f} vs {choice.generic_cost:.2f})")
    plan = [("store", live, 1)] + [("http", live, n) for n in sz.other_clients]
    found = measure(h, scratch, state_ids, plan, sz, seed, log, others=sz.other_states, layout=layout)
    for cell in found:
        log(f"  {cell.lane} x{cell.clients} ({what}): {cell.rate:.0f} cycles/s, acquire p50 "
            f"{ms(pct(cell.acquire, 50))} ms, candidates {cell.candidates_ms or 0:.3f} ms")
    return found


# --- report -------------------------------------------------------------------------------------


def live_label(c: Cell) -> str:
    return f"{c.live:,}" + (f" (+{c.others:,} other states{', ' + c.layout if c.layout else ''})" if c.others else "")


def cell_rows(cells: Sequence[Cell]) -> list[list[str]]:
    rows = []
    for c in cells:
        rows.append([c.lane, live_label(c), str(c.clients), str(c.cycles), f"{c.rate:.0f}", str(c.conflicts),
                     ms(pct(c.acquire, 50)), ms(pct(c.acquire, 95)), ms(pct(c.acquire, 99)),
                     ms(pct(c.cycle, 50)), ms(pct(c.cycle, 95)), ms(pct(c.cycle, 99)), f"{c.load1:.2f}"])
    return rows


def results_table(cells: Sequence[Cell]) -> str:
    return table(["lane", "live reservations", "clients", "cycles", "cycles/s", "409s", "acquire p50 ms",
                  "p95", "p99", "cycle p50 ms", "p95", "p99", "load 1m"], cell_rows(cells))


def probe_table(cells: Sequence[Cell]) -> str:
    rows = [[c.lane, live_label(c), f"{c.candidate_rows:.2f}", f"{c.candidates_ms:.3f}",
             f"{c.conflict_check_ms:.3f}", ms(pct(c.acquire, 50))]
            for c in cells if c.candidate_rows is not None and c.candidates_ms is not None
            and c.conflict_check_ms is not None]
    return table(["lane", "live reservations", "candidate rows per acquire", "candidates query ms (mean)",
                  "find_conflicts ms (mean, both calls)", "acquire p50 ms"], rows)


def find(cells: Sequence[Cell], lane: str, live: int, clients: int, others: int = 0, layout: str = "") -> Cell | None:
    return next((c for c in cells if c.lane == lane and c.live == live and c.clients == clients
                 and c.others == others and c.layout == layout), None)


def scaling_table(cells: Sequence[Cell], sz: Sizes) -> str:
    lo, hi = sz.levels[0], sz.levels[-1]
    rows = []
    for lane, clients in [("store", 1), ("store, candidates unindexed", 1)] + [("http", n) for n in sz.clients]:
        a, b = find(cells, lane, lo, clients), find(cells, lane, hi, clients)
        if a is None or b is None:
            continue
        rows.append([lane, str(clients), ms(pct(a.acquire, 50)), ms(pct(b.acquire, 50)),
                     f"{pct(b.acquire, 50) / pct(a.acquire, 50):.2f}x", ms(pct(a.acquire, 95)),
                     ms(pct(b.acquire, 95)), f"{pct(b.acquire, 95) / pct(a.acquire, 95):.2f}x",
                     f"{b.rate / a.rate:.2f}x"])
    return table(["lane", "clients", f"acquire p50 ms @ {lo:,}", f"@ {hi:,}", "ratio", f"acquire p95 ms @ {lo:,}",
                  f"@ {hi:,}", "ratio", f"throughput {hi:,} / {lo:,}"], rows)


def others_table(cells: Sequence[Cell], sz: Sizes) -> str:
    hi = sz.levels[-1]
    rows = []
    for c in cells:
        if not c.others:
            continue
        alone = find(cells, c.lane, c.live, c.clients)
        if alone is None:
            continue
        rows.append([c.lane, c.layout or "as loaded", str(c.clients), ms(pct(alone.acquire, 50)),
                     ms(pct(c.acquire, 50)),
                     f"{pct(c.acquire, 50) / pct(alone.acquire, 50):.2f}x", ms(pct(alone.acquire, 99)),
                     ms(pct(c.acquire, 99)), f"{alone.rate:.0f}", f"{c.rate:.0f}"])
    return table(["lane", "table", "clients", f"acquire p50 ms, {hi:,} alone", f"+{sz.other_states:,} other states",
                  "ratio",
                  "acquire p99 ms, alone", "+other states", "cycles/s, alone", "+other states"], rows)


def plans_table(e: ExplainResult) -> str:
    rows = [[p.label, p.nodes, str(p.returned), f"{p.index_entries:,}", f"{p.heap_rows_examined:,}",
             f"{p.buffers_hit} / {p.buffers_read}", f"{p.execution_ms:.3f}"] for p in e.plans]
    return table(["plan", "nodes", "rows returned", "index entries read", "heap rows examined",
                  "shared buffers hit / read", "execution ms"], rows)


def choices_table(e: ExplainResult) -> str:
    rows = [[c.layout, f"{c.custom_cost:.2f} + {c.planning_surcharge:.1f}", f"{c.generic_cost:.2f}",
             str(c.executions), str(c.custom), str(c.generic), f"{c.last_ms:.3f}"]
            for c in e.choices]
    return table(["table", "custom plan cost (mean) + surcharge", "generic plan cost", "executions",
                  "custom plans", "generic plans", "reservation_rows.candidates ms (mean of the last 10)"], rows)


def reading(cells: Sequence[Cell], e: ExplainResult | None, sz: Sizes) -> str:
    lo, hi = sz.levels[0], sz.levels[-1]
    parts = []
    s0, s1 = find(cells, "store", lo, 1), find(cells, "store", hi, 1)
    u0, u1 = find(cells, "store, candidates unindexed", lo, 1), find(cells, "store, candidates unindexed", hi, 1)
    h0, h1 = find(cells, "http", lo, 1), find(cells, "http", hi, 1)
    if s0 and s1 and h0 and h1:
        parts.append(
            f"With one client, an acquire takes {ms(pct(s0.acquire, 50))} ms at the store and "
            f"{ms(pct(h0.acquire, 50))} ms over HTTP at {lo:,} live reservations, and {ms(pct(s1.acquire, 50))} / "
            f"{ms(pct(h1.acquire, 50))} ms at {hi:,} (ratios {pct(s1.acquire, 50) / pct(s0.acquire, 50):.2f}x / "
            f"{pct(h1.acquire, 50) / pct(h0.acquire, 50):.2f}x). HTTP adds about "
            f"{ms(pct(h0.cycle, 50) - pct(s0.cycle, 50))} ms to a whole cycle at {lo:,} "
            f"({ms(pct(s0.cycle, 50))} ms at the store, {ms(pct(h0.cycle, 50))} ms over HTTP).")
    if s1 and u1 and s1.candidates_ms is not None and u1.candidates_ms is not None and s1.candidate_rows is not None:
        parts.append(
            f"At {hi:,} the candidates query returns {s1.candidate_rows:.1f} rows per acquire on average and "
            f"takes {s1.candidates_ms:.3f} ms through the root index; forced to a sequential scan it takes "
            f"{u1.candidates_ms:.3f} ms and the acquire p50 is {ms(pct(u1.acquire, 50))} ms instead of "
            f"{ms(pct(s1.acquire, 50))} ms.")
        if u0 and u0.candidates_ms is not None and s0 and s0.candidates_ms is not None:
            parts.append(
                f"From {lo:,} to {hi:,} live reservations the indexed candidates query goes from "
                f"{s0.candidates_ms:.3f} to {s1.candidates_ms:.3f} ms, the unindexed one from "
                f"{u0.candidates_ms:.3f} to {u1.candidates_ms:.3f} ms (a sequential scan reads the whole table, "
                f"every bench state's {sum(sz.levels):,} reservations, whichever state asks).")
    if e is not None and len(e.plans) >= 3:
        p, u, g = e.plans[0], e.plans[1], e.plans[2]
        parts.append(
            f"EXPLAIN at {e.live:,}: the planned query reads {p.index_entries:,} index entries and examines "
            f"{p.heap_rows_examined:,} heap rows to return {p.returned} ({p.execution_ms:.3f} ms); without the "
            f"index it examines {u.heap_rows_examined:,} ({u.execution_ms:.3f} ms), and so does the statement's "
            f"generic plan ({g.heap_rows_examined:,} rows, {g.execution_ms:.3f} ms): the `OR %s` parameter cannot "
            f"become an index condition, and a generic plan estimates the state's size as the table's average.")
        for ch in e.choices:
            verdict = ("kept custom plans" if not ch.generic else "switched to the generic plan")
            parts.append(
                f"Table {ch.layout}: on a fresh connection Postgres {verdict} for the app's prepared statement "
                f"({ch.custom} custom, {ch.generic} generic over {ch.executions} executions; estimated costs "
                f"{ch.custom_cost:.1f} + {ch.planning_surcharge:.0f} custom vs {ch.generic_cost:.1f} generic; "
                f"{ch.last_ms:.3f} ms per call at the end).")
    many = [c for c in cells if c.others]
    for c in many:
        alone = find(cells, c.lane, c.live, c.clients)
        if alone is not None:
            cand = ""
            if c.candidates_ms is not None and alone.candidates_ms is not None:
                cand = f"candidates query {c.candidates_ms:.3f} ms vs {alone.candidates_ms:.3f} ms, "
            parts.append(f"Among {c.others:,} other states{' (' + c.layout + ')' if c.layout else ''}, "
                         f"{c.lane} with {c.clients} client(s): {cand}acquire p50 "
                         f"{ms(pct(c.acquire, 50))} ms vs {ms(pct(alone.acquire, 50))} ms alone, {c.rate:.0f} vs "
                         f"{alone.rate:.0f} cycles/s.")
    top = [c for c in cells if c.lane == "http" and not c.others]
    if top:
        best = max(top, key=lambda c: c.rate)
        parts.append(f"The best HTTP throughput was {best.rate:.0f} cycles/s ({best.clients} clients, "
                     f"{best.live:,} live). Every acquire and release is a transaction that locks the state row, "
                     f"so cycles on one state run one at a time whatever the client count, and client threads and "
                     f"server share one GIL on {os.cpu_count()} cores: more clients add queueing to the latency, "
                     f"not throughput.")
    conflicts = sum(c.conflicts for c in cells)
    parts.append(f"{conflicts} request(s) answered 409 over the whole run (the bench's globs rarely intersect).")
    peak = max((c.load1 for c in cells), default=0.0)
    cores = os.cpu_count() or 1
    if peak > cores * 0.75:
        parts.append(f"The 1-minute load average reached {peak:.2f} on {cores} cores: other processes competed for "
                     f"the CPU during this run, so end-to-end latencies and throughputs carry noise of tens of "
                     f"percent from cell to cell (the server-side probe times and the EXPLAIN row counts are the "
                     f"steadier signal); compare only large differences.")
    return " ".join(parts)


def render(command: str, machine: list[tuple[str, str]], sz: Sizes, cells: Sequence[Cell],
           e: ExplainResult | None, loads: dict[int, dict[str, float]], others_seconds: float,
           elapsed: float) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    http = [c for c in cells if c.lane == "http" and not c.others]
    store = [c for c in cells if c.lane != "http" and not c.others]
    many = [c for c in cells if c.others]
    load_rows = [[f"{n:,}", f"{int(v['runs']):,}", f"{v['load_seconds']:.2f}", f"{v['expected_candidates']:.2f}"]
                 for n, v in loads.items()]
    explain_text = ""
    if e is not None:
        plans_text = "\n\n".join(f"{p.label}:\n\n```\n{p.text}\n```" for p in e.plans)
        explain_text = f"""### EXPLAIN of the candidates query at {e.live:,} live reservations

`app.store.reservation_rows._CANDIDATES` with the roots of one typical acquire ({", ".join(f"`{r}`" for r in e.roots)}),
on a side connection, the last of {sz.explain_runs} runs. "Heap rows examined" counts the rows each scan node
fetched (returned plus removed by filter or recheck); "index entries read" counts what the index scans produced.
The last two rows were taken after the other states of the next section joined the table.

{table(["", ""], [["query", "`" + " ".join(e.query.split()) + "`"]])}

{plans_table(e)}

{plans_text}

What Postgres does with the app's own statement: psycopg prepares a query on its 5th execution on a
connection (the app's pool connections too), and with `plan_cache_mode = auto` Postgres then chooses between
custom plans and one generic plan by their estimated costs. `reservation_rows.candidates` executed on one fresh
connection with the roots of a new random acquire each time:

{choices_table(e)}
"""
    many_text = ""
    if many:
        many_text = f"""### The same state among {sz.other_states:,} other states

After the cells above, {sz.other_states:,} other states join the table, each holding {sz.other_each} live
reservations of the same kinds ({sz.other_states * sz.other_each:,} rows more, loaded in {others_seconds:.1f} s
with `VACUUM (ANALYZE)`), and these cells are repeated on the {sz.levels[-1]:,}-reservation state; then once more
after `CLUSTER resource_reservations USING resource_reservations_root_ix` + `VACUUM (ANALYZE)` (rows stored in
index order, as after a bulk load of one state's reservations or a repack). Each of these cells starts on fresh
database connections (a new 2-connection pool for the store cell; the app's pool drained with
`ConnectionPool.drain()`), as after a restart or the pool's `max_lifetime`: Postgres decides between custom and
generic plans per connection, from the costs of the custom plans that connection made before.

{results_table(many)}

{probe_table(many)}

{others_table(cells, sz)}
"""
    return f"""{SECTION}

Produced by `bench/reservations_bench.py` on {when} in {elapsed:.0f} s (see `bench/README.md`). The real
Flask app runs on a threaded werkzeug server on a loopback port in the benchmark process (the harness of
`bench/backend_bench.py`: scratch database created, migrated and dropped by the script; the app's pool of
10 connections, the default). Client threads and the server share one Python process and its GIL, and
werkzeug's server opens a connection and a thread per request.

### Machine

{table(["", ""], machine)}

### Command

```
{command}
```

### Setup

One state per size, `{STATE_PREFIX}N`, holding N live reservations of other runs (two per run, leases of
12 h), inserted with `COPY` into `apply_runs` and `resource_reservations`, the `root` column computed with
`app.domain.reservations.glob_root`, then `VACUUM (ANALYZE)`. Their globs spread over {MODULE_ROOTS:,}
module roots (`module.m123["p4"].*` write, `module.m123["p4"].module.db.*` read,
`module.m123["p4"].aws_s3_bucket.logs` write), {RESOURCE_ROOTS:,} resource roots (`aws_instance.r567.*`
write, `aws_instance.r567[3]` read) and {DATA_ROOTS} data roots (`data.aws_ami.a12` read).

One cycle opens a run with a write glob and a read glob on random module instances of the same
{MODULE_ROOTS:,} module roots under other keys (`module.m123["b7"].*`, {BENCH_KEYS} keys), so each conflict
check reads the pre-loaded rows of two roots without conflicting with them, then releases everything:
`POST /v1/engine/states/NAME/runs` with `{{"actor", "reservations"}}` (201), then
`POST /v1/engine/runs/ID/release` with `{{"holder"}}` (200). Each response is checked (the run holds both
globs, then none), and after every slice the state holds exactly its N pre-loaded reservations. "store"
cells call `app.store.runs.open_run` / `release` directly, one client on a separate 2-connection pool;
"store, candidates unindexed" is the same with index and bitmap scans turned off (transaction-local
`set_config`, one extra statement before and after) for the candidates query only.

Every cell is measured in {sz.rounds} slice(s) of {sz.warmup:g} s unmeasured + {sz.seconds:g} s measured,
each after a `VACUUM (ANALYZE)`; round by round the slices of all cells take turns (the order reversed every
other round), so load from other processes spreads over all cells rather than landing on one. Latencies are
nearest-rank percentiles of all cycles started in the measured windows; throughput is those cycles over the
measured time (each window to the end of its last cycle). "acquire" is the open call, "cycle" is open +
release. "load 1m" is the highest 1-minute load average seen as a slice of the cell ended (the benchmark
itself keeps about one core busy).

| live reservations | runs | pre-load s | expected candidate rows per acquire |
|---|---|---|---|
{chr(10).join("| " + " | ".join(r) + " |" for r in load_rows)}

### Results over HTTP

{results_table(http)}

### Results at the store (no HTTP)

{results_table(store)}

Where the acquire goes, for every cell above (probes around `reservation_rows.candidates` and `find_conflicts`, which
`open_run` calls twice: once for expired holdings, once for live ones; the server runs in the benchmark
process, so this covers the HTTP cells' server side too, warm-up included):

{probe_table(store + http)}

### Scaling with live reservations

{scaling_table(cells, sz)}

{explain_text}
{many_text}
### Reading

{reading(cells, e, sz)}
"""


# --- main ---------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = common.bench_parser("reservations_bench", __doc__ or "", section=SECTION, default_out=DEFAULT_OUT,
                     quick_help=f"{QUICK.seconds:g} s per cell instead of {FULL.seconds:g}; writes no document "
                                "unless --out is given",
                     json_help="also dump every raw latency as JSON here")
    p.add_argument("--seed", type=int, default=4, help="random seed for globs (default: %(default)s)")
    p.add_argument("--heavy", action="store_true",
                   help="measure heavy clients instead (1,000 x 2,000 glob conflict check, LOCK latency meanwhile, "
                        "/healthz with 50 waiters on gunicorn) and write their own section")
    return p.parse_args(argv)


def main_heavy(args: argparse.Namespace, command: str) -> int:
    from bench import heavy_reservations as heavy

    out = common.out_path(args)
    machine = common.machine_info(args.database_url)
    with Harness(args.database_url) as h:
        found = heavy.run_heavy(h, args.quick, lambda msg: print(msg, file=sys.stderr, flush=True))
    machine.append(("Load average at end", common.load_average()))
    section = heavy.heavy_section(found, machine, command)
    print(section)
    if args.json is not None:
        args.json.write_text(json.dumps({**found, "machine": machine, "command": command}, indent=1))
    if out is not None:
        common.write_section(out, heavy.HEAVY_SECTION, section)
        print(f"wrote the '{heavy.HEAVY_SECTION}' section of {out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sz = QUICK if args.quick else FULL
    out = common.out_path(args)
    command = common.command_line("reservations_bench", argv)
    if args.heavy:
        return main_heavy(args, command)

    started = perf()
    cells: list[Cell] = []
    loads: dict[int, dict[str, float]] = {}
    explained: ExplainResult | None = None
    others_seconds = 0.0
    try:
        machine = common.machine_info(args.database_url)
        with Harness(args.database_url) as h:
            log(f"scratch database {h.dbname}, server {h.base}")
            scratch = Scratch(h)
            state_ids: dict[int, int] = {}
            for li, live in enumerate(sz.levels):
                state_ids[live] = scratch.create_state(state_name(live))
                loads[live] = scratch.preload(state_ids[live], live, seed=args.seed * 7 + li)
                log(f"{state_name(live)}: {live:,} live reservations pre-loaded in "
                    f"{loads[live]['load_seconds']:.2f}s (~{loads[live]['expected_candidates']:.2f} candidate rows "
                    "per acquire)")
                # One cycle over HTTP on each state: checks the path and warms the pool and the code.
                first = HttpClient(h.base, state_name(live), "bench-warmup")
                first.release(first.open(bench_globs(random.Random(li))))
                first.close()
            plan = [(lane, live, 1) for live in sz.levels for lane in ("store", "store, candidates unindexed")]
            plan += [("http", live, n) for live in sz.levels for n in sz.clients]
            log(f"{len(plan)} cells x {sz.rounds} round(s) of {sz.warmup:g} s + {sz.seconds:g} s")
            cells += measure(h, scratch, state_ids, plan, sz, args.seed * 100, log)
            for cell in cells:
                log(f"  {cell.lane} x{cell.clients} @ {cell.live:,}: {cell.rate:.0f} cycles/s, acquire p50 "
                    f"{ms(pct(cell.acquire, 50))} ms, p99 {ms(pct(cell.acquire, 99))} ms, {cell.conflicts} conflicts")
            live = sz.levels[-1]
            scratch.vacuum()
            roots = typical_roots(args.seed)
            query = reservation_rows._CANDIDATES.strip()  # noqa: SLF001 - the query under test
            explained = ExplainResult(live=live, roots=roots, query=query)
            explained.plans += explain_plans(h, state_ids[live], roots, sz)
            total = sum(sz.levels)
            explained.choices.append(plan_choice(
                h, state_ids[live], f"the bench's {len(sz.levels)} states ({total:,} reservations)", seed=args.seed))
            # The biggest state among many smaller ones, as loaded and after CLUSTER.
            others_seconds = scratch.add_other_states(sz.other_states, sz.other_each, seed=args.seed + 1)
            log(f"{sz.other_states:,} other states x {sz.other_each} reservations added in {others_seconds:.1f}s")
            for layout in ("", "clustered"):
                if layout:
                    h.side.execute("CLUSTER resource_reservations USING resource_reservations_root_ix")
                scratch.vacuum()
                cells += among_others(h, scratch, state_ids, explained, sz, layout, seed=args.seed * 100 + 50, log=log)
    except BenchError as exc:
        log(f"benchmark failed: {exc}")
        return 1
    elapsed = perf() - started
    machine.append(("Load average at end", common.load_average()))

    print("Machine: " + "; ".join(f"{k}: {v}" for k, v in machine), end="\n\n")
    print(results_table(cells), end="\n\n")
    print(probe_table([c for c in cells if c.lane != "http"]), end="\n\n")
    print(scaling_table(cells, sz), end="\n\n")
    print(others_table(cells, sz), end="\n\n")
    if explained is not None:
        print(plans_table(explained), end="\n\n")
        print(choices_table(explained), end="\n\n")
        for p in explained.plans:
            print(f"{p.label}:\n{p.text}\n")
    if explained is not None:
        for c in explained.choices:
            print(f"plan choice, {c.layout}: custom cost {c.custom_cost:.2f} + {c.planning_surcharge:.1f}, generic "
                  f"{c.generic_cost:.2f}; {c.custom} custom, {c.generic} generic; {c.last_ms:.3f} ms")
    print(reading(cells, explained, sz), end="\n\n")
    if args.json is not None:
        args.json.write_text(json.dumps({"sizes": asdict(sz), "machine": machine, "cells": [asdict(c) for c in cells],
                                         "explain": asdict(explained) if explained else None, "preload": loads},
                                        indent=1))
    if out is not None:
        section = render(command, machine, sz, cells, explained, loads, others_seconds, elapsed)
        common.write_section(out, SECTION, section)
        print(f"wrote the '{SECTION}' section of {out}")
    print(f"done in {elapsed:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
