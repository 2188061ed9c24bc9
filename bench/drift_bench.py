"""Drift benchmark: ``kl drift -f FILE`` of one 100-resource file on a large state, against vanilla
``terraform plan -refresh-only`` over the whole state, side by side in one run.

Run from the repository root:

    .venv/bin/python -m bench.drift_bench                          # 5,000 and 50,000 instances
    .venv/bin/python -m bench.drift_bench --sizes 2000,10000       # other sizes (instances)
    .venv/bin/python -m bench.drift_bench --quick                  # 1,000 and 2,000 instances; prints only

For each size the script generates, in a temporary directory, a configuration of 100-resource files: most
declare ``terraform_data`` resources (``f{i}.tf``), and one file in ten declares ``fakecloud_bucket`` objects
of the test provider (``c{j}.tf``, installed from a filesystem mirror as the test suite does), so the state
holds some thousands of remote objects that a refresh really reads. The state is generated directly (the
bucket rows cloned from one a real apply wrote) and loaded with one POST through the HTTP backend; the cloud's
objects are written as files. One bucket of ``c0.tf`` is then changed behind Terraform's back.

Then, alternating between the sizes: (a) ``kl drift -f c0.tf --json`` end to end as a CLI process, which must
exit 2 naming exactly that bucket and ``size``; (b) vanilla ``terraform plan -refresh-only -detailed-exitcode``
over the full configuration through the HTTP backend (``init`` excluded, done once), which must exit 2.
The section is written to docs/benchmarks.md only for a full run (or with ``--out``).
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import common
from bench.backend_bench import Harness
from bench.common import DEFAULT_OUT, REPO, BenchError, log, table

SECTION = "## Drift checks"
PER_FILE = 100
CLOUD_EVERY = 10       # one file in ten holds fakecloud buckets
REPS = 3
TF_PROVIDER = 'provider["terraform.io/builtin/terraform"]'


def data_file(i: int) -> str:
    return "\n".join(f'resource "terraform_data" "r{i}_{k}" {{\n  input = "v-{i}-{k}"\n}}\n' for k in range(PER_FILE))


def cloud_file(j: int) -> str:
    return "\n".join(f'resource "fakecloud_bucket" "b{j}_{k}" {{\n  name = "b{j}-{k}"\n  size = 1\n}}\n'
                     for k in range(PER_FILE))


@dataclass
class Ran:
    rc: int
    out: str
    seconds: float


def run(argv: list[str], *, cwd: Path, env: dict[str, str], ok: tuple[int, ...] = (0,)) -> Ran:
    started = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=3600)
    ran = Ran(proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - started)
    if proc.returncode not in ok:
        raise BenchError(f"{shlex.join(argv)} exited {proc.returncode}:\n{ran.out[-3000:]}")
    return ran


@dataclass
class SizeResult:
    instances: int
    cloud_objects: int
    kl: list[float] = field(default_factory=list)
    vanilla: list[float] = field(default_factory=list)


class SizeBench:
    def __init__(self, h: Harness, work: Path, instances: int, installed: Any, log: Any) -> None:
        self.files = max(instances // PER_FILE, CLOUD_EVERY)
        self.name = f"drift{instances}"
        self.dir = work / self.name
        self.cloud_root = work / f"{self.name}-cloud"
        self.url = f"{h.base}/v1/states/{self.name}"
        self.log = log
        kl_tf = str(Path(sys.executable).with_name("kl-terraform"))
        self.tf = kl_tf
        self.env = {"PATH": os.environ["PATH"], "HOME": str(work), "TF_IN_AUTOMATION": "1", "CHECKPOINT_DISABLE": "1",
                    "KL_TERRAFORM_BIN": kl_tf, "KL_DATA_DIR": str(work / f"{self.name}-kl"), "KL_ACTOR": "bench",
                    **installed.env(self.cloud_root)}
        self.res = SizeResult(self.files * PER_FILE, len(self.cloud_files()) * PER_FILE)

    def cloud_files(self) -> list[int]:
        return [j for j in range(self.files) if j % CLOUD_EVERY == 0]

    def _template(self, installed: Any) -> dict[str, Any]:
        """One bucket's state entry as Terraform writes it (a real apply in a scratch directory)."""
        from bench.fakecloud.install import required_providers

        scratch = self.dir.parent / f"{self.name}-template"
        scratch.mkdir()
        (scratch / "main.tf").write_text(required_providers() + 'resource "fakecloud_bucket" "t" {\n'
                                         '  name = "template"\n  size = 1\n}\n')
        env = {**self.env, "FAKECLOUD_ROOT": str(scratch / "cloud")}
        run([self.tf, "init", "-input=false"], cwd=scratch, env=env)
        run([self.tf, "apply", "-auto-approve", "-input=false"], cwd=scratch, env=env)
        doc = json.loads((scratch / "terraform.tfstate").read_text())
        found: dict[str, Any] = doc["resources"][0]
        return found

    def setup(self, installed: Any) -> None:
        from bench.fakecloud.cloud import Cloud

        template = self._template(installed)
        self.dir.mkdir()
        (self.dir / "backend.tf").write_text(common.http_backend(self.url))
        from bench.fakecloud.install import required_providers

        (self.dir / "providers.tf").write_text(required_providers() + 'provider "fakecloud" {}\n')
        cloud = Cloud(self.cloud_root)
        resources: list[dict[str, Any]] = []
        for i in range(self.files):
            if i in self.cloud_files():
                (self.dir / f"c{i}.tf").write_text(cloud_file(i))
                for k in range(PER_FILE):
                    name = f"b{i}-{k}"
                    cloud.put("local", "bucket", name, {"size": 1, "labels": None, "secret": None})
                    entry = json.loads(json.dumps(template))
                    entry["name"] = f"b{i}_{k}"
                    attrs = entry["instances"][0]["attributes"]
                    attrs.update(name=name, id=f"bucket-{name}", arn=f"fc:local:bucket/{name}")
                    resources.append(entry)
            else:
                (self.dir / f"f{i}.tf").write_text(data_file(i))
                for k in range(PER_FILE):
                    v = f"v-{i}-{k}"
                    resources.append({"mode": "managed", "type": "terraform_data", "name": f"r{i}_{k}",
                                      "provider": TF_PROVIDER, "instances": [{
                                          "schema_version": 0, "attributes": {
                                              "id": str(uuid.uuid4()), "input": {"value": v, "type": "string"},
                                              "output": {"value": v, "type": "string"}, "triggers_replace": None},
                                          "sensitive_attributes": [], "identity_schema_version": 0}]})
        resources.sort(key=lambda r: (r["type"], r["name"]))
        state = {"version": 4, "terraform_version": "1.15.5", "serial": 1, "lineage": str(uuid.uuid4()),
                 "outputs": {}, "resources": resources, "check_results": None}
        import requests

        answer = requests.post(self.url, data=json.dumps(state).encode(), timeout=600)
        if answer.status_code != 200:
            raise BenchError(f"loading the state answered {answer.status_code}: {answer.text[:300]}")
        run([self.tf, "init", "-input=false"], cwd=self.dir, env=self.env)
        cloud.edit("local", "bucket", "b0-7", size=2)
        self.log(f"{self.name}: {self.res.instances} instances ({self.res.cloud_objects} fakecloud objects), "
                 "one bucket drifted")

    def round(self) -> None:
        kl = run([str(Path(sys.executable).with_name("kl")), "drift", "-f", "c0.tf", "--json"], cwd=self.dir,
                 env=self.env, ok=(2,))
        doc = json.loads(kl.out[kl.out.index("{"):])
        if doc["drifted"] != [{"address": "fakecloud_bucket.b0_7", "attributes": ["size"], "gone": False}]:
            raise BenchError(f"kl drift reported {doc['drifted']}")
        self.res.kl.append(kl.seconds)
        vanilla = run([self.tf, "plan", "-refresh-only", "-detailed-exitcode", "-input=false", "-no-color"],
                      cwd=self.dir, env=self.env, ok=(2,))
        if "fakecloud_bucket.b0_7" not in vanilla.out:
            raise BenchError("vanilla refresh-only plan did not report the drifted bucket")
        self.res.vanilla.append(vanilla.seconds)
        self.log(f"{self.name}: kl drift -f {kl.seconds:.2f}s, vanilla plan -refresh-only {vanilla.seconds:.2f}s")


