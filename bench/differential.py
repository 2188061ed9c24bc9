"""A differential equivalence check for file-scoped applies: seeded random multi-file configurations and random
edits, applied once through ``kl apply -f … --confirm-scope`` / ``--changed-from HEAD`` against the Kilolock
trunk and once through vanilla ``terraform apply`` on a second, local state. A case *converges* when both
states hold the same values by address (``input`` of every instance, and every root output) and a vanilla
``terraform plan -detailed-exitcode`` over the kl-managed configuration reports no changes; it is *refused*
when kl exits 2 or 3 and the trunk is byte-for-byte what it was; anything else *diverges*.

The configurations use locals (a key set driving ``for_each``), variables with ``terraform.tfvars``, ``count``,
a sibling module through a ``../`` source whose output another file reads, root outputs, cross-file
references, ``moved`` renames and, now and then, a ``.tf.json`` file reading a local. With the fakecloud
provider installed (``bench.fakecloud``) they also hold real objects: buckets in ``network.tf``, a data source
reading one of them and outputs built from both, and the edits delete a bucket (with its output), replace it
with a ``removed`` block, resize the bucket the data source reads, rename the module with ``moved``, delete a
root output or delete a whole file. Both sides keep their own cloud directory, and the objects in them must
match too. Used by tests/runner/test_differential.py (a few seeds) and bench/differential_bench.py (hundreds).
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import requests

from bench.common import http_backend
from bench.fakecloud.cloud import Cloud
from bench.fakecloud.install import Installed, required_providers

MODULE = ('variable "name" {\n  type = string\n}\n\nresource "terraform_data" "x" {\n  input = "${var.name}-MOD"\n}\n\n'
          'output "out" {\n  value = terraform_data.x.output\n}\n')
EDITS = ("keys", "tag", "n", "a_literal", "b_literal", "c_literal", "module_body", "rename_b", "new_consumer")
CLOUD_EDITS = ("delete_bucket", "remove_bucket", "bucket_size", "rename_module", "delete_output", "delete_file")
TF_EDITS = frozenset({"keys", "a_literal", "b_literal", "c_literal", "rename_b", "new_consumer", "rename_module",
                      "delete_bucket", "remove_bucket", "bucket_size", "delete_output"})
# What --changed-from must see: deleting a whole file has no file to pass to -f.
OLD_PRESENT, OLD_DELETED, OLD_REMOVED = "present", "deleted", "removed"


@dataclass
class Config:
    """One generated configuration: the knobs, rendered to files by ``files``. ``cloud`` adds the fakecloud
    objects (``network.tf``, ``lookups.tf``) and their outputs."""

    keys: list[str]
    n: int
    n_default: int
    tag: str | None
    a: int = 1
    b: int = 1
    c: int = 1
    mod: int = 1
    b_name: str = "b"
    moved_from: str | None = None
    json_reader: bool = False
    consumer: bool = False
    cloud: bool = False
    old: str = OLD_PRESENT
    size: int = 1
    mod_name: str = "m"
    mod_moved_from: str | None = None
    count_output: bool = True
    d_file: bool = True

    def files(self) -> dict[str, str]:
        keys = ", ".join(json.dumps(k) for k in self.keys)
        m = f"module.{self.mod_name}"
        out = {
            "variables.tf": f'variable "n" {{\n  type    = number\n  default = {self.n_default}\n}}\n\n'
                            'variable "tag" {\n  type    = string\n  default = "t0"\n}\n',
            "terraform.tfvars": f"n = {self.n}\n" + (f'tag = "{self.tag}"\n' if self.tag else ""),
            "locals.tf": f'locals {{\n  keys   = toset([{keys}])\n  prefix = "${{var.tag}}-p"\n}}\n',
            "a.tf": 'resource "terraform_data" "a" {\n  for_each = local.keys\n'
                    f'  input    = "${{local.prefix}}-${{each.key}}-a{self.a}"\n}}\n',
            "b.tf": f'resource "terraform_data" "{self.b_name}" {{\n  count = var.n\n'
                    f'  input = "b{self.b}-${{length(terraform_data.a)}}"\n}}\n'
                    + (f"\nmoved {{\n  from = terraform_data.{self.moved_from}\n"
                       f"  to   = terraform_data.{self.b_name}\n}}\n" if self.moved_from else ""),
            "c.tf": f'module "{self.mod_name}" {{\n  source = "../mods/m"\n'
                    f'  name   = "${{local.prefix}}-c{self.c}"\n}}\n'
                    + (f"\nmoved {{\n  from = module.{self.mod_moved_from}\n  to   = {m}\n}}\n"
                       if self.mod_moved_from else ""),
            "outputs.tf": ('output "a_count" {\n  value = length(terraform_data.a)\n}\n\n' if self.count_output else "")
                          + f'output "m" {{\n  value = {m}.out\n}}\n',
        }
        if self.d_file:
            out["d.tf"] = f'resource "terraform_data" "d" {{\n  input = {m}.out\n}}\n'
        if self.json_reader:
            out["e.tf.json"] = json.dumps({"resource": {"terraform_data": {"e": {"input": "${local.prefix}-e"}}}})
        if self.consumer:
            out["f.tf"] = ('resource "terraform_data" "f" {\n  input = join(",", [for k, v in terraform_data.a : '
                           'v.input])\n}\n\noutput "f" {\n  value = terraform_data.f.output\n}\n')
        if self.cloud:
            out.update(self._cloud_files())
        return out

    def _cloud_files(self) -> dict[str, str]:
        network = ('resource "fakecloud_bucket" "keep" {\n  name   = "keep"\n'
                   f'  size   = {self.size}\n  labels = {{ tag = var.tag }}\n}}\n')
        outputs = 'output "keep_size" {\n  value = data.fakecloud_bucket.keep.size\n}\n'
        if self.old == OLD_PRESENT:
            network += '\nresource "fakecloud_bucket" "old" {\n  name = "old"\n  size = 3\n}\n'
            outputs += '\noutput "old_arn" {\n  value = fakecloud_bucket.old.arn\n}\n'
        elif self.old == OLD_REMOVED:
            network += ('\nremoved {\n  from = fakecloud_bucket.old\n\n  lifecycle {\n    destroy = false\n  }\n}\n')
        return {
            "providers.tf": required_providers() + '\nprovider "fakecloud" {}\n',
            "network.tf": network,
            "lookups.tf": 'data "fakecloud_bucket" "keep" {\n  name = fakecloud_bucket.keep.name\n}\n\n' + outputs,
        }

    def module(self) -> str:
        return MODULE.replace("MOD", f"m{self.mod}")


def generate(rnd: random.Random, cloud: bool = False) -> Config:
    keys = sorted(rnd.sample(["k1", "k2", "k3", "k4", "k5"], rnd.randint(1, 3)))
    return Config(keys=keys, n=rnd.randint(0, 3), n_default=rnd.randint(0, 2),
                  tag=rnd.choice([None, "t1", "t2"]), json_reader=rnd.random() < 0.25, cloud=cloud)


def edit(config: Config, rnd: random.Random) -> tuple[Config, list[str]]:
    kinds = EDITS + (CLOUD_EDITS if config.cloud else ())
    # With real objects, every other case combines two deletions, moves or data-source changes (and maybe more).
    chosen = rnd.sample(kinds, rnd.randint(1, 2)) if not config.cloud or rnd.random() < 0.5 else \
        [*rnd.sample(CLOUD_EDITS, 2), *rnd.sample(kinds, rnd.randint(0, 1))]
    chosen = list(dict.fromkeys(chosen))
    new = Config(**{k: (list(v) if isinstance(v, list) else v) for k, v in config.__dict__.items()})
    for kind in chosen:
        if kind == "keys":
            new.keys = sorted(set(rnd.sample(["k1", "k2", "k3", "k4", "k5"], rnd.randint(1, 3))) | {"k9"})
        elif kind == "tag":
            new.tag = rnd.choice(["t3", "t4"])
        elif kind == "n":
            new.n = (new.n + rnd.randint(1, 2)) % 4
        elif kind == "a_literal":
            new.a += 1
        elif kind == "b_literal":
            new.b += 1
        elif kind == "c_literal":
            new.c += 1
        elif kind == "module_body":
            new.mod += 1
        elif kind == "rename_b":
            new.moved_from, new.b_name = new.b_name, new.b_name + "x"
        elif kind == "new_consumer":
            new.consumer = True
        elif kind in ("delete_bucket", "remove_bucket") and new.old == OLD_PRESENT:
            new.old = OLD_DELETED if kind == "delete_bucket" else OLD_REMOVED
        elif kind == "bucket_size":
            new.size += 1
        elif kind == "rename_module":
            new.mod_moved_from, new.mod_name = new.mod_name, new.mod_name + "2"
        elif kind == "delete_output":
            new.count_output = False
        elif kind == "delete_file":
            new.d_file = False
    return new, chosen


@dataclass
class Outcome:
    seed: int
    edits: list[str]
    mode: str
    result: str  # converged | refused | diverged
    detail: str = ""
    kl_exit: int = 0
    notes: list[str] = field(default_factory=list)


class Case:
    """One seeded case in ``root``: a git repository with the kl-managed configuration (``repo/live``), its
    sibling module (``repo/mods/m``), and a vanilla copy with a local state (``vanilla/live``). With ``cloud``
    (the installed fakecloud provider) the configurations hold real objects too, each side in its own cloud
    directory (``cloud-kl``, ``cloud-vanilla``)."""

    def __init__(self, seed: int, root: Path, state_url: str, env: dict[str, str], kl: str, terraform: str,
                 cloud: Installed | None = None) -> None:
        self.seed, self.root, self.url, self.kl_bin, self.tf_bin = seed, root, state_url, kl, terraform
        self.rnd = random.Random(seed)
        self.live = root / "repo" / "live"
        self.vanilla = root / "vanilla" / "live"
        self.clouds = {self.live: Cloud(root / "cloud-kl"), self.vanilla: Cloud(root / "cloud-vanilla")}
        self.cloud = cloud
        self.envs = {live: {**env, **(cloud.env(self.clouds[live].root) if cloud else {})}
                     for live in (self.live, self.vanilla)}
        self.envs[root / "repo"] = env

    def _run(self, argv: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(argv, cwd=cwd, env=self.envs[cwd], capture_output=True, text=True, timeout=300)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}):\n"
                               f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        return proc

    def _write(self, config: Config) -> None:
        for live, backend in ((self.live, http_backend(self.url)), (self.vanilla, None)):
            live.mkdir(parents=True, exist_ok=True)
            for old in live.iterdir():
                if old.name.endswith((".tf", ".tf.json", ".tfvars")):
                    old.unlink()  # the configuration only: the vanilla side keeps its state
            for name, text in config.files().items():
                (live / name).write_text(text)
            if backend:
                (live / "backend.tf").write_text(backend)
            module = live.parent / "mods" / "m"
            module.mkdir(parents=True, exist_ok=True)
            (module / "main.tf").write_text(config.module())

    def _git(self, *args: str) -> None:
        self._run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], self.root / "repo")

    def objects(self, live: Path) -> dict[str, object]:
        """The real objects on one side: bucket name → its stored fields."""
        cloud = self.clouds[live]
        return {name: cloud.get("local", "bucket", name) for name in cloud.names("local", "bucket")}

    def run(self) -> Outcome:
        config = generate(self.rnd, cloud=self.cloud is not None)
        self._write(config)
        (self.root / "repo" / ".gitignore").write_text(".terraform/\n*.igplan\n.terraform.lock.hcl\n*.tfstate*\n")
        for live in (self.live, self.vanilla):
            self._run([self.tf_bin, "init", "-input=false", "-no-color"], live)
            self._run([self.tf_bin, "apply", "-auto-approve", "-input=false", "-no-color"], live)
        self._git("init", "-q")
        self._git("add", "-A")
        self._git("commit", "-qm", "base")
        edited, kinds = edit(config, self.rnd)
        before_files = config.files()
        self._write(edited)
        changed_tf = sorted(n for n, t in edited.files().items()
                            if n.endswith(".tf") and before_files.get(n) != t)
        use_files = set(kinds) <= TF_EDITS and changed_tf and self.rnd.random() < 0.5
        before, objects = requests.get(self.url, timeout=30).content, self.objects(self.live)
        if use_files:
            mode = "-f " + " -f ".join(changed_tf)
            argv = [self.kl_bin, "apply", *[x for f in changed_tf for x in ("-f", f)], "--confirm-scope",
                    "--actor", "differential"]
        else:
            mode = "--changed-from HEAD"
            argv = [self.kl_bin, "apply", "--changed-from", "HEAD", "--confirm-scope", "--actor", "differential"]
        kl = self._run(argv, self.live, check=False)
        outcome = Outcome(self.seed, kinds, mode, "", kl_exit=kl.returncode)
        if kl.returncode in (2, 3):
            unchanged = requests.get(self.url, timeout=30).content == before and self.objects(self.live) == objects
            outcome.result = "refused" if unchanged else "diverged"
            outcome.detail = (kl.stderr or kl.stdout).strip()[-600:]
            if not unchanged:
                outcome.detail = "refused, but the trunk or the cloud changed: " + outcome.detail
            return outcome
        if kl.returncode != 0:
            outcome.result, outcome.detail = "diverged", f"kl exit {kl.returncode}: {(kl.stdout + kl.stderr)[-1500:]}"
            return outcome
        self._run([self.tf_bin, "init", "-input=false", "-no-color"], self.vanilla)
        self._run([self.tf_bin, "apply", "-auto-approve", "-input=false", "-no-color"], self.vanilla)
        trunk = requests.get(self.url, timeout=30).json()
        vanilla = json.loads((self.vanilla / "terraform.tfstate").read_text())
        ours, theirs = values(trunk), values(vanilla)
        if ours != theirs:
            diff = sorted(set(ours.items()) ^ set(theirs.items()))[:10]
            outcome.result, outcome.detail = "diverged", f"values differ: {diff}"
            return outcome
        if self.objects(self.live) != self.objects(self.vanilla):
            outcome.result = "diverged"
            outcome.detail = f"real objects differ: {self.objects(self.live)} vs {self.objects(self.vanilla)}"
            return outcome
        self._run([self.tf_bin, "init", "-input=false", "-no-color"], self.live)
        plan = self._run([self.tf_bin, "plan", "-detailed-exitcode", "-input=false", "-no-color"], self.live,
                         check=False)
        if plan.returncode != 0:
            outcome.result, outcome.detail = "diverged", f"vanilla plan exit {plan.returncode}: {plan.stdout[-1500:]}"
            return outcome
        outcome.result = "converged"
        return outcome


def values(state: dict) -> dict[str, str]:  # type: ignore[type-arg]
    """Address → what the instance holds (JSON): ``input`` for ``terraform_data`` (its ``id`` is random), every
    attribute for the fakecloud resources and data sources (``data.`` addresses); and ``output.NAME`` → the
    output's value (JSON)."""
    found: dict[str, str] = {}
    for resource in state.get("resources", []):
        prefix = (resource["module"] + ".") if resource.get("module") else ""
        prefix += "data." if resource.get("mode") == "data" else ""
        for instance in resource.get("instances", []):
            key = instance.get("index_key")
            suffix = "" if key is None else f"[{json.dumps(key)}]"
            address = f"{prefix}{resource['type']}.{resource['name']}{suffix}"
            attributes = instance.get("attributes", {})
            held = attributes.get("input") if resource["type"] == "terraform_data" else attributes
            found[address] = json.dumps(held, sort_keys=True)
    for name, output in (state.get("outputs") or {}).items():
        found[f"output.{name}"] = json.dumps(output.get("value"), sort_keys=True)
    return found


def cleanup(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
