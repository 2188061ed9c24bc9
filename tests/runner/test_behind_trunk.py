"""A full ``kl plan`` from a checkout behind the trunk warns that it would undo what a run applied from a
commit the checkout lacks: real server, real Terraform, real git (two clones of one repository)."""

from __future__ import annotations

import json

import pytest
import requests

from tests.conftest import Workdir

pytestmark = pytest.mark.terraform

FILES = {
    "main.tf": 'resource "terraform_data" "x" {\n  input = "x-v1"\n}\n\n'
               'resource "terraform_data" "y" {\n  input = "y-v1"\n}\n',
}


def run_of(repo: Workdir, run_id: str) -> dict:  # type: ignore[type-arg]
    base = repo.url.split("/v1/states/")[0]
    found = requests.get(f"{base}/v1/engine/runs/{run_id}", timeout=30).json()["run"]
    assert isinstance(found, dict)
    return found


def test_a_checkout_behind_the_trunk_is_told_which_run_its_plan_would_undo(live_server, workdir_factory):
    alice = workdir_factory("alice", live_server.state_url("behind"))
    alice.seed(FILES)
    alice.write(".gitignore", ".terraform/\n.terraform.lock.hcl\nkl-plan.json\n.kilolock/\n")
    alice.git("init", "-q")
    alice.git("add", "-A")
    alice.git("commit", "-qm", "C1")
    bob = Workdir(alice.dir.parent / "bob", alice.url, alice.env)
    alice.git("clone", "-q", str(alice.dir), str(bob.dir))

    alice.edit("main.tf", "x-v1", "x-v2")
    alice.git("commit", "-qam", "C2: x to v2")
    c2 = alice.git("rev-parse", "HEAD").strip()
    assert alice.kl("plan").returncode == 0
    applied = alice.kl("apply", "kl-plan.json", "--actor", "alice")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    runs = requests.get(live_server.url + "/v1/engine/runs", params={"state": "behind", "status": "committed"},
                        timeout=30).json()["runs"]
    assert len(runs) == 1
    run = run_of(alice, runs[0]["id"])
    assert run["info"]["git_commit"] == c2 and run["info"]["write_globs"] == ["terraform_data.x"]
    serial = run["committed_serial"]

    # bob's clone is still at C1: its full plan turns x back to x-v1, which alice's run wrote; y it changes
    # too, but no write glob of alice's run covers y.
    bob.edit("main.tf", "y-v1", "y-v2")
    planned = bob.kl("plan", "--json")
    assert planned.returncode == 0, planned.stdout + planned.stderr
    warning = next(line for line in planned.stderr.splitlines() if run["id"] in line)
    assert f"serial {serial}" in warning and "alice" in warning and c2[:12] in warning
    assert "terraform_data.x" in warning and "terraform_data.y" not in warning and "pull or rebase" in warning
    doc = json.loads(planned.stdout)
    assert doc["actions"] == {"terraform_data.x": "update", "terraform_data.y": "update"}
    assert [(b["run_id"], b["serial"], b["git_commit"], b["addresses"]) for b in doc["behind"]] == [
        (run["id"], serial, c2, ["terraform_data.x"])]

    # Once bob's checkout holds C2, changing x again builds on alice's run: no warning.
    bob.git("checkout", "--", "main.tf")
    bob.git("pull", "-q", "--ff-only")
    bob.edit("main.tf", "x-v2", "x-v3")
    planned = bob.kl("plan", "--json")
    assert planned.returncode == 0, planned.stdout + planned.stderr
    doc = json.loads(planned.stdout)
    assert doc["actions"] == {"terraform_data.x": "update"} and doc["behind"] == []
    assert run["id"] not in planned.stderr and "pull or rebase" not in planned.stderr

def test_a_run_commit_must_be_a_git_commit_id(live_server):
    url = live_server.url + "/v1/engine/states/behind-info/runs"
    body = {"actor": "alice", "reservations": [{"glob": "terraform_data.x", "mode": "write"}],
            "info": {"git_commit": "--upload-pack=evil"}}
    refused = requests.post(url, json=body, timeout=30)
    assert refused.status_code == 400 and "git_commit" in refused.json()["error"]
    assert requests.get(live_server.url + "/v1/engine/runs", params={"state": "behind-info"},
                        timeout=30).json()["runs"] == []
