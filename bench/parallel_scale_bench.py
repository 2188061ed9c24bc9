"""Parallel applies on a large shared state: eight disjoint file-scoped applies (``kl plan -f`` then
``kl apply``) on a state of 50,000 instances, all together, against one alone and one after another.

Run from the repository root:

    .venv/bin/python -m bench.parallel_scale_bench                  # 50,000 instances, sleep 10 s; rewrites its section
    .venv/bin/python -m bench.parallel_scale_bench --quick          # 2,000 instances, sleep 2 s; prints only
    .venv/bin/python -m bench.parallel_scale_bench --instances 10000 --out /tmp/p.md

The configuration is ``bench.parallel_apply_bench``'s (8 modules ``module.m0`` .. ``module.m7``, each one
``terraform_data`` whose ``local-exec`` provisioner sleeps ``var.sleep`` seconds when its version is bumped),
with each module in its own file ``m{i}.tf`` and a ``filler.tf`` declaring ``terraform_data.filler`` with
``count = var.filler`` (``input = "f-${count.index}"``). The trunk is created by a vanilla ``terraform
apply`` of the modules (filler 0); the filler's instances are then added to the state in the shape
Terraform 1.15 stores ``terraform_data`` and POSTed at the next serial, so the state holds ``--instances``
filler instances plus the modules without a 50,000-resource apply.

For N = 1 and N = 8: N checkouts each bump a different module; all N ``kl apply -f m{i}.tf --confirm-scope``
(file-scoped: plan and apply in one command) start together and the wall time until the last one ends is
taken; then N fresh bumps are applied one after another. Every
apply must exit 0 and show up as ``committed``; at the end vanilla ``terraform plan -detailed-exitcode
-refresh=false`` over the merged configuration (all 50,000 filler instances included) must report no changes.
CPU seconds are reported per round: the applies' process trees (``RUSAGE_CHILDREN``) and this process, which
runs the server (``RUSAGE_SELF``).
"""

from __future__ import annotations

import json
import resource
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import common
from bench.backend_bench import Harness
from bench.common import DEFAULT_OUT, BenchError, table
from bench.parallel_apply_bench import (
    MODULE_TF,
    Bench,
    Proc,
    Round,
    Sizes,
    children_cpu,
    load1,
    run_checked,
    spawn,
)
from bench.states import PROVIDER

SECTION = "## Parallel applies on a large state"
TARGET_RATIO = 1.5
perf = time.perf_counter


@dataclass(frozen=True)
class Scale:
    instances: int
    sleep: int


FULL = Scale(instances=50_000, sleep=10)
QUICK = Scale(instances=2_000, sleep=2)

FILLER_TF = """variable "filler" {{
  type    = number
  default = {count}
}}

resource "terraform_data" "filler" {{
  count = var.filler
  input = "f-${{count.index}}"
}}
"""


def module_tf(i: int, version: int) -> str:
    return (f'variable "v{i}" {{\n  type    = string\n  default = "{version}"\n}}\n\n'
            f'module "m{i}" {{\n  source  = "./modules/svc"\n  release = var.v{i}\n  sleep   = var.sleep\n}}\n')


