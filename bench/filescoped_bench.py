"""File-scoped plan benchmark: ``kl plan -f FILE`` on a large state against vanilla
``terraform plan -refresh=false`` over the whole configuration, side by side in one run.

Run from the repository root:

    .venv/bin/python -m bench.filescoped_bench                   # 5,000 and 50,000 instances; rewrites its section
    .venv/bin/python -m bench.filescoped_bench --quick           # 500 and 2,000 instances (~1 minute); prints only
    .venv/bin/python -m bench.filescoped_bench --out /tmp/f.md   # full size, section written elsewhere

For each size the script generates, in a temporary directory, a configuration of ``terraform_data``
resources, 100 per file (``f{i}.tf`` declares ``r{i}_0`` .. ``r{i}_99``, each ``input =
"${var.prefix}-f{i}-{k}"``), a ``variables.tf`` declaring ``prefix`` and a ``backend.tf`` pointing Terraform's
``http`` backend at the real server (``bench.backend_bench.Harness``: the Flask app on a loopback port over a
scratch database). It generates the matching state directly as a v4 file, instance by instance in the
shape Terraform 1.15's ``terraform_data`` stores (no 50,000-resource apply), and loads it with one POST to
``/v1/states/NAME``. Before anything is edited, vanilla ``terraform plan -refresh=false -detailed-exitcode``
over the full configuration must report no changes (the generated state is accepted as is), and
``kl plan -f`` of the file to be edited must plan nothing.

Then every ``input`` of one file (100 resources) is changed, and, alternating between the sizes so both
see the same machine: (a) ``kl plan -f THAT.tf`` as a CLI process, end to end, with a cold parse cache
(``KL_DATA_DIR/hcl-cache.pickle`` deleted first) and warm; (b) vanilla ``terraform plan -refresh=false``
over the full configuration through the HTTP backend, ``init`` excluded (done once, before). Every kl plan
must write an artifact whose write set is exactly the edited file's 100 addresses, each an ``update``;
every vanilla plan must report ``0 to add, 100 to change, 0 to destroy``. Anything else aborts with exit
status 1 and writes nothing.

Then the same ``kl plan -f`` runs again under a timing shim (``runner.cli.main`` with timers wrapped around
its phases: footprint, server edges and slice, workspace, ``terraform init``/``plan``/``show``, …; the
times are exclusive, so nested phases are not counted twice), and once under ``cProfile`` at the largest
size. The server's ``graph.edges_touching`` and ``graph.slice_state`` are timed in the server thread.
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import os
import pstats
import random
import re
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.store import graph
from bench import common
from bench.backend_bench import Harness
from bench.common import DEFAULT_OUT, REPO, BenchError, log, shim_target, table

SECTION = "## File-scoped plans"
PER_FILE = 100
TARGET_SECONDS = 3.0
TARGET_GROWTH = 0.25
VENV_BIN = Path(sys.executable).parent
PROVIDER = 'provider["terraform.io/builtin/terraform"]'

perf = time.perf_counter


@dataclass(frozen=True)
class Sizes:
    files: tuple[int, ...]    # configuration sizes, in files of PER_FILE resources
    kl_reps: int              # plain kl plan -f runs, cold and warm each
    tf_reps: int              # vanilla terraform plan runs
    shim_reps: int            # kl plan -f under the timing shim, cold and warm each


FULL = Sizes(files=(50, 500), kl_reps=5, tf_reps=3, shim_reps=3)
QUICK = Sizes(files=(5, 20), kl_reps=3, tf_reps=3, shim_reps=3)


# --- the configuration and the state ---------------------------------------------------------------

VARIABLES_TF = """\
variable "prefix" {
  type    = string
  default = "v1"
}
"""


def value(i: int, k: int, edited: bool = False) -> str:
    return f"v1-f{i}-{k}" + ("-edited" if edited else "")


def file_tf(i: int, edited: bool = False) -> str:
    suffix = "-edited" if edited else ""
    return "\n".join(f'resource "terraform_data" "r{i}_{k}" {{\n  input = "${{var.prefix}}-f{i}-{k}{suffix}"\n}}\n'
                     for k in range(PER_FILE))


def state_body(files: int, seed: int) -> bytes:
    """A v4 state holding every instance of the configuration, as Terraform 1.15 writes terraform_data
    (checked against a real apply: schema_version 0, id, input/output as {value, type}, triggers_replace
    null, no sensitive attributes, identity_schema_version 0)."""
    rnd = random.Random(seed)
    resources: list[dict[str, Any]] = []
    for i in range(files):
        for k in range(PER_FILE):
            v = value(i, k)
            resources.append({
                "mode": "managed", "type": "terraform_data", "name": f"r{i}_{k}", "provider": PROVIDER,
                "instances": [{
                    "schema_version": 0,
                    "attributes": {
                        "id": str(uuid.UUID(int=rnd.getrandbits(128))),
                        "input": {"value": v, "type": "string"},
                        "output": {"value": v, "type": "string"},
                        "triggers_replace": None,
                    },
                    "sensitive_attributes": [],
                    "identity_schema_version": 0,
                }],
            })
    resources.sort(key=lambda r: str(r["name"]))
    doc = {"version": 4, "terraform_version": "1.15.5", "serial": 1,
           "lineage": str(uuid.UUID(int=rnd.getrandbits(128))), "outputs": {}, "resources": resources,
           "check_results": None}
    return (json.dumps(doc, indent=2) + "\n").encode()


# --- processes -------------------------------------------------------------------------------------


@dataclass
class Ran:
    argv: list[str]
    rc: int
    output: str
    seconds: float
    cpu: float          # user + system CPU seconds of the process and the children it waited for
    started_wall: float
    ended_wall: float


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


class TimedOut(BenchError):
    """A time-boxed process did not finish in time; it and its children were killed."""

    def __init__(self, label: str, seconds: float) -> None:
        super().__init__(f"{label}: did not finish within {seconds:.0f} s")
        self.seconds = seconds


def run(argv: Sequence[str], *, cwd: Path, env: dict[str, str], ok: tuple[int, ...] = (0,), label: str = "",
        timeout: float | None = None) -> Ran:
    """Run one process to its end; with ``timeout`` (seconds), kill its whole process group past it and raise
    ``TimedOut``."""
    cpu = children_cpu()
    started_wall = time.time()
    started = perf()
    with subprocess.Popen(list(argv), cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, encoding="utf-8", errors="replace",
                          start_new_session=timeout is not None) as proc:
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise TimedOut(label or argv[0], timeout or 0.0) from None
    seconds = perf() - started
    ran = Ran(list(argv), proc.returncode, output, seconds, children_cpu() - cpu, started_wall, time.time())
    if proc.returncode not in ok:
        raise BenchError(f"{label or argv[0]}: {shlex.join(argv)} exited {proc.returncode} in {cwd}:\n"
                         f"{output[-3000:]}")
    return ran


# --- the timing shim: kl's own main() with exclusive timers around the phases of kl plan -f -----------

SHIM = r'''
import time
_W0 = time.time()
import gc, json, os, sys, functools
import runner.cli, runner.cli.changes, runner.cli.support
import runner.core.config, runner.core.engine_client, runner.core.filescoped, runner.core.plan, runner.core.spec
import runner.core.pins, runner.core.pipeline, runner.core.scope, runner.core.session, runner.core.workbuild
_W1 = time.time()
''' + common.SHIM_IMPORT + r'''_totals = {"imports": _W1 - _W0}
_stack = []
_gc = {"pause": 0.0, "t": None}

def _wrap(owner, attr, label):
    original = shim_target(owner, attr)
    @functools.wraps(original)
    def timed(*args, **kwargs):
        _stack.append(0.0)
        t = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            elapsed = time.perf_counter() - t
            children = _stack.pop()
            if _stack:
                _stack[-1] += elapsed
            name = label(*args, **kwargs) if callable(label) else label
            _totals[name] = _totals.get(name, 0.0) + elapsed - children
    setattr(owner, attr, timed)

def _on_gc(phase, info):
    if phase == "start":
        _gc["t"] = time.perf_counter()
    elif _gc["t"] is not None:
        _gc["pause"] += time.perf_counter() - _gc["t"]
        _gc["t"] = None
gc.callbacks.append(_on_gc)

fs, pl, cli = runner.core.pipeline, runner.core.plan, runner.cli.changes
sc, wb, tfs = runner.core.scope, runner.core.workbuild, runner.core.session
_wrap(cli, "cmd_plan", "write the artifact, print the summary")
_wrap(runner.core.spec.PlanSpec, "to_json", "write the artifact, print the summary")
_wrap(pl, "summary", "write the artifact, print the summary")
_wrap(cli, "_plan_spec", "other (between the phases)")
_wrap(runner.cli.support, "resolve", "resolve the server (backend.tf)")
_wrap(cli, "terraform_context", "find terraform")
_wrap(cli, "_selection", "other (between the phases)")
_wrap(fs, "_plan_files", "other (between the phases)")
_wrap(fs, "read_configuration", "read every .tf file")
_wrap(fs, "load_cache", "load the parse cache")
_wrap(fs, "save_cache", "save the parse cache")
_wrap(sc, "declaring_files", "prescan every file (declaring_files)")
_wrap(sc, "footprint", "footprint (analyzer)")
_wrap(runner.core.engine_client.EngineClient, "edges", "server: edges (HTTP)")
_wrap(runner.core.engine_client.EngineClient, "slice", "server: slice (HTTP)")
_wrap(fs, "fetch_slice", "slice: parse, filter, re-assemble")
_wrap(wb, "build", "build the minimal workspace")
_wrap(fs, "plan_in_workspace", "read terraform show's JSON")
_wrap(tfs, "terraform", lambda ctx, ws, args, **kw: "terraform " + args[0])
_wrap(fs, "analyze_plan", "analyze the plan")
_wrap(runner.core.pins, "pin_files", "hash the workspace's files")

def _dump(code):
    with open(os.environ["KL_BENCH_TIMINGS"], "w") as fh:
        json.dump({"w0": _W0, "returned": time.time(), "totals": _totals, "gc": _gc["pause"], "rc": code}, fh)

sys.argv[0] = "kl"
_profile = os.environ.get("KL_BENCH_PROFILE")
code = None
try:
    if _profile:
        import cProfile
        _p = cProfile.Profile()
        code = _p.runcall(runner.cli.main, sys.argv[1:])
        _p.dump_stats(_profile)
    else:
        code = runner.cli.main(sys.argv[1:])
finally:
    sys.stdout.flush()
    _dump(code)
sys.exit(code)
'''

PHASES = [
    "Python start",
    "imports",
    "resolve the server (backend.tf)",
    "find terraform",
    "read every .tf file",
    "load the parse cache",
    "prescan every file (declaring_files)",
    "footprint (analyzer)",
    "server: edges (HTTP)",
    "save the parse cache",
    "server: slice (HTTP)",
    "slice: parse, filter, re-assemble",
    "build the minimal workspace",
    "terraform init",
    "terraform plan",
    "terraform show",
    "read terraform show's JSON",
    "analyze the plan",
    "hash the workspace's files",
    "write the artifact, print the summary",
    "other (between the phases)",
    "Python exit",
]


def shim_phases(ran: Ran, timings: Path) -> dict[str, float]:
    doc = json.loads(timings.read_text())
    phases: dict[str, float] = {"Python start": doc["w0"] - ran.started_wall}
    phases.update(doc["totals"])
    phases["Python exit"] = max(ran.ended_wall - doc["returned"], 0.0)
    unknown = set(phases) - set(PHASES)
    if unknown:
        raise BenchError(f"the timing shim reported phases this report does not know: {sorted(unknown)}")
    phases["other (between the phases)"] = phases.get("other (between the phases)", 0.0) + max(
        ran.seconds - sum(phases.values()), 0.0)
    phases["total"] = ran.seconds
    phases["of which GC pauses"] = doc["gc"]
    return phases


# --- server-side timers ------------------------------------------------------------------------------


class ServerTimes:
    """Seconds spent in the server's edges and slice functions (in the server's request threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.records: list[tuple[str, float, int]] = []   # (what, seconds, edges or bytes)

    def mark(self) -> int:
        with self.lock:
            return len(self.records)

    def since(self, mark: int) -> list[tuple[str, float, int]]:
        with self.lock:
            return list(self.records[mark:])


