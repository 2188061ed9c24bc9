"""Vanilla Terraform and Kilolock reservations on one state: each blocks the other, Terraform
shows who holds the addresses, and -lock-timeout waits for a release."""

from __future__ import annotations

import json
import threading
import time

import pytest
import requests

from tests.conftest import held_until

pytestmark = pytest.mark.terraform


def config(address: str, command: str = "", value: str = "v1") -> str:
    """The configuration of one resource; with ``command``, its creation runs that command first."""
    provisioner = f'  provisioner "local-exec" {{\n    command = "{command}"\n  }}\n' if command else ""
    return (
        'terraform {\n  backend "http" {\n'
        f'    address = "{address}"\n    lock_address = "{address}"\n    unlock_address = "{address}"\n'
        '    lock_method = "LOCK"\n    unlock_method = "UNLOCK"\n  }\n}\n'
        f'resource "terraform_data" "web" {{\n  input = "{value}"\n{provisioner}}}\n'
    )


def open_run(url: str, actor: str, glob: str, mode: str = "write") -> requests.Response:
    return requests.post(f"{url}/v1/engine/states/coexist/runs", timeout=10,
                         json={"actor": actor, "reservations": [{"glob": glob, "mode": mode}]})


def test_terraform_apply_meets_a_live_reservation_and_waits_for_its_release(live_server, terraform_factory):
    address = live_server.state_url("coexist")
    tf = terraform_factory()
    tf.write("main.tf", config(address))
    tf("init", "-input=false")
    run = open_run(live_server.url, "alice", "module.web.*")
    assert run.status_code == 201
    run_id = run.json()["run"]["id"]

    refused = tf("apply", "-auto-approve", "-input=false", check=False)
    assert refused.returncode != 0
    assert "alice" in refused.output and "module.web.*" in refused.output and run_id in refused.output

    release = threading.Timer(3.0, lambda: requests.post(f"{live_server.url}/v1/engine/runs/{run_id}/release",
                                                         json={"holder": "alice"}, timeout=10))
    release.start()
    started = time.monotonic()
    waited = tf("apply", "-auto-approve", "-input=false", "-lock-timeout=60s")
    assert time.monotonic() - started >= 2.5
    assert "Apply complete" in waited.output
    assert json.loads(requests.get(address, timeout=10).content)["resources"][0]["name"] == "web"


def test_an_engine_acquire_conflicts_while_terraform_holds_the_lock(live_server, terraform_factory, tmp_path):
    address = live_server.state_url("coexist")
    tf = terraform_factory()
    gate = tmp_path / "release-apply"
    tf.write("main.tf", config(address, command=held_until(gate)))
    tf("init", "-input=false")
    # bob's probes below hold a read reservation for a moment each; Terraform's LOCK may land in one of
    # those moments (423), so it retries its lock rather than exiting.
    apply = tf.popen("apply", "-auto-approve", "-input=false", "-lock-timeout=120s")
    try:
        # Terraform may take long to start on a loaded machine: poll for as long as it runs.
        deadline = time.monotonic() + 300
        conflict = None
        while apply.poll() is None and time.monotonic() < deadline:
            attempt = open_run(live_server.url, "bob", "module.unrelated.*", mode="read")
            if attempt.status_code == 409:
                conflict = attempt.json()
                break
            assert attempt.status_code == 201
            requests.post(f"{live_server.url}/v1/engine/runs/{attempt.json()['run']['id']}/release",
                          json={"holder": "bob"}, timeout=10)
            time.sleep(0.2)
        assert conflict is not None, f"Terraform never took the lock (exit {apply.poll()})"
        assert conflict["conflicts"][0]["glob"] == "*"
        assert "Terraform state lock" in conflict["error"]
    finally:
        gate.touch()
        output, _ = apply.communicate(timeout=120)
    assert apply.returncode == 0, output
    assert open_run(live_server.url, "bob", "module.unrelated.*").status_code == 201
