"""One-instance ``kl apply -f FILE --confirm-scope`` at several state sizes, side by side in one run.

Run from the repository root:

    .venv/bin/python -m bench.apply_flat_bench                      # 50,000 and 200,000 instances
    .venv/bin/python -m bench.apply_flat_bench --sizes 5000,20000   # other sizes
    .venv/bin/python -m bench.apply_flat_bench --profile /tmp/a.prof  # cProfile of the CLI at the largest size
    .venv/bin/python -m bench.apply_flat_bench --baseline /tmp/base  # and a checkout of earlier code, same run

For each size it writes the configuration and the state of ``bench.filescoped_bench`` (``terraform_data``
resources, 100 per file) into a scratch directory, loads the state with one POST into the real server
(``bench.backend_bench.Harness``), waits until the server's work after that bulk write has finished (the
statistics refresh and the splice base of the POSTed version, on the server's threads in this process: about a
minute at 500,000 instances; ``Harness.settle``), then edits one resource of one file and runs ``kl apply -f
THAT.tf --confirm-scope`` as a CLI process, end to end (plan over the minimal workspace, reservation, Terraform apply,
row commit). Every apply must commit and advance the trunk by one serial; anything else aborts. Rounds
alternate between the sizes so both see the same machine. Every request the CLI makes is timed inside the
server (method, route, seconds), so what grows with the state shows per endpoint.

With ``--baseline DIR`` (a checkout of other code, e.g. ``git archive main | tar -x -C DIR``) every round also
runs that code's CLI against the same state (its own data directory), with the server's dependents lookup of
that code, so before and after are measured side by side on the same machine.

``measure_apply(h, work, files, reps)`` is the reusable part: it returns an ``ApplySize`` with the wall times,
the per-request server times and the load averages.

Every apply is measured twice: wall-clock seconds and CPU seconds (user + system of the ``kl`` process and the
processes it waited for, from ``getrusage(RUSAGE_CHILDREN)``; plus the CPU of the server threads that answered
its requests). On a loaded machine the wall-clock spread within one size can exceed the difference between
sizes; the CPU seconds are what the apply itself costs, so the report gives the ratio of both.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.store import graph
from app.store.db import Database
from bench import common
from bench.backend_bench import Harness
from bench.common import BenchError, log, shim_target
from bench.filescoped_bench import PER_FILE, VARIABLES_TF, ServerTimes, file_tf, state_body

VENV_BIN = Path(sys.executable).parent
perf = time.perf_counter
# The bench server's request-body limit: the 500,000-instance state (334 MB) is over the default of 256 MiB.
BODY_LIMIT = 1 << 30


class RequestTimes(ServerTimes):
    """(method, route, seconds) of every request the server answers, taken in the server thread (records,
    ``mark`` and ``since`` as ``ServerTimes``); ``cpu`` holds the CPU seconds of the answering thread, one per
    record."""

    def __init__(self, app: Any) -> None:
        super().__init__()
        self.app = app
        self.cpu: list[float] = []

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        started, cpu = perf(), time.thread_time()
        try:
            return self.app(environ, start_response)
        finally:
            route = re.sub(r"/runs/[^/]+/", "/runs/ID/",
                           re.sub(r"/states/[^/]+", "/states/NAME", environ.get("PATH_INFO", "")))
            with self.lock:
                self.records.append((environ.get("REQUEST_METHOD", ""), route, perf() - started))  # type: ignore[arg-type]
                self.cpu.append(time.thread_time() - cpu)

    def cpu_since(self, mark: int) -> float:
        with self.lock:
            return sum(self.cpu[mark:])


def install_request_times(h: Harness) -> RequestTimes:
    server = h._httpd  # noqa: SLF001 - the bench's own harness
    times = RequestTimes(server.app)
    server.app = times
    return times


@dataclass
class ApplySize:
    files: int
    instances: int
    state_bytes: int = 0
    post_seconds: float = 0.0
    settle_seconds: float = 0.0   # waited after the POST for the server's upkeep and splice base
    seconds: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)          # CPU seconds of the kl process and its children
    server_cpu: list[float] = field(default_factory=list)   # CPU seconds of the server threads, per apply
    load: list[float] = field(default_factory=list)
    requests: list[list[Any]] = field(default_factory=list)   # (method, route, seconds) per apply


class ApplyBench:
    """One state of ``files`` x 100 instances and its configuration; ``once()`` runs one apply."""

    def __init__(self, h: Harness, times: RequestTimes, work: Path, files: int, baseline: Path | None = None) -> None:
        self.h, self.times, self.files, self.baseline = h, times, files, baseline
        self.name = f"bench-apply-{files * PER_FILE}"
        self.dir = work / f"config-{files * PER_FILE}"
        self.data = work / f"kl-data-{files * PER_FILE}"
        self.base_data = work / f"kl-data-base-{files * PER_FILE}"
        self.base = ApplySize(files, files * PER_FILE)
        self.target = files // 2
        self.res = ApplySize(files, files * PER_FILE)
        rc = work / "terraformrc"
        rc.write_text("")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("KL_", "TF_"))}
        self.env.update({"KL_DATA_DIR": str(self.data), "KL_TERRAFORM_BIN": str(VENV_BIN / "kl-terraform"),
                         "TF_CLI_CONFIG_FILE": str(rc), "TF_IN_AUTOMATION": "1", "CHECKPOINT_DISABLE": "1",
                         "KL_ACTOR": "bench"})
        self.rounds = 0

    def setup(self) -> None:
        self.dir.mkdir(parents=True)
        (self.dir / "variables.tf").write_text(VARIABLES_TF)
        (self.dir / "backend.tf").write_text(common.http_backend(f"{self.h.base}/v1/states/{self.name}"))
        for i in range(self.files):
            (self.dir / f"f{i}.tf").write_text(file_tf(i))
        body = state_body(self.files, seed=self.files)
        self.res.state_bytes = self.base.state_bytes = len(body)
        while not self.h.recorder.done.empty():
            self.h.recorder.done.get_nowait()
        self.res.post_seconds = self.h.request("POST", self.name, body=body).client
        del body
        # The server's statistics refresh and splice base after the POST run on its own threads in this
        # process: an apply timed beside them measures them too (seconds, at 500,000 instances).
        self.res.settle_seconds = self.h.settle()
        while not self.h.recorder.done.empty():
            self.h.recorder.done.get_nowait()
        # The first apply warms the parse cache; it is not counted.
        self.once(record=False)
        if self.baseline is not None:
            self.once(record=False, baseline=True)

    def serial(self) -> int:
        row = self.h.side.execute("SELECT max(serial) FROM state_versions v JOIN states s ON s.id = v.state_id "
                                  "WHERE s.name = %s", (self.name,)).fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def once(self, *, record: bool = True, profile: Path | None = None, baseline: bool = False) -> float:
        self.rounds += 1
        text = file_tf(self.target).replace(f'-f{self.target}-0"', f'-f{self.target}-0-r{self.rounds}"', 1)
        (self.dir / f"f{self.target}.tf").write_text(text)
        before = self.serial()
        argv = [str(VENV_BIN / "kl"), "apply", "-f", f"f{self.target}.tf", "--confirm-scope"]
        if profile is not None:
            argv = [sys.executable, "-m", "cProfile", "-o", str(profile), str(VENV_BIN / "kl"), *argv[1:]]
        env = self.env
        if baseline:
            assert self.baseline is not None
            argv = [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(self.baseline)!r}); "
                    "from runner.cli import main; sys.argv[0] = 'kl'; sys.exit(main())", *argv[1:]]
            env = {**self.env, "KL_DATA_DIR": str(self.base_data)}
        mark = self.times.mark()
        load = os.getloadavg()[0]
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = perf()
        with baseline_server(self.baseline if baseline else None):
            proc = subprocess.run(argv, cwd=self.dir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, errors="replace")
        seconds = perf() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)
        if proc.returncode != 0:
            raise BenchError(f"kl apply -f exited {proc.returncode}:\n{proc.stdout[-3000:]}")
        if self.serial() != before + 1:
            raise BenchError(f"kl apply -f did not advance the trunk by one serial:\n{proc.stdout[-2000:]}")
        while not self.h.recorder.done.empty():
            self.h.recorder.done.get_nowait()
        if record and profile is None:
            res = self.base if baseline else self.res
            res.seconds.append(seconds)
            res.cpu.append(cpu)
            res.server_cpu.append(self.times.cpu_since(mark))
            res.load.append(load)
            res.requests.append(self.times.since(mark))
        return seconds


@contextmanager
def baseline_server(baseline: Path | None) -> Iterator[None]:
    """While a baseline CLI runs, the server behaves as that code's did where it differs: the dependents lookup
    (a plain query the planner may answer by scanning the table, or one that may read a whole state through the
    state's btree) and JIT compilation (on, Postgres's default, in every transaction when that code's pool left
    it on)."""
    if baseline is None:
        yield
        return
    with ExitStack() as stack:
        graph_text = (baseline / "app/store/graph.py").read_text()
        if "def _dependents" not in graph_text:
            stack.enter_context(_plain_dependents())
        elif "state_id + 0" not in graph_text:
            stack.enter_context(_dependents_by_state())
        if "jit" not in (baseline / "app/store/db.py").read_text():
            stack.enter_context(_jit_on())
        yield


@contextmanager
def _plain_dependents() -> Iterator[None]:
    original = shim_target(graph, "_dependents")

    def plain(conn: Any, state_id: int, names: list[str]) -> list[Any]:
        return list(conn.execute(graph._DEPENDENTS, {"state": state_id, "names": names}).fetchall())

    graph._dependents = plain  # type: ignore[assignment]
    try:
        yield
    finally:
        graph._dependents = original  # type: ignore[assignment]


@contextmanager
def _dependents_by_state() -> Iterator[None]:
    """The dependents lookup with the state as a possible index condition (the planner may then read every row
    of a state through its btree)."""
    original = graph._DEPENDENTS
    if "r.state_id + 0 =" not in original:
        raise BenchError("the dependents lookup no longer filters by r.state_id + 0: point the baseline shim at it")
    graph._DEPENDENTS = original.replace("r.state_id + 0 =", "r.state_id =")
    try:
        yield
    finally:
        graph._DEPENDENTS = original


@contextmanager
def _jit_on() -> Iterator[None]:
    original = shim_target(Database, "transaction")

    @contextmanager
    def transaction(self: Database) -> Iterator[Any]:
        with original(self) as conn:
            conn.execute("SET LOCAL jit = on")
            yield conn

    Database.transaction = transaction  # type: ignore[method-assign]
    try:
        yield
    finally:
        Database.transaction = original  # type: ignore[method-assign]


def measure_apply(h: Harness, work: Path, files: int, reps: int, *, times: RequestTimes | None = None) -> ApplySize:
    """The reusable measurement: one state of ``files`` x 100 instances, ``reps`` one-instance applies."""
    bench = ApplyBench(h, times or install_request_times(h), work, files)
    bench.setup()
    for _ in range(reps):
        bench.once()
    return bench.res


def per_route(res: ApplySize) -> dict[str, float]:
    """Median server seconds per apply, per method and route (summed over the calls of one apply)."""
    keys = sorted({f"{m} {r}" for run in res.requests for m, r, _ in run})
    return {k: statistics.median(sum(s for m, r, s in run if f"{m} {r}" == k) for run in res.requests) for k in keys}


def report(results: list[ApplySize]) -> str:
    small, large = results[0], results[-1]
    med = statistics.median
    lines = ["| | " + " | ".join(f"{r.instances:,} instances" for r in results) + f" | ratio {large.instances:,}/"
             f"{small.instances:,} |", "|---|" + "---|" * (len(results) + 1)]
    lines.append("| `kl apply -f` one instance, median (min-max) s | " + " | ".join(
        f"{med(r.seconds):.2f} ({min(r.seconds):.2f}-{max(r.seconds):.2f})" for r in results)
        + f" | {med(large.seconds) / med(small.seconds):.2f}x |")
    lines.append("| CPU of `kl` and its children, median (min-max) s | " + " | ".join(
        f"{med(r.cpu):.2f} ({min(r.cpu):.2f}-{max(r.cpu):.2f})" for r in results)
        + f" | {med(large.cpu) / med(small.cpu):.2f}x |")
    lines.append("| server CPU per apply, median s | " + " | ".join(f"{med(r.server_cpu):.3f}" for r in results)
                 + f" | {med(large.server_cpu) / max(med(small.server_cpu), 1e-9):.2f}x |")
    lines.append("| state body | " + " | ".join(f"{r.state_bytes / 1e6:.0f} MB" for r in results) + " | |")
    lines.append("| 1-minute load average (min-max) | " + " | ".join(
        f"{min(r.load):.2f}-{max(r.load):.2f}" for r in results) + " | |")
    routes = [per_route(r) for r in results]
    for key in sorted(set().union(*routes), key=lambda k: -routes[-1].get(k, 0.0)):
        lines.append(f"| server: `{key}` (s per apply) | " + " | ".join(f"{rt.get(key, 0.0):.3f}" for rt in routes)
                     + " | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="50000,200000", help="instances per state, comma-separated")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--profile", type=Path, help="write a cProfile of one kl apply -f at the largest size here")
    p.add_argument("--baseline", type=Path, help="a checkout of other code whose CLI runs beside this one")
    args = p.parse_args(argv)
    sizes = [int(x) // PER_FILE for x in args.sizes.split(",")]
    with (tempfile.TemporaryDirectory(prefix="kl-apply-bench-") as tmp,
          Harness(common.DEFAULT_DATABASE_URL, max_body_bytes=BODY_LIMIT) as h):
        times = install_request_times(h)
        benches = [ApplyBench(h, times, Path(tmp), files, args.baseline) for files in sizes]
        for b in benches:
            started = perf()
            b.setup()
            log(f"[{b.res.instances}] state {b.res.state_bytes / 1e6:.0f} MB, POST {b.res.post_seconds:.1f}s, "
                f"upkeep and splice base after it {b.res.settle_seconds:.1f}s, setup {perf() - started:.1f}s")
        for rep in range(args.reps):
            for b in benches:
                log(f"[{b.res.instances}] round {rep + 1}: kl apply -f {b.once():.2f}s")
                if args.baseline is not None:
                    log(f"[{b.res.instances}] round {rep + 1}: baseline kl apply -f {b.once(baseline=True):.2f}s")
        if args.profile:
            benches[-1].once(profile=args.profile)
        if not args.reps:  # only the warm-up applies (and the profile): nothing timed to report
            return 0
        print(f"\nmachine: {os.cpu_count()} cores; command: .venv/bin/python -m bench.apply_flat_bench "
              f"{' '.join(argv or sys.argv[1:])}\n")
        if args.baseline is not None:
            print(f"Baseline ({args.baseline}):\n")
            print(report([b.base for b in benches]) + "\n\nThis code:\n")
        print(report([b.res for b in benches]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