@contextmanager
def server_timers(times: ServerTimes) -> Iterator[None]:
    originals = {name: shim_target(graph, name) for name in ("edges_touching", "slice_state")}

    def wrap(name: str, size: Callable[[Any], int]) -> Callable[..., Any]:
        original = originals[name]

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = perf()
            result = original(*args, **kwargs)
            with times.lock:
                times.records.append((name, perf() - started, size(result)))
            return result

        return timed

    graph.edges_touching = wrap("edges_touching", len)  # type: ignore[assignment]
    graph.slice_state = wrap("slice_state", len)  # type: ignore[assignment]
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(graph, name, original)


# --- one size ------------------------------------------------------------------------------------------


@dataclass
class SizeResult:
    files: int
    instances: int
    target_file: str = ""
    state_bytes: int = 0
    generate_seconds: float = 0.0
    post_seconds: float = 0.0
    init_seconds: float = 0.0
    check_plan_seconds: float = 0.0      # vanilla no-change plan before the edit (the state is accepted)
    check_kl_seconds: float = 0.0        # kl plan -f of the unedited file (plans nothing)
    kl_cold: list[float] = field(default_factory=list)
    kl_warm: list[float] = field(default_factory=list)
    kl_cold_cpu: list[float] = field(default_factory=list)
    kl_warm_cpu: list[float] = field(default_factory=list)
    tf: list[float] = field(default_factory=list)
    tf_cpu: list[float] = field(default_factory=list)
    shim_cold: list[dict[str, float]] = field(default_factory=list)
    shim_warm: list[dict[str, float]] = field(default_factory=list)
    server_edges: list[float] = field(default_factory=list)   # per kl plan -f: seconds in edges_touching
    server_slice: list[float] = field(default_factory=list)   # per kl plan -f: seconds in slice_state
    edges_calls: list[int] = field(default_factory=list)
    slice_bytes: int = 0
    slice_globs: int = 0
    slice_instances: int = 0
    cache_bytes: int = 0
    workspace_files: list[str] = field(default_factory=list)
    load: list[float] = field(default_factory=list)           # 1-minute load average before each round
    slice_glob_list: list[str] = field(default_factory=list)
    slice_explain: list[str] = field(default_factory=list)    # EXPLAIN (ANALYZE) of the server's slice query