def render(command: str, results: list[SizeResult], elapsed: float) -> str:
    rows = []
    for r in results:
        kl, van = statistics.median(r.kl), statistics.median(r.vanilla)
        rows.append([f"{r.instances:,}", f"{r.cloud_objects:,}", f"{kl:.2f}", f"{van:.2f}", f"{van / kl:.1f}x"])
    first, last = results[0], results[-1]
    flat = statistics.median(last.kl) / statistics.median(first.kl)
    machine = (f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, load average at "
               f"end {common.load_average()}")
    return "\n".join([
        SECTION, "",
        "`kl drift -f c0.tf` (one file of 100 `fakecloud_bucket` objects, one of them changed behind Terraform's "
        "back) against vanilla `terraform plan -refresh-only` over the whole state, both through the same server, "
        "the embedded Terraform 1.15 and the fakecloud test provider. One file in ten of the configuration holds "
        "fakecloud buckets, the rest `terraform_data`. "
        + (f"Medians of {len(first.kl)} runs" if len(first.kl) > 1 else "One run per size")
        + ", alternating between the sizes; `init` excluded for vanilla (done once), included "
        "for `kl` (its private workspace is new each time).", "",
        f"Machine: {machine}. Command: `{command}` ({elapsed:.0f} s in all).", "",
        table(["instances", "fakecloud objects", "kl drift -f (s)", "vanilla -refresh-only (s)", "ratio"], rows), "",
        f"`kl drift -f` grows {flat:.2f}x from {first.instances:,} to {last.instances:,} instances (the slice is "
        "the file's 100 instances at both sizes); vanilla refreshes every object of the state.", ""])