class ScaleBench(Bench):
    """``Bench`` with one file per module, the filler, and file-scoped plans."""

    def __init__(self, h: Harness, work: Path, scale: Scale, log: Any) -> None:
        super().__init__(h, work, Sizes(sleep=scale.sleep, ns=(1, 8), overhead_reps=0), log)
        self.filler = scale.instances
        self.module_of: dict[str, int] = {}
        self.final_plan_seconds = 0.0

    def checkout(self, name: str, versions: Sequence[int], *, backend: bool = True, filler: int | None = None,
                 sleep: int = 0) -> Path:
        d = self.work / name
        (d / "modules" / "svc").mkdir(parents=True)
        (d / "modules" / "svc" / "main.tf").write_text(MODULE_TF)
        (d / "main.tf").write_text(f'variable "sleep" {{\n  type    = number\n  default = {sleep}\n}}\n')
        for i, v in enumerate(versions):
            (d / f"m{i}.tf").write_text(module_tf(i, v))
        (d / "filler.tf").write_text(FILLER_TF.format(count=self.filler if filler is None else filler))
        if backend:
            (d / "backend.tf").write_text(common.http_backend(self.address))
        return d

    def prepare(self, module: int, sleep: int, tag: str) -> tuple[Path, str, list[int]]:
        """A fresh checkout bumping one module; ``kl apply -f`` plans and applies it in one go."""
        self.seq += 1
        versions = self.bumped(module)
        actor = f"bench-{tag}-m{module}-{self.seq}"
        d = self.checkout(f"{tag}-m{module}-{self.seq}", versions, sleep=sleep)
        self.module_of[actor] = module
        return d, actor, versions

    def spawn_apply(self, d: Path, actor: str, *, shim: Path | None = None) -> Proc:
        module = self.module_of[actor]
        self.actors.append(actor)
        return spawn(actor, [self.kl, "apply", "-f", f"m{module}.tf", "--confirm-scope", "--actor", actor],
                     cwd=d, env=self.env)

    def create_trunk(self) -> float:
        d = self.checkout("trunk", self.versions, filler=0)
        run_checked("terraform init (trunk)", [self.tf, "init", "-input=false", "-no-color"], cwd=d, env=self.env)
        proc = run_checked("terraform apply (trunk)", [self.tf, "apply", "-auto-approve", "-input=false",
                                                       "-no-color", "-var", "sleep=0"], cwd=d, env=self.env)
        head = self.h.session.get(self.address, timeout=600)
        doc = json.loads(head.content)
        doc["serial"] += 1
        doc["resources"].append({"mode": "managed", "type": "terraform_data", "name": "filler", "provider": PROVIDER,
                                 "instances": [filler_instance(i) for i in range(self.filler)]})
        self.h.request("POST", "bench-parallel", body=(json.dumps(doc, indent=2) + "\n").encode())
        return proc.seconds

    def final_check(self, scope: str = "full") -> tuple[int, int]:
        """Vanilla ``terraform plan -detailed-exitcode -refresh=false`` over the merged configuration: the
        state must hold every commit (no changes). Without refresh: ``terraform_data``'s read returns its
        state unchanged, so refreshing the 50,000 filler instances checks nothing more and takes most of
        the plan's time. ``scope="modules"`` targets the eight modules the applies changed (``-target``):
        the same check of every commit, without Terraform planning the filler's ``count``."""
        d = self.checkout("merged", self.versions)
        run_checked("terraform init (merged)", [self.tf, "init", "-input=false", "-no-color"], cwd=d, env=self.env)
        targets = [f"-target=module.m{i}" for i in range(len(self.versions))] if scope == "modules" else []
        proc = spawn("terraform plan (merged)", [self.tf, "plan", "-detailed-exitcode", "-refresh=false",
                                                 "-input=false", "-no-color", "-var", f"sleep={self.sz.sleep}",
                                                 *targets],
                     cwd=d, env=self.env).wait()
        if proc.rc != 0:
            raise BenchError(f"terraform plan -detailed-exitcode over the merged configuration exited {proc.rc}:\n"
                             f"{proc.output[-3000:]}")
        self.final_plan_seconds = proc.seconds
        head = self.h.session.get(self.address, timeout=60)
        return proc.rc, int(json.loads(head.content)["serial"])