class SizeBench:
    def __init__(self, h: Harness, times: ServerTimes, work: Path, files: int, log: Callable[[str], None]) -> None:
        self.h, self.times, self.log = h, times, log
        self.files = files
        self.name = f"bench-filescoped-{files * PER_FILE}"
        self.dir = work / f"config-{files * PER_FILE}"
        self.data = work / f"kl-data-{files * PER_FILE}"
        self.target = files // 2
        self.target_file = f"f{self.target}.tf"
        self.res = SizeResult(files, files * PER_FILE, target_file=self.target_file)
        self.kl = str(VENV_BIN / "kl")
        self.tf = str(VENV_BIN / "kl-terraform")
        rc = work / "terraformrc"
        rc.write_text("")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("KL_", "TF_"))
                    and k != "CHECKPOINT_DISABLE"}
        self.env.update({"KL_DATA_DIR": str(self.data), "KL_TERRAFORM_BIN": self.tf, "TF_CLI_CONFIG_FILE": str(rc),
                         "TF_IN_AUTOMATION": "1", "CHECKPOINT_DISABLE": "1"})
        self.expected = {f"terraform_data.r{self.target}_{k}" for k in range(PER_FILE)}
        self.seq = 0

    # -- setup --

    def setup(self, *, check_vanilla: bool = True) -> None:
        """Write the configuration and the state, POST it; check that vanilla Terraform (after ``terraform
        init``; neither unless ``check_vanilla``) and ``kl plan -f`` plan nothing before the edit; then edit."""
        r = self.res
        t0 = perf()
        self.dir.mkdir(parents=True)
        (self.dir / "variables.tf").write_text(VARIABLES_TF)
        (self.dir / "backend.tf").write_text(common.http_backend(f"{self.h.base}/v1/states/{self.name}"))
        for i in range(self.files):
            (self.dir / f"f{i}.tf").write_text(file_tf(i))
        body = state_body(self.files, seed=self.files)
        r.generate_seconds = perf() - t0
        r.state_bytes = len(body)
        while not self.h.recorder.done.empty():   # records of kl's requests nobody takes
            self.h.recorder.done.get_nowait()
        r.post_seconds = self.h.request("POST", self.name, body=body).client
        del body
        self.log(f"[{r.instances}] generated {self.files} files and a {r.state_bytes / 1e6:.1f} MB state in "
                 f"{r.generate_seconds:.1f}s; POST {r.post_seconds:.2f}s")
        checked = "not run"
        if check_vanilla:
            self.init()
            check = run(self.vanilla_argv(), cwd=self.dir, env=self.env, ok=(0,), label="vanilla plan (no edit)")
            if "No changes." not in check.output:
                raise BenchError(f"vanilla plan over the unedited configuration did not say 'No changes.':\n"
                                 f"{check.output[-2000:]}")
            r.check_plan_seconds = check.seconds
            checked = f"init {r.init_seconds:.1f}s, no changes ({check.seconds:.1f}s)"
        spec, ran = self.kl_plan(expect_changes=False)
        r.check_kl_seconds = ran.seconds
        self.log(f"[{r.instances}] vanilla init and plan -refresh=false before the edit: {checked}; "
                 f"kl plan -f {self.target_file}: no changes ({ran.seconds:.2f}s)")
        (self.dir / self.target_file).write_text(file_tf(self.target, edited=True))

    def init(self) -> None:
        """``terraform init`` of the whole configuration, which vanilla plans need (``kl plan -f`` does not)."""
        self.res.init_seconds = run([self.tf, "init", "-input=false", "-no-color"], cwd=self.dir, env=self.env,
                                    label="terraform init").seconds

    def vanilla_argv(self) -> list[str]:
        return [self.tf, "plan", "-refresh=false", "-input=false", "-no-color", "-detailed-exitcode"]

    # -- runs --

    def kl_argv(self, out: Path, shim: bool) -> list[str]:
        args = ["plan", "-f", self.target_file, "--out", str(out)]
        return [sys.executable, "-c", SHIM, *args] if shim else [self.kl, *args]

    def kl_plan(self, *, expect_changes: bool = True, cold: bool = False, shim: Path | None = None,
                profile: Path | None = None) -> tuple[dict[str, Any], Ran]:
        if cold:
            (self.data / "hcl-cache.pickle").unlink(missing_ok=True)
        self.seq += 1
        out = self.dir.parent / f"{self.name}-{self.seq}.igplan"
        env = dict(self.env)
        if shim is not None:
            env["KL_BENCH_TIMINGS"] = str(shim)
        if profile is not None:
            env["KL_BENCH_PROFILE"] = str(profile)
        mark = self.times.mark()
        ran = run(self.kl_argv(out, shim is not None), cwd=self.dir, env=env, label=f"kl plan -f {self.target_file}")
        server = self.times.since(mark)
        spec = json.loads(out.read_text())
        out.unlink()
        self.check_spec(spec, ran, expect_changes)
        if expect_changes and shim is None and profile is None:
            self.res.server_edges.append(sum(s for what, s, _ in server if what == "edges_touching"))
            self.res.server_slice.append(sum(s for what, s, _ in server if what == "slice_state"))
            self.res.edges_calls.append(sum(1 for what, _, _ in server if what == "edges_touching"))
            self.res.slice_bytes = sum(n for what, _, n in server if what == "slice_state")
            self.res.slice_globs = len(spec.get("slice_globs", []))
            self.res.slice_glob_list = list(spec.get("slice_globs", []))
            self.res.slice_instances = len(spec.get("write_set", [])) + len(spec.get("read_set", []))
            cache = self.data / "hcl-cache.pickle"
            self.res.cache_bytes = cache.stat().st_size if cache.exists() else 0
            self.res.workspace_files = sorted({*spec.get("files", {})})
        return spec, ran

    def check_spec(self, spec: dict[str, Any], ran: Ran, expect_changes: bool) -> None:
        write_set = set(spec.get("write_set", []))
        actions = spec.get("actions", {})
        if expect_changes:
            if write_set != self.expected or set(actions.values()) != {"update"} or set(actions) != self.expected:
                raise BenchError(f"kl plan -f {self.target_file} did not plan exactly {PER_FILE} updates of its own "
                                 f"resources (write set {len(write_set)}, actions {sorted(set(actions.values()))}):\n"
                                 f"{ran.output[-2000:]}")
        elif write_set or actions:
            raise BenchError(f"kl plan -f {self.target_file} planned changes before the edit:\n{ran.output[-2000:]}")
        if spec.get("mode") != "files":
            raise BenchError(f"kl plan -f wrote a {spec.get('mode')!r} plan, not a file-scoped one")

    def vanilla(self, timeout: float | None = None) -> Ran:
        """Vanilla ``terraform plan -refresh=false`` of the edited configuration; ``TimedOut`` past ``timeout``."""
        ran = run(self.vanilla_argv(), cwd=self.dir, env=self.env, ok=(2,), label="vanilla terraform plan",
                  timeout=timeout)
        if f"Plan: 0 to add, {PER_FILE} to change, 0 to destroy." not in ran.output:
            raise BenchError(f"vanilla terraform plan did not plan {PER_FILE} changes:\n{ran.output[-2000:]}")
        return ran

    def round(self, rep: int, sz: Sizes) -> None:
        r = self.res
        r.load.append(os.getloadavg()[0])
        if rep < sz.kl_reps:
            _, cold = self.kl_plan(cold=True)
            _, warm = self.kl_plan()
            r.kl_cold.append(cold.seconds)
            r.kl_cold_cpu.append(cold.cpu)
            r.kl_warm.append(warm.seconds)
            r.kl_warm_cpu.append(warm.cpu)
        line = f"[{r.instances}] round {rep + 1}: kl plan -f cold {r.kl_cold[-1]:.2f}s, warm {r.kl_warm[-1]:.2f}s"
        if rep < sz.tf_reps:
            ran = self.vanilla()
            r.tf.append(ran.seconds)
            r.tf_cpu.append(ran.cpu)
            line += f"; vanilla terraform plan {ran.seconds:.2f}s"
        self.log(line)

    def shim_round(self) -> None:
        for cold, bucket in ((True, self.res.shim_cold), (False, self.res.shim_warm)):
            timings = self.dir.parent / f"{self.name}-{self.seq}.timings.json"
            _, ran = self.kl_plan(cold=cold, shim=timings)
            bucket.append(shim_phases(ran, timings))
        self.log(f"[{self.res.instances}] shim: cold {self.res.shim_cold[-1]['total']:.2f}s, "
                 f"warm {self.res.shim_warm[-1]['total']:.2f}s")

    def explain_slice(self) -> None:
        """EXPLAIN (ANALYZE) of the query ``graph.slice_state`` runs for this size's slice globs, if the
        server code still has it (the bench reads the module's query text; it does not copy it)."""
        query, patterns_of = getattr(graph, "_SLICE_ROWS", None), getattr(graph, "glob_patterns", None)
        if query is None or patterns_of is None:
            self.res.slice_explain = ["(the slice is now looked up by app.store.graph._UNDER_GLOBS: one index range "
                                      "scan per glob prefix; its time is the server: slice row above)"]
            return
        from analyzer.globs import parse_glob

        exact, patterns, _ = patterns_of([parse_glob(g) for g in self.res.slice_glob_list])
        state_id = self.h.side.execute("SELECT id FROM states WHERE name = %s", (self.name,)).fetchone()
        assert state_id is not None
        rows = self.h.side.execute("EXPLAIN (ANALYZE, BUFFERS) " + query, (state_id[0], exact, patterns)).fetchall()
        keep = ("Scan", "Rows Removed", "Execution Time", "Gather", "Buffers")
        self.res.slice_explain = [re.sub(r"\('\{.*?\}'::text\[\]\)", "(...)", r[0]).strip()
                                  for r in rows if any(k in r[0] for k in keep)]

    def profile(self, path: Path) -> None:
        timings = self.dir.parent / f"{self.name}-profile.timings.json"
        self.kl_plan(shim=timings, profile=path)


