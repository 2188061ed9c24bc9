"""kl plan / kl apply end to end: real server, real Terraform, real concurrency. After every
scenario vanilla Terraform over the whole configuration must see no changes (convergence)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
import requests

from tests.conftest import Workdir, held_until, http_backend, wait_for

pytestmark = pytest.mark.terraform

RESOURCES = """
resource "terraform_data" "net" {{
  input = "net-{net}"
}}
resource "terraform_data" "web" {{
  input            = "web-{web}-${{terraform_data.net.output}}"
  triggers_replace = "{web}"
  provisioner "local-exec" {{
    command = "{web_cmd}"
  }}
}}
resource "terraform_data" "db" {{
  input            = "db-{db}"
  triggers_replace = "{db}"
  provisioner "local-exec" {{
    command = "{db_cmd}"
  }}
}}
output "web" {{
  value = terraform_data.web.output
}}
"""


class Repo(Workdir):
    """One engineer's checkout of the shared configuration."""

    def configure(self, net: str = "v1", web: str = "v1", db: str = "v1", web_cmd: str = "true",
                  db_cmd: str = "true") -> None:
        self.write("main.tf", http_backend(self.url) + RESOURCES.format(
            net=net, web=web, db=db, web_cmd=web_cmd, db_cmd=db_cmd))

    def converged(self, *, reinit: bool = True) -> None:
        super().converged(reinit=reinit)


@pytest.fixture
def world(live_server, tmp_path, workdir_env):  # type: ignore[no-untyped-def]
    url = live_server.state_url("shared")
    seed = Repo(tmp_path / "trunk", url, workdir_env)
    seed.configure()
    seed.tf("init", "-input=false")
    seed.tf("apply", "-auto-approve", "-input=false")
    return {"url": url, "root": tmp_path, "env": seed.env, "server": live_server, "seed": seed}


def checkout(world, name: str) -> Repo:  # type: ignore[no-untyped-def]
    return Repo(world["root"] / name, world["url"], world["env"])


def head(world) -> dict:  # type: ignore[type-arg,no-untyped-def]
    return json.loads(requests.get(world["url"], timeout=10).content)


def inputs(world) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {r["name"]: r["instances"][0]["attributes"]["input"]["value"] for r in head(world)["resources"]}


def runs(world) -> list[dict]:  # type: ignore[type-arg,no-untyped-def]
    return requests.get(world["server"].url + "/v1/engine/runs?state=shared", timeout=10).json()["runs"]


def test_plan_then_apply_commits_the_change_and_vanilla_terraform_converges(world):
    before = head(world)
    alice = checkout(world, "alice")
    alice.configure(db="v2")
    planned = alice.kl("plan")
    assert planned.returncode == 0, planned.stderr
    assert "replace  terraform_data.db" in planned.stdout and "write terraform_data.db" in planned.stdout
    spec = json.loads((alice.dir / "kl-plan.json").read_text())
    assert spec["write_set"] == ["terraform_data.db"] and spec["base_serial"] == before["serial"]
    assert spec["actions"] == {"terraform_data.db": "replace"}
    applied = alice.kl("apply", "kl-plan.json", "--actor", "alice")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert f"committed at serial {before['serial'] + 1} (run ar_" in applied.stdout
    after = head(world)
    assert after["lineage"] == before["lineage"] and after["serial"] == before["serial"] + 1
    assert inputs(world)["db"] == "db-v2"
    [run] = runs(world)
    assert run["status"] == "committed" and run["actor"] == "alice"
    # blame names both lanes: the seed's Terraform POST, then alice's kl run (attribute names, never values)
    blamed = alice.kl("blame", "terraform_data.db", "--json")
    assert blamed.returncode == 0, blamed.stderr
    [entry] = json.loads(blamed.stdout)["instances"]
    newest, first = entry["changes"][0], entry["changes"][-1]
    assert (newest["serial"], newest["by"]["lane"], newest["by"]["run_id"]) == (after["serial"], "kl run", run["id"])
    assert newest["by"]["actor"] == "alice" and "input" in newest["attributes"] and "db-v2" not in blamed.stdout
    assert (first["kind"], first["by"]["lane"]) == ("created", "terraform")
    alice.converged()


