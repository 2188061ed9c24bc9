"""Refusals come before Terraform touches anything, and every run ends: against a real server and real
Terraform. A refusal the plan makes knowable leaves a marker-writing provisioner unrun; ``kl recover`` commits
or closes the run it opened; an abort keeps the reservations until Terraform has stopped; a ``kill -9`` of
``kl apply`` ends Terraform and leaves enough for ``kl recover``."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import requests

from tests.runner.test_sliced_apply import checkout, head, inputs, runs, world  # noqa: F401  (world is a fixture)

pytestmark = pytest.mark.terraform


def _wait_for(predicate, what: str, timeout: float = 180):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        found = predicate()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def _processes(needle: str) -> dict[int, int]:
    """pid -> process group of every process whose command line contains ``needle``."""
    found: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if needle in cmdline and int(entry.name) != os.getpid():
                found[int(entry.name)] = os.getpgid(int(entry.name))
        except (OSError, ProcessLookupError):
            continue
    return found


def _is_json(path: Path) -> bool:
    try:
        json.loads(path.read_bytes())
    except ValueError:
        return False
    return True


def _run(where, run_id: str) -> dict:  # type: ignore[type-arg,no-untyped-def]
    return requests.get(f"{where['server'].url}/v1/engine/runs/{run_id}", timeout=10).json()


def _live_reservations(where) -> list[dict]:  # type: ignore[type-arg,no-untyped-def]
    return requests.get(f"{where['server'].url}/v1/engine/reservations?state=shared",
                        timeout=10).json()["reservations"]


def test_a_plan_writing_outside_its_reservations_is_refused_before_terraform_applies(world, tmp_path):  # noqa: F811
    marker = tmp_path / "web-provisioned"
    bob = checkout(world, "bob")
    bob.configure(web="v2", web_cmd=f"touch {marker}")
    assert bob.kl("plan").returncode == 0
    # A client whose reservations miss what its plan writes (a bug, or an edited plan file): the commit would
    # refuse it — after Terraform replaced terraform_data.web. The dry commit refuses it first.
    spec_path = bob.dir / "kl-plan.json"
    spec = json.loads(spec_path.read_text())
    assert {"terraform_data.web", "output.web"} <= set(spec["write_globs"])
    spec["write_globs"] = [g for g in spec["write_globs"] if g not in ("terraform_data.web", "output.web")]
    spec_path.write_text(json.dumps(spec))
    serial = head(world)["serial"]

    refused = bob.kl("apply", "kl-plan.json", "--actor", "bob")

    assert refused.returncode == 1, refused.stdout + refused.stderr
    said = refused.stdout + refused.stderr
    assert "refused before apply" in said and "terraform_data.web" in said and "output.web" in said
    assert "applying" not in said
    assert not marker.exists()  # the provisioner never ran: the infrastructure is untouched
    assert head(world)["serial"] == serial
    [run] = [r for r in runs(world) if r["actor"] == "bob"]
    assert run["status"] == "failed" and "refused before apply" in run["error_summary"]
    assert _live_reservations(world) == []

    # The same change through kl apply -f: its plan reserves what it writes, the dry commit accepts it.
    applied = bob.kl("apply", "-f", "main.tf", "--confirm-scope", "--actor", "bob")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "the server's dry commit accepts the plan's changes" in applied.stdout + applied.stderr
    assert marker.exists()
    bob.converged(reinit=True)


def _failed_halfway(where, name: str):  # type: ignore[no-untyped-def]
    """An apply that updated terraform_data.net, then failed in web's provisioner: its state is kept. The
    kept reservations then miss web, as if Terraform had changed it without its plan saying so."""
    repo = checkout(where, name)
    repo.configure(net="v2", web="v2", web_cmd="exit 1")
    assert repo.kl("plan").returncode == 0
    failed = repo.kl("apply", "kl-plan.json", "--actor", name)
    assert failed.returncode == 1
    [run] = [r for r in runs(where) if r["actor"] == name]
    assert run["status"] == "failed" and f"kl recover {run['id']}" in failed.stdout + failed.stderr
    kept = Path(repo.env["KL_DATA_DIR"]) / "runs" / run["id"]
    meta = json.loads((kept / "recovery.json").read_text())
    meta["reservations"] = [r for r in meta["reservations"]
                            if r["glob"] not in ("terraform_data.web", "terraform_data.web.*")]
    (kept / "recovery.json").write_text(json.dumps(meta))
    return repo, run, kept


def test_recover_closes_the_run_it_opened_when_refused_widens_when_it_can_and_says_when_it_is_done(
        world):  # noqa: F811
    alice, run, kept = _failed_halfway(world, "alice")
    good = (kept / "terraform.tfstate").read_bytes()
    (kept / "terraform.tfstate").write_text('{"version": 3}')  # a kept file the server cannot commit

    refused = alice.kl("recover", run["id"])

    assert refused.returncode != 0
    said = refused.stdout + refused.stderr
    opened = [r for r in runs(world) if r.get("info", {}).get("recovers") == run["id"]]
    assert len(opened) == 1 and opened[0]["status"] == "failed"
    assert f"the recovery run {opened[0]['id']} is closed" in said and "the kept state stays" in said
    assert _live_reservations(world) == []  # nothing holds the addresses or Terraform's lock for a lease

    (kept / "terraform.tfstate").write_bytes(good)
    recovered = alice.kl("recover", run["id"], "--json")
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    doc = json.loads(recovered.stdout)
    assert isinstance(doc["commit_serial"], int) and "terraform_data.web" in doc["committed_addresses"]
    assert "reserving them" in recovered.stderr  # widened to what Terraform changed outside the reservations
    assert _live_reservations(world) == [] and inputs(world)["net"] == "net-v2"

    again = alice.kl("recover", run["id"])
    assert again.returncode == 0  # nothing to do, and it says what was done
    assert f"already recovered: committed at serial {doc['commit_serial']}" in again.stdout + again.stderr


def test_recover_commits_what_lies_inside_the_reservations_when_it_cannot_widen_them(world):  # noqa: F811
    alice, run, _ = _failed_halfway(world, "alice")
    web_before = inputs(world)["web"]
    requests.post(f"{world['server'].url}/v1/engine/states/shared/runs", timeout=10, json={
        "actor": "carol", "reservations": [{"glob": "terraform_data.web", "mode": "write"}]})

    recovered = alice.kl("recover", run["id"], "--json")

    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    doc = json.loads(recovered.stdout)
    assert "terraform_data.net" in doc["committed_addresses"]
    assert "terraform_data.web" not in doc["committed_addresses"]
    assert "cannot be reserved" in recovered.stderr and "terraform_data.web" in recovered.stderr
    now = inputs(world)
    assert now["net"] == "net-v2" and now["web"] == web_before
    assert {r["holder"] for r in _live_reservations(world)} == {"carol"}


def test_an_abort_during_apply_stops_terraform_before_the_reservations_end(world, tmp_path):  # noqa: F811
    marker = tmp_path / "web-done"
    alice = checkout(world, "alice")
    alice.configure(web="v2", web_cmd=f"sleep 120 && touch {marker}")
    assert alice.kl("plan").returncode == 0
    applying = alice.kl_popen("apply", "kl-plan.json", "--actor", "alice", "--lease", "10m")
    try:
        run = _wait_for(lambda: next((r for r in runs(world) if r["status"] == "running"), None), "the apply")
        _wait_for(lambda: _processes(str(marker)), "the provisioner to start")

        aborted = alice.kl("abort", run["id"], "--reason", "stop it")

        assert aborted.returncode == 0, aborted.stderr
        assert f"aborting {run['id']}" in aborted.stdout
        out, _ = applying.communicate(timeout=300)
    finally:
        if applying.poll() is None:
            applying.kill()
    assert applying.returncode == 1, out
    assert "being aborted" in out and "an abort stopped Terraform" in out
    assert f"kl recover {run['id']}" in out  # what Terraform did before it stopped is kept
    # Terraform and its provisioner have stopped: the command that would write the marker never finished.
    assert _processes(str(marker)) == {} and _processes(f"kl-apply-{run['id']}") == {}
    assert not marker.exists()
    body = _run(world, run["id"])
    assert body["run"]["status"] == "aborted" and body["reservations"] == []
    with_events = requests.get(f"{world['server'].url}/v1/engine/states/shared/events?limit=50", timeout=10).json()
    kinds = [e["kind"] for e in reversed(with_events["events"])
             if (e.get("detail") or {}).get("run_id") == run["id"]]
    # The reservations ended with the close, after Terraform stopped; not with the abort request.
    assert kinds.index("run_aborting") < kinds.index("run_aborted")


def test_kill_9_of_kl_apply_ends_terraform_and_leaves_enough_for_kl_recover(world, tmp_path):  # noqa: F811
    marker = tmp_path / "web-done"
    alice = checkout(world, "alice")
    alice.configure(net="v2", web="v2", web_cmd=f"sleep 120 && touch {marker}")
    assert alice.kl("plan").returncode == 0
    applying = alice.kl_popen("apply", "kl-plan.json", "--actor", "alice", "--lease", "10m")
    groups: set[int] = set()
    try:
        run = _wait_for(lambda: next((r for r in runs(world) if r["status"] == "running"), None), "the apply")
        groups |= set(_wait_for(lambda: _processes(f"kl-apply-{run['id']}"), "terraform apply").values())
        _wait_for(lambda: _processes(str(marker)), "the provisioner to start")

        applying.send_signal(signal.SIGKILL)
        applying.wait(timeout=30)

        # Terraform got its parent-death signal, stopped gracefully and exited: nothing applies on alone.
        _wait_for(lambda: not _processes(f"kl-apply-{run['id']}") and not _processes(str(marker)),
                  "terraform to stop", timeout=120)
    finally:
        if applying.poll() is None:
            applying.kill()
        for group in groups:  # the provisioner's orphaned `sleep`, if any
            try:
                os.killpg(group, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    assert not marker.exists()
    kept = Path(alice.env["KL_DATA_DIR"]) / "runs" / run["id"]
    meta = json.loads((kept / "recovery.json").read_text())
    assert meta["run_id"] == run["id"] and Path(meta["workspace_state"]).is_file()
    assert _run(world, run["id"])["run"]["status"] == "running"  # its client is gone; the lease still holds
    # Terraform's last state write may land just after its process is gone from the scan above.
    _wait_for(lambda: _is_json(Path(meta["workspace_state"])), "Terraform's kept state to be whole", timeout=120)

    recovered = alice.kl("recover", run["id"], "--json")

    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    doc = json.loads(recovered.stdout)
    assert doc["run_id"] == run["id"] and "terraform_data.net" in doc["committed_addresses"]
    assert _run(world, run["id"])["run"]["status"] == "committed" and _live_reservations(world) == []
    net = next(r for r in head(world)["resources"] if r["name"] == "net")
    assert net["instances"][0]["attributes"]["input"]["value"] == "net-v2"