def server_cpu() -> float:
    """CPU seconds of this process so far: the server's threads (and the benchmark's own few requests)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def filler_instance(i: int) -> dict[str, Any]:
    value = f"f-{i}"
    return {"index_key": i, "schema_version": 0, "attributes": {
        "id": str(uuid.uuid5(uuid.NAMESPACE_OID, value)), "input": {"value": value, "type": "string"},
        "output": {"value": value, "type": "string"}, "triggers_replace": None},
        "sensitive_attributes": [], "identity_schema_version": 0}


@dataclass
class ScaleResult:
    instances: int
    sleep: int
    terraform: str = ""
    rounds: list[Round] = field(default_factory=list)
    final_serial: int = 0
    applies: int = 0
    server_cpu: dict[int, float] = field(default_factory=dict)  # N -> CPU seconds of the server process in round N
    final_plan: float = 0.0
    final_scope: str = "full"


def render(command: str, machine: list[tuple[str, str]], res: ScaleResult, elapsed: float) -> str:
    one = next(r for r in res.rounds if r.n == 1)
    eight = next(r for r in res.rounds if r.n == 8)
    alone = one.parallel_wall
    rows = [
        ["1 alone", f"{alone:.2f} s", "1.00x"],
        ["8 together", f"{eight.parallel_wall:.2f} s", f"{eight.parallel_wall / alone:.2f}x"],
        ["8 one after another (sum of the applies)", f"{eight.serial_wall:.2f} s", f"{eight.serial_wall / alone:.2f}x"],
    ]
    each = table(["apply (8 together)", "seconds", "to reserved", "to applying", "terraform apply", "to exit"],
                 [[t.label, f"{t.seconds:.2f}", f"{t.to_reserved:.2f}", f"{t.to_applying:.2f}",
                   f"{t.terraform_apply:.2f}", f"{t.to_exit:.2f}"] for t in eight.parallel])
    ratio = eight.parallel_wall / alone
    return "\n".join([
        SECTION, "",
        "Produced by `bench/parallel_scale_bench.py` (module docstring: method). Command:", "",
        f"    {command}", "",
        table(["machine", ""], [[k, v] for k, v in machine]), "",
        f"State: {res.instances:,} filler instances plus 8 modules; each apply replaces one module's resource, "
        f"whose provisioner sleeps {res.sleep} s; each is one `kl apply -f m<i>.tf --confirm-scope` (plan and "
        "apply). Run time "
        f"{elapsed / 60:.1f} min; {res.applies} applies, all committed; the trunk ended at serial "
        f"{res.final_serial} and vanilla `terraform plan -refresh=false` over the merged configuration"
        + (" (targeting the eight modules)" if res.final_scope == "modules" else "")
        + f" showed no changes ({res.final_plan:.0f} s).", "",
        table(["", "wall", "vs one alone"], rows), "",
        each, "",
        f"CPU seconds of the applies (kl, Terraform and the provisioners, as their process trees): one alone "
        f"{one.parallel_cpu:.1f} s; the 8 together {eight.parallel_cpu:.1f} s ({eight.parallel_cpu / 8:.1f} s each). "
        f"The server process: {res.server_cpu.get(1, 0.0):.1f} s for the N = 1 round, "
        f"{res.server_cpu.get(8, 0.0):.1f} s for the N = 8 round (both include the one-after-another applies).", "",
        f"Target: 8 together ≤ {TARGET_RATIO}× one alone: {'met' if ratio <= TARGET_RATIO else 'missed'} "
        f"({ratio:.2f}×). Load average before the 8 started: {eight.load_before:.2f}.", "",
    ]) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = common.bench_parser("parallel_scale_bench", __doc__ or "", section=SECTION, default_out=DEFAULT_OUT,
                     quick_help=f"{QUICK.instances:,} instances, sleep {QUICK.sleep} s; writes no document unless "
                                "--out is given")
    p.add_argument("--instances", type=int, default=None, help="filler instances in the state")
    p.add_argument("--final-plan", choices=("full", "modules"), default="full",
                   help="the closing vanilla plan: the whole merged configuration (default), or -target of the "
                        "eight changed modules (Terraform then skips planning the filler's count)")
    args = p.parse_args(argv)
    out, command = common.start_run(args, "parallel_scale_bench", argv)
    scale = QUICK if args.quick else FULL
    if args.instances:
        scale = Scale(instances=args.instances, sleep=scale.sleep)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    started = perf()
    work = Path(tempfile.mkdtemp(prefix="kl-bench-pscale-"))
    res = ScaleResult(scale.instances, scale.sleep)
    try:
        machine = common.machine_info(args.database_url)
        with Harness(args.database_url) as h:
            b = ScaleBench(h, work, scale, log)
            res.terraform = run_checked("kl-terraform version", [b.tf, "version"], cwd=work,
                                        env=b.env).output.splitlines()[0].strip()
            b.create_trunk()
            log(f"trunk created with {scale.instances:,} filler instances")
            for n in (1, 8):
                cpu, own = children_cpu(), server_cpu()
                res.rounds.append(b.round(n))
                res.server_cpu[n] = server_cpu() - own
                log(f"  N={n}: load {load1():.2f}, children CPU {children_cpu() - cpu:.1f} s, "
                    f"server {res.server_cpu[n]:.1f} s")
            b.check_runs(b.actors)
            res.applies = len(b.actors)
            res.final_scope = args.final_plan
            _, res.final_serial = b.final_check(args.final_plan)
            res.final_plan = b.final_plan_seconds
            if res.final_serial != 2 + len(b.actors):
                raise BenchError(f"the trunk is at serial {res.final_serial}, expected {2 + len(b.actors)}")
    except BenchError as exc:
        log(f"benchmark failed: {exc}; the working directory is kept in {work}")
        return 1
    except KeyboardInterrupt as exc:
        log(f"interrupted ({exc})")
        shutil.rmtree(work, ignore_errors=True)
        return 130
    shutil.rmtree(work, ignore_errors=True)
    machine.append(("Load average at end", common.load_average()))
    machine.append(("Terraform", res.terraform))
    section = render(command, machine, res, perf() - started)
    print(section)
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(res), indent=1))
    if out is not None:
        common.write_section(out, SECTION, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
