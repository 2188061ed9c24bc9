"""What kl plan and kl apply say, against a real server and real Terraform: -C, --json documents,
Terraform's own counts, dry runs, waiting, and the advice after a refused commit."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.runner.test_sliced_apply import checkout, runs, world  # noqa: F401  (world is a fixture)

pytestmark = pytest.mark.terraform
KL = str(Path(sys.executable).with_name("kl"))


def kl_in(where: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([KL, *args], cwd=where, env=env, capture_output=True, text=True, timeout=300)


def test_dash_c_json_documents_and_terraforms_own_counts(world):  # noqa: F811
    alice = checkout(world, "alice")
    alice.configure(net="v2", web="v2", db="v2")  # net: update; web and db: replace (triggers_replace)
    planned = kl_in(world["root"], alice.env, "plan", "-C", "alice", "--json", "--out", "alice.json")
    assert planned.returncode == 0, planned.stderr
    doc = json.loads(planned.stdout)  # stdout is the one JSON document; the summary went to stderr
    assert "kl plan: state 'shared'" in planned.stderr
    assert doc["state"] == "shared" and doc["changes"] is True and doc["plan_file"] == "alice.json"
    assert doc["actions"] == {"terraform_data.db": "replace", "terraform_data.net": "update",
                              "terraform_data.web": "replace"}
    assert doc["counts"]["add"] == 2 and doc["counts"]["change"] == 1 and doc["counts"]["destroy"] == 2
    assert {"glob": "terraform_data.net", "mode": "write"} in doc["reservations"]
    assert sorted(doc["write_set"]) == ["terraform_data.db", "terraform_data.net", "terraform_data.web"]
    spec = json.loads((world["root"] / "alice.json").read_text())
    assert spec["config_dir"] == str(alice.dir.resolve())

    applied = kl_in(world["root"], alice.env, "apply", "alice.json", "--json", "--actor", "alice")
    assert applied.returncode == 0, applied.stderr
    result = json.loads(applied.stdout)
    assert isinstance(result["commit_serial"], int) and result["run_id"].startswith("ar_")
    assert result["dry_run"] is False and result["rows"]["updated"] >= 1
    said = applied.stderr
    terraform_says = re.search(r"Apply complete! Resources: (\d+) added, (\d+) changed, (\d+) destroyed", said)
    kl_says = re.search(r"apply complete: (\d+) added, (\d+) changed, (\d+) destroyed \(2 replaced\)", said)
    assert terraform_says and kl_says, applied.stderr
    assert terraform_says.groups() == kl_says.groups() == ("2", "1", "2")


def test_a_dry_run_is_shown_as_a_dry_run_and_a_no_change_plan_asks_for_nothing(world):  # noqa: F811
    bob = checkout(world, "bob")
    bob.configure(db="v3")
    assert bob.kl("plan").returncode == 0
    dry = bob.kl("apply", "kl-plan.json", "--dry-run", "--actor", "bob", "--json")
    assert dry.returncode == 0, dry.stderr
    doc = json.loads(dry.stdout)
    assert doc["dry_run"] is True and doc["commit_serial"] is None
    [run] = [r for r in runs(world) if r["id"] == doc["run_id"]]
    assert run["status"] == "aborted" and run["info"]["dry_run"] is True
    html = requests.get(f"{world['server'].url}/ui/runs/{run['id']}", headers={"Accept": "text/html"}, timeout=10).text
    assert 'id="run-status">dry-run<' in html and "Nothing was applied" in html

    same = checkout(world, "same")
    same.configure()
    nothing = same.kl("plan", "-f", "main.tf")
    assert nothing.returncode == 0, nothing.stderr
    assert "No changes: nothing to apply, so kl apply would take no reservations." in nothing.stdout
    assert "Reservations kl apply will take" not in nothing.stdout and "apply it with" not in nothing.stdout


def _wait_for(predicate, what: str, timeout: float = 120):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        found = predicate()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def test_a_conflict_after_waiting_says_so_and_a_refused_commit_points_at_kl_recover(world):  # noqa: F811
    alice, bob = checkout(world, "alice"), checkout(world, "bob")
    alice.configure(web="v2", web_cmd="sleep 30")
    bob.configure(web="v3")
    assert alice.kl("plan").returncode == 0 and bob.kl("plan").returncode == 0
    first = alice.kl_popen("apply", "kl-plan.json", "--actor", "alice", "--lease", "10m")
    run = _wait_for(lambda: next((r for r in runs(world) if r["actor"] == "alice" and r["status"] == "running"),
                                 None), "alice's run to start applying")
    refused = bob.kl("apply", "kl-plan.json", "--actor", "bob", "--wait", "1s")
    assert refused.returncode == 2, refused.stderr
    assert "kl waited 1s" in refused.stderr
    # While it waited it said so, naming whom it waited on (off a terminal: one line, then one every 15s).
    assert re.search(rf"^waiting for .*terraform_data\.web\S* \(write, held by alice, run {run['id']}\).*: \d+s of 1s$",
                     refused.stderr, re.MULTILINE), refused.stderr
    fast = bob.kl("apply", "kl-plan.json", "--actor", "bob")
    assert fast.returncode == 2 and "kl did not wait: pass --wait" in fast.stderr

    aborted = alice.kl("abort", run["id"], "--reason", "testing recovery")
    assert aborted.returncode == 0, aborted.stderr
    out, _ = first.communicate(timeout=300)
    assert first.returncode == 1, out
    assert f"kl recover {run['id']}" in out and "kl runs recover" not in out and "start a new run" not in out

    recovered = alice.kl("recover", run["id"], "--json")
    assert recovered.returncode == 0, recovered.stderr
    doc = json.loads(recovered.stdout)
    assert doc["recovered_run_id"] == run["id"] and isinstance(doc["commit_serial"], int)
    assert doc["run_id"] != run["id"] and "terraform_data.web" in doc["committed_addresses"]


def test_a_missing_cli_configuration_file_does_not_bury_terraforms_error(world):  # noqa: F811
    broken = checkout(world, "broken")
    broken.configure()
    (broken.dir / "bad.tf").write_text('resource "terraform_data" "x" {\n  input = var.nowhere\n}\n')
    env = {**broken.env, "TF_CLI_CONFIG_FILE": str(world["root"] / "no-such.tfrc")}
    failed = kl_in(broken.dir, env, "plan")
    assert failed.returncode == 1
    assert "var.nowhere" in failed.stderr or "nowhere" in failed.stderr, failed.stderr
    assert "Unable to open CLI configuration file" not in failed.stderr + failed.stdout


def test_changed_from_a_module_file_names_no_deleted_files(world, tmp_path):  # noqa: F811
    repo = checkout(world, "modrepo")
    url = world["server"].url + "/v1/states/modules"
    (repo.dir / "main.tf").write_text(
        f'terraform {{\n  backend "http" {{\n    address = "{url}"\n  }}\n}}\n'
        'module "app" {\n  source = "./modules/app"\n}\n')
    (repo.dir / "modules" / "app").mkdir(parents=True)
    (repo.dir / "modules" / "app" / "main.tf").write_text('resource "terraform_data" "m" {\n  input = "v1"\n}\n')

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args], cwd=repo.dir,
                       check=True, capture_output=True, timeout=60)

    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "start")
    (repo.dir / "modules" / "app" / "main.tf").write_text('resource "terraform_data" "m" {\n  input = "v2"\n}\n')
    planned = repo.kl("plan", "--changed-from", "HEAD")
    assert planned.returncode == 0, planned.stderr
    assert "File-scoped: main.tf" in planned.stdout
    assert "Deleted files" not in planned.stdout and "module.app.*" in planned.stdout
    (repo.dir / "gone.tf").write_text('resource "terraform_data" "g" {}\n')
    git("add", "-A")
    git("commit", "-qm", "more")
    (repo.dir / "gone.tf").unlink()
    deleted = repo.kl("plan", "--changed-from", "HEAD")
    assert deleted.returncode == 0, deleted.stderr
    assert "Deleted files (what they declared is planned for destruction): gone.tf" in deleted.stdout