def test_two_disjoint_applies_run_at_the_same_time_and_both_commit(world):
    alice, bob = checkout(world, "alice"), checkout(world, "bob")
    gate = world["root"] / "release-applies"
    alice.configure(web="v2", web_cmd=held_until(gate))
    bob.configure(db="v2", db_cmd=held_until(gate))
    assert alice.kl("plan").returncode == 0 and bob.kl("plan").returncode == 0
    # web feeds the root output "web": alice's run reserves it for writing, bob's (db only) does not.
    assert "output.web" in json.loads((alice.dir / "kl-plan.json").read_text())["write_globs"]
    assert "output.web" not in json.loads((bob.dir / "kl-plan.json").read_text())["write_globs"]
    first = alice.kl_popen("apply", "kl-plan.json", "--actor", "alice")
    second = bob.kl_popen("apply", "kl-plan.json", "--actor", "bob")
    try:
        wait_for(lambda: {r["actor"] for r in runs(world) if r["status"] == "running"} == {"alice", "bob"},
                 "both applies to run")
    finally:
        gate.touch()
    out_a, _ = first.communicate(timeout=120)
    out_b, _ = second.communicate(timeout=120)
    assert first.returncode == 0, out_a
    assert second.returncode == 0, out_b
    done = {r["actor"]: r for r in runs(world)}
    a, b = done["alice"], done["bob"]
    assert a["started_at"] < b["finished_at"] and b["started_at"] < a["finished_at"], "run windows did not overlap"
    assert sorted([a["committed_serial"], b["committed_serial"]]) == [head(world)["serial"] - 1, head(world)["serial"]]
    assert inputs(world)["db"] == "db-v2" and inputs(world)["web"].startswith("web-v2")
    merged = checkout(world, "merged")
    merged.configure(web="v2", db="v2", web_cmd=held_until(gate), db_cmd=held_until(gate))
    merged.converged()


def test_overlapping_write_sets_conflict_with_exit_2(world):
    alice, carol = checkout(world, "alice"), checkout(world, "carol")
    gate = world["root"] / "release-alice"
    alice.configure(web="v2", web_cmd=held_until(gate))
    carol.configure(web="v3")
    assert alice.kl("plan").returncode == 0 and carol.kl("plan").returncode == 0
    first = alice.kl_popen("apply", "kl-plan.json", "--actor", "alice")
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(r["status"] in ("reserved", "running") for r in runs(world)):
            time.sleep(0.2)
        refused = carol.kl("apply", "kl-plan.json", "--actor", "carol")
    finally:
        gate.touch()
    first.communicate(timeout=120)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "reservation conflict on terraform_data.web: held by alice (run ar_" in refused.stderr
    assert first.returncode == 0
    alice.converged()


def test_a_read_address_changed_by_another_run_after_planning_is_stale(world):
    alice, bob = checkout(world, "alice"), checkout(world, "bob")
    alice.configure(web="v2")          # web reads net
    bob.configure(net="v2")            # bob rewrites net (and so web's input would change: bob writes web too)
    assert alice.kl("plan").returncode == 0
    spec = json.loads((alice.dir / "kl-plan.json").read_text())
    assert "terraform_data.net" in spec["read_set"]
    assert bob.kl("plan").returncode == 0
    assert bob.kl("apply", "kl-plan.json", "--actor", "bob").returncode == 0
    before = head(world)
    stale = alice.kl("apply", "kl-plan.json", "--actor", "alice")
    assert stale.returncode == 2, stale.stdout + stale.stderr
    assert "stale plan" in stale.stderr and "re-run kl plan" in stale.stderr
    assert head(world) == before
    bob.converged()


def test_a_configuration_edited_after_planning_is_refused(world):
    alice = checkout(world, "alice")
    alice.configure(db="v2")
    assert alice.kl("plan").returncode == 0
    alice.configure(db="v2", web="sneaky")
    refused = alice.kl("apply", "kl-plan.json", "--actor", "alice")
    assert refused.returncode == 2 and "changed since kl plan" in refused.stderr
    assert runs(world) == []


def test_a_failing_apply_commits_nothing_and_releases_its_reservations(world):
    before = head(world)
    alice = checkout(world, "alice")
    alice.configure(db="v2", db_cmd="exit 1")
    assert alice.kl("plan").returncode == 0
    failed = alice.kl("apply", "kl-plan.json", "--actor", "alice")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "nothing was committed" in failed.stderr
    assert head(world) == before
    [run] = runs(world)
    assert run["status"] == "failed" and "local-exec" in (run["error_summary"] or "")
    assert requests.get(world["server"].url + "/v1/engine/reservations", timeout=10).json()["reservations"] == []
    world["seed"].converged()


def test_kill_9_leaves_the_run_until_its_lease_expires_then_the_addresses_are_free(world):
    before = head(world)
    alice = checkout(world, "alice")
    alice.configure(db="v2", db_cmd="sleep 60")
    assert alice.kl("plan").returncode == 0
    proc = alice.kl_popen("apply", "kl-plan.json", "--actor", "alice", "--lease", "3s")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(r["status"] == "running" for r in runs(world)):
        time.sleep(0.2)
    assert any(r["status"] == "running" for r in runs(world))
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)

    def take() -> requests.Response | None:
        answer = requests.post(world["server"].url + "/v1/engine/states/shared/runs", timeout=10, json={
            "actor": "bob", "reservations": [{"glob": "terraform_data.db", "mode": "write"}]})
        assert answer.status_code in (201, 409), answer.text
        return answer if answer.status_code == 201 else None

    # Refused (409, nothing written) while alice's lease still runs; granted once it has expired.
    wait_for(take, "alice's lease to expire and free terraform_data.db", timeout=60)
    assert {r["actor"]: r["status"] for r in runs(world)}["alice"] == "expired"
    assert head(world) == before


