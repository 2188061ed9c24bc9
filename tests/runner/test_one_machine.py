"""Several kl processes on one machine, against a real server with real Terraform and real git: file-scoped
plans at once on one data directory, plan files that never count as configuration changes, and a waiting
kl whose queue place ends with it (Ctrl-C or SIGTERM)."""

from __future__ import annotations

import json
import signal
import subprocess

import psycopg
import pytest
import requests

from tests.conftest import Workdir, wait_for

pytestmark = pytest.mark.terraform

COUNT = 8
FILES = {f"r{n}.tf": f'resource "terraform_data" "r{n}" {{\n  input = "r{n}-v1"\n}}\n' for n in range(COUNT)}


@pytest.fixture
def repo(live_server, workdir_factory):  # type: ignore[no-untyped-def]
    r = workdir_factory("repo", live_server.state_url("machine"))
    r.seed(FILES)
    r.write(".gitignore", ".terraform/\n.terraform.lock.hcl\n")
    r.git("init", "-q")
    r.git("add", "-A")
    r.git("commit", "-qm", "trunk")
    for n in range(COUNT):
        r.edit(f"r{n}.tf", f"r{n}-v1", f"r{n}-v2")
    return r


def plan_files_at_once(repo: Workdir) -> list[subprocess.CompletedProcess[str]]:
    # Half write the default plan file (all the same one), half their own.
    procs = [repo.kl_popen("plan", "-f", f"r{n}.tf", *(() if n % 2 else ("--out", f"p{n}.igplan")))
             for n in range(COUNT)]
    done = []
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, ""))
    return done


def test_eight_file_scoped_plans_at_once_share_one_data_directory_and_plan_files_are_never_changes(repo):
    done = plan_files_at_once(repo)
    assert [p.returncode for p in done] == [0] * COUNT, "\n".join(p.stdout for p in done)
    assert not any("Traceback" in p.stdout for p in done)
    for n in range(0, COUNT, 2):
        spec = json.loads((repo.dir / f"p{n}.igplan").read_text())
        assert spec["write_set"] == [f"terraform_data.r{n}"] and spec["selected_files"] == [f"r{n}.tf"]
    # The default plan file went into .kilolock/ (and kl said so); the last writer's plan is there, whole.
    assert "wrote .kilolock/kl-plan.igplan: apply it with kl apply .kilolock/kl-plan.igplan" in done[1].stdout
    default = json.loads((repo.dir / ".kilolock" / "kl-plan.igplan").read_text())
    assert default["selected_files"] in [[f"r{n}.tf"] for n in range(1, COUNT, 2)]
    data_dir = repo.dir.parent / "kl-data"
    assert (data_dir / "hcl-cache.pickle").is_file()
    assert [p for p in data_dir.rglob("*") if p.name.endswith(".tmp")] == []

    # git never sees .kilolock/; the untracked plan files are recognised as plan files by their content.
    status = repo.git("status", "--porcelain", "--untracked-files=all")
    assert ".kilolock" not in status and "p0.igplan" in status
    changed = repo.kl("plan", "--changed-from", "HEAD", "--out", "changed.json")
    assert changed.returncode == 0, changed.stdout + changed.stderr
    spec = json.loads((repo.dir / "changed.json").read_text())
    assert spec["selected_files"] == sorted(FILES) and len(spec["write_set"]) == COUNT
    # A file that only looks like a plan file by its name is still a change nothing is known to read.
    repo.write("fake.igplan", '{"kilolock": "not a plan"}\n')
    refused = repo.kl("plan", "--changed-from", "HEAD")
    assert refused.returncode == 3 and "fake.igplan" in refused.stderr, refused.stdout + refused.stderr
    # A plan file that cannot be written is a usage error saying so, never a traceback.
    unwritable = repo.kl("plan", "-f", "r0.tf", "--out", "/proc/kilolock/p.igplan")
    assert unwritable.returncode == 3 and "cannot write the plan file" in unwritable.stderr, unwritable.stderr
    assert "Traceback" not in unwritable.stderr


def _waiters(database_url: str) -> list[str]:
    with psycopg.connect(database_url) as conn:
        return [h for (h,) in conn.execute("SELECT holder FROM reservation_waiters ORDER BY id")]


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_kl_apply_waiting_in_the_queue_gives_its_place_up_when_stopped(repo, live_server, signum, code):
    assert repo.kl("plan", "-f", "r0.tf", "--out", "p0.igplan").returncode == 0
    held = requests.post(f"{live_server.url}/v1/engine/states/machine/runs", timeout=30, json={
        "actor": "holder", "lease_seconds": 600, "reservations": [{"glob": "terraform_data.r0", "mode": "write"}]})
    assert held.status_code == 201, held.text
    waiting = repo.kl_popen("apply", "p0.igplan", "--actor", "alice", "--wait", "10m")
    database_url = live_server.settings.database_url
    wait_for(lambda: _waiters(database_url) == ["alice"], "kl apply to queue behind the holder", timeout=300)
    waiting.send_signal(signum)
    out, _ = waiting.communicate(timeout=120)
    assert waiting.returncode == code, out
    # Gone at once, not when the ticket's window lapses: nobody else has asked since.
    assert _waiters(database_url) == []
    events = requests.get(f"{live_server.url}/v1/engine/states/machine/events", timeout=30).json()["events"]
    assert any(e["kind"] == "reservation_wait_cancelled" and e["detail"]["holder"] == "alice" for e in events)