def main(argv: list[str] | None = None) -> int:
    p = common.bench_parser("drift_bench", __doc__ or "", section=SECTION, default_out=DEFAULT_OUT,
                     quick_help="1,000 and 2,000 instances; writes no document unless --out is given")
    p.add_argument("--sizes", default=None, help="comma-separated instance counts (default 5000,50000)")
    p.add_argument("--reps", type=int, default=REPS, help="timed rounds per size (default %(default)s)")
    args = p.parse_args(argv)
    out, command = common.start_run(args, "drift_bench", argv)
    sizes = [1000, 2000] if args.quick else [int(s) for s in (args.sizes or "5000,50000").split(",")]
    sys.path.insert(0, str(REPO))
    from bench.fakecloud.install import install

    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="kl-bench-drift-"))
    try:
        installed = install(work / "provider")
        with Harness(args.database_url) as h:
            benches = [SizeBench(h, work, n, installed, log) for n in sizes]
            for b in benches:
                b.setup(installed)
            for _ in range(1 if args.quick else args.reps):
                for b in benches:
                    b.round()
            results = [b.res for b in benches]
    except BenchError as exc:
        log(f"benchmark failed: {exc}\nthe working directory is kept in {work}")
        return 1
    except KeyboardInterrupt:
        shutil.rmtree(work, ignore_errors=True)
        return 130
    shutil.rmtree(work, ignore_errors=True)
    section = render(command, results, time.perf_counter() - started)
    print(section)
    if out is not None:
        common.write_section(out, SECTION, section)
        print(f"wrote the '{SECTION}' section of {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