def test_vanilla_terraform_and_kl_apply_block_each_other(world):
    alice, vanilla = checkout(world, "alice"), checkout(world, "vanilla")
    gate = world["root"] / "release-alice"
    alice.configure(db="v2", db_cmd=held_until(gate))
    assert alice.kl("plan").returncode == 0
    running = alice.kl_popen("apply", "kl-plan.json", "--actor", "alice")
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(r["status"] in ("reserved", "running") for r in runs(world)):
            time.sleep(0.2)
        vanilla.configure(db="v2")
        vanilla.tf("init", "-input=false")
        blocked = vanilla.tf("apply", "-auto-approve", "-input=false", check=False)
    finally:
        gate.touch()
    assert blocked.returncode != 0 and "alice" in blocked.stdout + blocked.stderr
    running.communicate(timeout=120)
    assert running.returncode == 0
    # and the other way round: while Terraform holds the lock, kl apply conflicts
    holder = checkout(world, "holder")
    holder.configure(db="v2", net="v9", db_cmd="true")
    holder.tf("init", "-input=false")
    bob = checkout(world, "bob")
    bob.configure(web="v5", db="v2")
    assert bob.kl("plan").returncode == 0
    lock = requests.request("LOCK", world["url"], timeout=10, data=json.dumps({
        "ID": "vanilla-lock", "Operation": "OperationTypeApply", "Who": "vera@laptop",
        "Created": "2026-11-30T10:00:00Z"}))
    assert lock.status_code == 200
    refused = bob.kl("apply", "kl-plan.json", "--actor", "bob")
    assert refused.returncode == 2 and "vera@laptop" in refused.stderr
    requests.request("UNLOCK", world["url"], timeout=10, data=json.dumps({"ID": "vanilla-lock", "Who": "vera@laptop"}))
    alice.converged()


def test_recover_commits_the_state_an_apply_left_behind_when_it_failed_halfway(world):
    before = head(world)
    alice = checkout(world, "alice")
    alice.configure(db="v2", web="v2", web_cmd="exit 1")
    assert alice.kl("plan").returncode == 0
    failed = alice.kl("apply", "kl-plan.json", "--actor", "alice")
    assert failed.returncode == 1
    assert "is kept in" in failed.stderr
    assert head(world) == before
    [run] = runs(world)
    kept = Path(world["env"]["KL_DATA_DIR"]) / "runs" / run["id"] / "terraform.tfstate"
    assert kept.exists()
    recovered = alice.kl("recover", run["id"], "--actor", "alice")
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert f"recovered {run['id']}: committed at serial {before['serial'] + 1}" in recovered.stdout
    assert inputs(world)["db"] == "db-v2"
    web = next(r for r in head(world)["resources"] if r["name"] == "web")
    assert web["instances"][0].get("status") == "tainted"  # the real world, as Terraform left it
    assert not kept.exists()


def test_applies_planned_on_the_same_trunk_both_land_one_after_another(world):
    alice, bob = checkout(world, "alice"), checkout(world, "bob")
    alice.configure(web="v2")
    bob.configure(db="v2")
    assert alice.kl("plan").returncode == 0 and bob.kl("plan").returncode == 0
    first = alice.kl("apply", "kl-plan.json", "--actor", "alice")
    assert first.returncode == 0, first.stdout + first.stderr
    # bob's checkout does not know alice's change; his apply must still land, and leave hers alone.
    second = bob.kl("apply", "kl-plan.json", "--actor", "bob")
    assert second.returncode == 0, second.stdout + second.stderr
    assert inputs(world)["db"] == "db-v2" and inputs(world)["web"].startswith("web-v2")
    merged = checkout(world, "merged")
    merged.configure(web="v2", db="v2")
    merged.converged()


def test_vanilla_terraform_applies_on_top_of_kl_commits_and_its_post_is_accepted(world):
    """A commit stores no bytes: Terraform's next GET gets the head assembled from the rows, and the POST
    of its own apply on top of it (same lineage, next serial) is accepted."""
    alice = checkout(world, "alice")
    alice.configure(db="v2")
    assert alice.kl("plan").returncode == 0
    applied = alice.kl("apply", "kl-plan.json", "--actor", "alice")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    committed = head(world)
    carol = checkout(world, "carol")
    carol.configure(db="v2", net="v2")
    carol.tf("init", "-input=false")
    carol.tf("apply", "-auto-approve", "-input=false")
    after = head(world)
    assert after["serial"] > committed["serial"] and after["lineage"] == committed["lineage"]
    assert inputs(world)["net"] == "net-v2" and inputs(world)["db"] == "db-v2"
    versions = requests.get(world["server"].url + "/v1/engine/states/shared/events", timeout=10).json()
    assert any(e["kind"] == "state_write" and e["serial"] == after["serial"] for e in versions["events"])
    carol.converged()
