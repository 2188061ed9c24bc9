"""Values of every shape across every apply path: one configuration whose changed and unchanged parts all carry
lists, tuples, maps, objects, numbers (whole, big, exponent, tiny, negative zero), nulls, empty collections,
unicode with escapes and sensitive values, in attributes and in root outputs. Each path commits and ends with
a vanilla ``terraform plan`` over the whole configuration that shows no changes: an unchanged value read back
from Postgres must be recognised as unchanged, and a changed one must land."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import requests

from tests.conftest import Workdir

pytestmark = pytest.mark.terraform

# Every shape Terraform can hold in an attribute; "V" is the unit's version. HCL numbers are arbitrary
# precision; these all fit a float64 or are integers, which the store keeps exactly.
_INPUT = """{
    v       = "V"
    list    = ["V", "é ☃ \\u00e9 \\n \\t \\" \\\\ ${"$"}{x}", ""]
    tuple   = [1, 2.5, true, null, {}, [], { deep = [null, { x = null }] }]
    map     = { "k.1" = "V", "ü" = "", "with space" = "x" }
    numbers = { one = 1, whole = 1.0, big = 12345678901234567890, exp = 1e20, tiny = 1.5e-7, half = -0.5, zero = -0 }
    empty   = { l = [], m = {}, s = "" }
    secret  = sensitive("s-V")
  }"""


def unit(name: str, version: str, *, for_each: bool = False) -> str:
    """A resource and root outputs of every shape built from it; version "v2" also changes an output's type
    (a list becomes an object), makes one null (Terraform then leaves it out of the state) and one sensitive."""
    ref = f'terraform_data.{name}["a"]' if for_each else f"terraform_data.{name}"
    each = '  for_each = toset(["a", "b"])\n' if for_each else ""
    second = "v2" if version == "v2" else "v1"
    outputs = {
        "tuple": f"[{ref}.output.v, {ref}.id, 3, null]",
        "list": f"tolist({ref}.output.list)",
        "map": f"tomap({ref}.output.map)",
        "object": f"{ref}.output",
        "numbers": f"{ref}.output.numbers",
        "empty": f"{ref}.output.empty",
        "unicode": f"{ref}.output.list[1]",
        "shape": f"[{ref}.output.v]" if second == "v1" else f"{{ v = {ref}.output.v, n = 1 }}",
        "maybe": f"{ref}.output.v" if second == "v1" else "null",
    }
    text = f'resource "terraform_data" "{name}" {{\n{each}  input = {_INPUT.replace("V", version)}\n}}\n'
    for key, value in outputs.items():
        text += f'output "{name}_{key}" {{\n  value = {value}\n}}\n'
    sensitive = "true" if second == "v2" else "false"
    text += f'output "{name}_secret" {{\n  value     = {ref}.output.map\n  sensitive = true\n}}\n'
    text += f'output "{name}_flip" {{\n  value     = {ref}.output.v\n  sensitive = {sensitive}\n}}\n'
    return text


UNITS = {"stay": True, "full": False, "scoped": False, "changed": False, "left": False, "right": False}


def write_units(repo: Workdir, **versions: str) -> None:
    for name, for_each in UNITS.items():
        repo.write(f"{name}.tf", unit(name, versions.get(name, "v1"), for_each=for_each))


def trunk(repo: Workdir) -> dict:  # type: ignore[type-arg]
    return json.loads(requests.get(repo.url, timeout=10).content)


def applied(result) -> str:  # type: ignore[no-untyped-def]
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "refused" not in result.stdout + result.stderr
    return result.stdout


def test_values_of_every_shape_commit_through_every_apply_path_and_converge(live_server, tmp_path, workdir_env):
    repo = Workdir(tmp_path / "repo", live_server.state_url("shapes"), workdir_env)
    write_units(repo)
    repo.seed({})
    repo.git("init", "-q")
    repo.git("add", "-A")
    repo.git("commit", "-qm", "trunk")
    seeded = trunk(repo)
    assert seeded["outputs"]["stay_numbers"]["value"]["big"] == 12345678901234567890
    assert "stay_maybe" in seeded["outputs"]

    # A full plan file: the plan touches "full" only; every other unit's outputs are read back from Postgres.
    write_units(repo, full="v2")
    plan_file = str(tmp_path / "full.json")  # outside the configuration, which --changed-from diffs below
    applied(repo.kl("plan", "--out", plan_file))
    spec = json.loads(Path(plan_file).read_text())
    assert spec["write_set"] == ["terraform_data.full"]
    applied(repo.kl("apply", plan_file))
    head = trunk(repo)
    assert head["outputs"]["full_shape"] == {"value": {"v": "v2", "n": 1}, "type": ["object", {"n": "number",
                                                                                             "v": "string"}]}
    assert "full_maybe" not in head["outputs"] and head["outputs"]["full_flip"]["sensitive"] is True
    assert head["outputs"]["stay_tuple"] == seeded["outputs"]["stay_tuple"]
    repo.converged()

    # File-scoped, one named file.
    write_units(repo, full="v2", scoped="v2")
    applied(repo.kl("apply", "-f", "scoped.tf", "--confirm-scope"))
    assert trunk(repo)["outputs"]["scoped_shape"]["value"] == {"v": "v2", "n": 1}
    repo.converged()

    # File-scoped from a git diff.
    repo.git("commit", "-qam", "full and scoped at v2")
    write_units(repo, full="v2", scoped="v2", changed="v2")
    applied(repo.kl("apply", "--changed-from", "HEAD", "--confirm-scope"))
    assert trunk(repo)["outputs"]["changed_numbers"]["value"]["tiny"] == 1.5e-7
    repo.converged()
    repo.git("commit", "-qam", "changed at v2")

    # Two engineers at once on the same state, each through a plan file.
    checkouts = {}
    for name in ("left", "right"):
        checkout = Workdir(tmp_path / name, repo.url, workdir_env)
        shutil.copytree(repo.dir, checkout.dir, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".terraform*"))
        checkout.write(f"{name}.tf", unit(name, "v2"))
        applied(checkout.kl("plan", "--out", str(tmp_path / f"{name}.json")))
        checkouts[name] = checkout
    running = [c.kl_popen("apply", str(tmp_path / f"{name}.json"), "--actor", name) for name, c in checkouts.items()]
    for proc in running:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out[-4000:]
    write_units(repo, full="v2", scoped="v2", changed="v2", left="v2", right="v2")
    head = trunk(repo)
    assert head["outputs"]["left_shape"]["value"] == head["outputs"]["right_shape"]["value"] == {"v": "v2", "n": 1}
    repo.converged()

    # A refresh over everything finds no drift and changes nothing, list and map outputs included.
    serial = trunk(repo)["serial"]
    refreshed = applied(repo.kl("refresh"))
    assert trunk(repo)["serial"] == serial, refreshed
    repo.converged()