# --- profile report ------------------------------------------------------------------------------------


def profile_rows(path: Path, top: int = 15) -> list[list[str]]:
    stats = pstats.Stats(str(path), stream=io.StringIO())
    entries = []
    for (filename, line, func), (_cc, nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        short = filename
        for marker in ("/site-packages/", str(REPO) + "/", "/lib/python3"):
            if marker in filename:
                short = filename.split(marker, 1)[1]
                break
        entries.append((tt, ct, nc, f"{short}:{line}({func})"))
    entries.sort(reverse=True)
    return [[name, str(nc), f"{tt * 1e3:.0f}", f"{ct * 1e3:.0f}"] for tt, ct, nc, name in entries[:top]]


# --- report --------------------------------------------------------------------------------------------


def s(seconds: float) -> str:
    return f"{seconds:.2f}"


def med(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def spread(values: Sequence[float]) -> str:
    return f"{s(med(values))} ({s(min(values))}-{s(max(values))})" if values else "-"


def growth(small: float, large: float) -> str:
    return f"{(large / small - 1) * 100:+.0f}%"


@dataclass
class Result:
    sizes: dict[str, Any]
    terraform: str = ""
    results: list[SizeResult] = field(default_factory=list)
    profile: list[list[str]] = field(default_factory=list)
    profile_total: float = 0.0


def headline_table(res: Result) -> str:
    small, large = res.results[0], res.results[-1]
    head = ["", *(f"{r.instances:,} instances ({r.files} files)" for r in res.results),
            f"growth {small.instances:,} -> {large.instances:,}"]
    rows = []
    for label, get in (("`kl plan -f`, cold parse cache", lambda r: r.kl_cold),
                       ("`kl plan -f`, warm parse cache", lambda r: r.kl_warm),
                       ("vanilla `terraform plan -refresh=false` (init excluded)", lambda r: r.tf)):
        rows.append([label, *(spread(get(r)) for r in res.results), growth(med(get(small)), med(get(large)))])
    rows.append(["vanilla / `kl plan -f` warm (median)",
                 *(f"{med(r.tf) / med(r.kl_warm):.1f}x" for r in res.results), ""])
    for label, get in (("CPU s, `kl plan -f` warm (kl + Terraform)", lambda r: r.kl_warm_cpu),
                       ("CPU s, vanilla `terraform plan`", lambda r: r.tf_cpu)):
        rows.append([label, *(s(med(get(r))) for r in res.results), growth(med(get(small)), med(get(large)))])
    return table(head, rows)


def phase_medians(runs: Sequence[dict[str, float]]) -> dict[str, float]:
    return {phase: med([p.get(phase, 0.0) for p in runs]) for phase in [*PHASES, "total", "of which GC pauses"]}


def phase_table(res: Result) -> str:
    small, large = res.results[0], res.results[-1]
    head = ["phase (median s, exclusive)"]
    cols: list[dict[str, float]] = []
    for r in res.results:
        head += [f"{r.instances:,} cold", f"{r.instances:,} warm"]
        cols += [phase_medians(r.shim_cold), phase_medians(r.shim_warm)]
    head += ["growth, cold", "growth, warm"]
    deltas = [(phase_medians(large.shim_cold), phase_medians(small.shim_cold)),
              (phase_medians(large.shim_warm), phase_medians(small.shim_warm))]
    rows = []
    for phase in [*PHASES, "total", "of which GC pauses"]:
        label = f"**{phase}**" if phase == "total" else phase
        rows.append([label, *(f"{c[phase]:.3f}" for c in cols), *(f"{a[phase] - b[phase]:+.3f}" for a, b in deltas)])
    return table(head, rows)


# What each phase that can grow with the configuration or the state does, for the reading.
GROWS = {
    "read every .tf file": "reads every .tf file of the configuration (`read_configuration`)",
    "load the parse cache": "unpickles `KL_DATA_DIR/hcl-cache.pickle`, which holds a prescan of every file "
                            "(one `BlockHeader` dataclass per block)",
    "save the parse cache": "pickles the parse cache back when it changed (always after a cold start)",
    "prescan every file (declaring_files)": "`declaring_files` prescans every file, without the parse cache, on "
                                            "every run, to map trunk dependents to their files",
    "footprint (analyzer)": "`compute_footprint` indexes the top-level blocks of every file: prescans them when "
                            "cold, rebuilds the index from the cached prescans when warm",
    "server: edges (HTTP)": "the server's edges lookup (index range scans under the globs, GIN on dependencies)",
    "server: slice (HTTP)": "the server's slice lookup (one index range scan per glob prefix)",
    "of which GC pauses": "the cyclic garbage collector runs more often as more objects (headers, index entries) "
                          "are alive; these pauses are inside the phases above",
}


def reading(res: Result) -> str:
    small, large = res.results[0], res.results[-1]
    out = []
    tf_ratio = med(large.tf) / med(small.tf)
    out.append(f"Vanilla `terraform plan -refresh=false` grows with the configuration and the state, as it must: "
               f"{s(med(small.tf))} s at {small.instances:,} instances, {s(med(large.tf))} s at {large.instances:,} "
               f"({tf_ratio:.1f}x for {large.instances / small.instances:.0f}x the instances; "
               f"{s(med(large.tf_cpu))} CPU s on {os.cpu_count()} cores). `kl plan -f` plans {PER_FILE} resources at "
               f"both sizes (the slice holds {large.slice_instances} instances, {large.slice_bytes / 1e3:.0f} KB), so "
               f"Terraform's own share (`init` + `plan` + `show` over the minimal workspace) stays flat: ")
    warm_s, warm_l = phase_medians(small.shim_warm), phase_medians(large.shim_warm)
    cold_s, cold_l = phase_medians(small.shim_cold), phase_medians(large.shim_cold)
    tf_phases = ("terraform init", "terraform plan", "terraform show")
    out[-1] += (f"{sum(warm_s[p] for p in tf_phases):.2f} s warm at {small.instances:,}, "
                f"{sum(warm_l[p] for p in tf_phases):.2f} s at {large.instances:,}.")
    grown_warm = warm_l["total"] - warm_s["total"]
    grown_cold = cold_l["total"] - cold_s["total"]
    movers = sorted(((warm_l[p] - warm_s[p], cold_l[p] - cold_s[p], p) for p in PHASES), reverse=True)
    lines = []
    for dw, dc, p in movers:
        if max(dw, dc) < 0.02:
            continue
        what = GROWS.get(p, "")
        lines.append(f"- **{p}**: {dw:+.2f} s warm, {dc:+.2f} s cold" + (f": {what}." if what else "."))
    gc_w = warm_l["of which GC pauses"] - warm_s["of which GC pauses"]
    if gc_w >= 0.02:
        lines.append(f"- of which **GC pauses**: {gc_w:+.2f} s warm: {GROWS['of which GC pauses']}.")
    out.append(f"What grows is Kilolock's own work around Terraform. Under the timing shim the whole run grows by "
               f"{grown_warm:+.2f} s warm and {grown_cold:+.2f} s cold from {small.instances:,} to "
               f"{large.instances:,} instances; the phases that grow by 20 ms or more:\n\n"
               + ("\n".join(lines) if lines else "- none."))
    if large.slice_explain:
        out.append(f"The server's slice query at {large.instances:,} instances, `EXPLAIN (ANALYZE, BUFFERS)` with this "
                   f"run's {large.slice_globs} slice globs (array literals elided):\n\n```\n"
                   + "\n".join(large.slice_explain) + "\n```")
    return "\n\n".join(out)


def setup_table(res: Result) -> str:
    head = ["", *(f"{r.instances:,} instances" for r in res.results)]
    rows = [
        ["files (100 resources each, + variables.tf, backend.tf)", *(str(r.files) for r in res.results)],
        ["state body (v4 JSON, indented like Terraform's)", *(f"{r.state_bytes / 1e6:.1f} MB" for r in res.results)],
        ["generate configuration + state", *(f"{s(r.generate_seconds)} s" for r in res.results)],
        ["load the state: one POST /v1/states/NAME", *(f"{s(r.post_seconds)} s" for r in res.results)],
        ["terraform init (once; excluded from the plan times)", *(f"{s(r.init_seconds)} s" for r in res.results)],
        ["check: vanilla plan -refresh=false before the edit", *(f"no changes, {s(r.check_plan_seconds)} s"
                                                               for r in res.results)],
        ["check: kl plan -f before the edit (first run)", *(f"no changes, {s(r.check_kl_seconds)} s"
                                                          for r in res.results)],
        ["edited file", *(r.target_file for r in res.results)],
        ["kl plan -f: slice globs / instances in the workspace", *(f"{r.slice_globs} / {r.slice_instances}"
                                                                   for r in res.results)],
        ["kl plan -f: slice body from the server", *(f"{r.slice_bytes / 1e3:.0f} KB" for r in res.results)],
        ["kl plan -f: files the workspace was cut from", *(", ".join(r.workspace_files) for r in res.results)],
        ["server: edges_touching per kl plan -f (calls x median ms)",
         *(f"{med(r.edges_calls):.0f} x {med(r.server_edges) * 1e3 / max(med(r.edges_calls), 1):.0f}"
           for r in res.results)],
        ["server: slice_state per kl plan -f (median ms)", *(f"{med(r.server_slice) * 1e3:.0f}" for r in res.results)],
        ["parse cache file after a run (hcl-cache.pickle)", *(f"{r.cache_bytes / 1e3:.0f} KB" for r in res.results)],
        ["1-minute load average before the rounds (min-max)", *(f"{min(r.load):.2f}-{max(r.load):.2f}"
                                                                for r in res.results)],
    ]
    return table(head, rows)


def verdicts(res: Result) -> list[str]:
    small, large = res.results[0], res.results[-1]
    lines = []
    for label, get in (("cold", lambda r: r.kl_cold), ("warm", lambda r: r.kl_warm)):
        big = med(get(large))
        g = med(get(large)) / med(get(small)) - 1
        best = min(get(large)) / min(get(small)) - 1
        lines.append(f"- `kl plan -f`, {label} parse cache, at {large.instances:,} instances: median {s(big)} s "
                     f"(target <= {TARGET_SECONDS:.0f} s: {'met' if big <= TARGET_SECONDS else 'MISSED'}); growth "
                     f"from {small.instances:,} to {large.instances:,} instances {g * 100:+.0f}% (target < "
                     f"{TARGET_GROWTH * 100:.0f}%: {'met' if g < TARGET_GROWTH else 'MISSED'}; the best runs: "
                     f"{s(min(get(small)))} s -> {s(min(get(large)))} s, {best * 100:+.0f}%).")
    return lines


def render(command: str, machine: list[tuple[str, str]], res: Result, elapsed: float, sz: Sizes) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    large = res.results[-1]
    profile = ""
    if res.profile:
        profile = (f"\n\nOne more warm `kl plan -f` at {large.instances:,} instances under `cProfile` (the `kl` "
                   f"process only; {s(res.profile_total)} s under the profiler), top functions by own time:\n\n"
                   + table(["function", "calls", "own ms", "cumulative ms"], res.profile))
    return f"""{SECTION}

Produced by `bench/filescoped_bench.py` on {when} in {elapsed:.0f} s (see `bench/README.md`). The real Flask app
(`app.web.create_app`) runs on a threaded werkzeug server on a loopback port in the benchmark process, over a
scratch database on the Postgres below (`bench.backend_bench.Harness`); `kl` and Terraform run as
subprocesses, as a user runs them. Every Terraform command, `kl`'s included (`KL_TERRAFORM_BIN`), is the
embedded `kl-terraform` ({res.terraform}).

### Machine

{table(["", "value"], machine)}

### Command

```
{command}
```

### Method

For each size, a configuration of `terraform_data` resources, {PER_FILE} per file (`f123.tf` declares `r123_0`
.. `r123_99`, each `input = "${{var.prefix}}-f123-K"`), plus `variables.tf` (`prefix`) and `backend.tf` (the
`http` backend on the server), and the matching state generated directly as a v4 file in the shape Terraform
1.15 stores `terraform_data` (taken from a real apply: `schema_version` 0, `id`, `input`/`output` as
`{{value, type}}`, `triggers_replace` null, `sensitive_attributes` [], `identity_schema_version` 0), loaded with
one POST. Before the edit, vanilla `terraform plan -refresh=false -detailed-exitcode` over the full
configuration reports no changes, so the generated state is accepted as is, and `kl plan -f` of the file
to be edited plans nothing. Then every `input` of the middle file is changed ({PER_FILE} resources) and,
alternating between the two sizes round by round so both see the same machine:

- `kl plan -f FILE --out X` in the configuration directory: the `kl` CLI process end to end, wall clock from
  spawn to exit. *Cold*: `KL_DATA_DIR/hcl-cache.pickle` deleted just before; *warm*: the run right after.
  (Python's bytecode and the OS page cache are warm in both.) {sz.kl_reps} runs each; each artifact is checked: its
  write set is exactly the file's {PER_FILE} addresses, each an `update`.
- vanilla `terraform plan -refresh=false -input=false -detailed-exitcode` over the full configuration, on the
  same state through the HTTP backend (state locking on, as a user runs it), `terraform init` excluded (run
  once before). {sz.tf_reps} runs; each must report `0 to add, {PER_FILE} to change, 0 to destroy`.

Cells are median (min-max). CPU seconds are user + system of the process and the children it waited for.

### Results

{headline_table(res)}

{chr(10).join(verdicts(res))}

### Where `kl plan -f` spends its time

The same command under a timing shim (`runner.cli.main` with timers wrapped around its phases, in the `kl`
process; each phase's time excludes the phases nested in it), cold and warm, median of {sz.shim_reps} runs each.
"server: … (HTTP)" is the client's side of the request; the server's own time in `graph.edges_touching` and
`graph.slice_state` is in the next table. "other" is what no timer covers.

{phase_table(res)}{profile}

### Setup and the workspace

{setup_table(res)}

### Reading

{reading(res)}
"""


# --- main ---------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = common.bench_parser("filescoped_bench", __doc__ or "", section=SECTION, default_out=DEFAULT_OUT,
                     quick_help=f"smoke test: {', '.join(str(f * PER_FILE) for f in QUICK.files)} instances; "
                                "writes no document unless --out is given")
    p.add_argument("--keep", action="store_true", help="keep the scratch working directory (configurations, data)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out, command = common.start_run(args, "filescoped_bench", argv)
    sz = QUICK if args.quick else FULL

    started = perf()
    work = Path(tempfile.mkdtemp(prefix="kl-bench-filescoped-"))
    res = Result(sizes=asdict(sz))
    times = ServerTimes()
    try:
        machine = common.machine_info(args.database_url)
        with Harness(args.database_url) as h, server_timers(times):
            log(f"scratch database {h.dbname}, server {h.base}, work {work}")
            benches = [SizeBench(h, times, work, files, log) for files in sz.files]
            res.terraform = run([benches[0].tf, "version"], cwd=work, env=benches[0].env).output.splitlines()[0].strip()
            for b in benches:
                b.setup()
            for rep in range(max(sz.kl_reps, sz.tf_reps)):
                for b in benches:
                    b.round(rep, sz)
            for _ in range(sz.shim_reps):
                for b in benches:
                    b.shim_round()
            for b in benches:
                b.explain_slice()
            prof = work / "kl-plan-f.prof"
            benches[-1].profile(prof)
            res.profile = profile_rows(prof)
            res.profile_total = pstats.Stats(str(prof), stream=io.StringIO()).total_tt  # type: ignore[attr-defined]
            res.results = [b.res for b in benches]
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
    machine.insert(4, ("Terraform", f"{res.terraform} (embedded kl-terraform)"))

    print("Machine: " + "; ".join(f"{k}: {v}" for k, v in machine), end="\n\n")
    print(headline_table(res), end="\n\n")
    print("\n".join(verdicts(res)), end="\n\n")
    print(phase_table(res), end="\n\n")
    print(table(["function", "calls", "own ms", "cumulative ms"], res.profile), end="\n\n")
    print(setup_table(res), end="\n\n")
    print(reading(res), end="\n\n")
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(res), indent=1))
    if out is not None:
        common.write_section(out, SECTION, render(command, machine, res, elapsed, sz))
        print(f"wrote the '{SECTION}' section of {out}")
    print(f"done in {elapsed:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
