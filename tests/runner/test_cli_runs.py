"""kl reservations, kl runs and kl abort against a live server."""

from __future__ import annotations

import json
from datetime import datetime

import requests

from tests.runner.test_cli_read import kl


def open_run(url: str, actor: str, glob: str, mode: str = "write") -> dict:  # type: ignore[type-arg]
    response = requests.post(f"{url}/v1/engine/states/shared/runs", timeout=10,
                             json={"actor": actor, "reservations": [{"glob": glob, "mode": mode}]})
    assert response.status_code == 201, response.text
    return response.json()["run"]


def test_reservations_and_runs_print_json_with_the_documented_fields(live_server, tmp_path):
    run = open_run(live_server.url, "alice", "module.web.*")
    address = live_server.state_url("shared")
    reservations = json.loads(kl("reservations", "--json", "--address", address, cwd=tmp_path).stdout)
    assert reservations == [{
        "state": "shared", "glob": "module.web.*", "mode": "write", "holder": "alice", "run_id": run["id"],
        "acquired_at": reservations[0]["acquired_at"], "expires_at": reservations[0]["expires_at"]}]
    assert datetime.fromisoformat(reservations[0]["expires_at"]).utcoffset() is not None
    listed = json.loads(kl("runs", "--json", "--address", address, cwd=tmp_path).stdout)
    assert [(r["id"], r["state"], r["status"], r["actor"]) for r in listed] == [
        (run["id"], "shared", "reserved", "alice")]
    assert set(listed[0]) >= {"id", "state", "status", "actor", "started_at", "finished_at", "base_serial",
                              "committed_serial"}
    assert datetime.fromisoformat(listed[0]["started_at"]).utcoffset() is not None


def test_reservations_reads_like_the_conflict_message(live_server, tmp_path):
    run = open_run(live_server.url, "alice", "module.web.*")
    result = kl("reservations", "--address", live_server.url, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"write module.web.*\theld by alice ({run['id']}, acquired " in result.stdout
    assert "expires in 14m" in result.stdout or "expires in 15m" in result.stdout


def test_abort_frees_the_addresses_of_a_stuck_run(live_server, tmp_path):
    run = open_run(live_server.url, "alice", "module.web.*")
    result = kl("abort", run["id"], "--reason", "SIGKILLed", "--address", live_server.url, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "aborted" in result.stdout
    assert json.loads(kl("reservations", "--json", "--address", live_server.url, cwd=tmp_path).stdout) == []
    again = kl("abort", run["id"], "--address", live_server.url, cwd=tmp_path)
    assert again.returncode == 1 and "already aborted" in again.stderr
    missing = kl("abort", "ar_missing", "--address", live_server.url, cwd=tmp_path)
    assert missing.returncode == 1 and "no apply run" in missing.stderr


def test_operators_manage_tenants_and_tokens_from_the_cli(clean_db, tmp_path):
    env = {"KL_DATABASE_URL": clean_db}
    assert kl("tenants", "create", "acme", "--name", "Acme Corp", cwd=tmp_path, env=env).returncode == 0
    again = kl("tenants", "create", "acme", cwd=tmp_path, env=env)
    assert again.returncode == 3 and "already exists" in again.stderr
    created = kl("tokens", "create", "acme", "--name", "ci", "--environment", "prod", "--json", cwd=tmp_path, env=env)
    assert created.returncode == 0, created.stderr
    answer = json.loads(created.stdout)
    assert answer["token_secret"].startswith("kl_")
    listed = kl("tokens", "list", "acme", "--json", cwd=tmp_path, env=env)
    assert answer["token_secret"] not in listed.stdout
    assert [t["id"] for t in json.loads(listed.stdout)] == [answer["token"]["id"]]
    revoked = kl("tokens", "revoke", "acme", answer["token"]["id"], cwd=tmp_path, env=env)
    assert revoked.returncode == 0 and "revoked" in revoked.stdout
    assert json.loads(kl("tokens", "list", "acme", "--json", cwd=tmp_path, env=env).stdout)[0]["revoked_at"]
    unknown = kl("tokens", "list", "nobody", cwd=tmp_path, env=env)
    assert unknown.returncode == 3 and "kl tenants create nobody" in unknown.stderr


def test_tokens_create_builds_its_block_from_the_public_url_and_prints_it_in_json_too(clean_db, tmp_path):
    env = {"KL_DATABASE_URL": clean_db, "KL_PUBLIC_URL": "https://kl.example.com/"}
    assert kl("tenants", "create", "acme", cwd=tmp_path, env=env).returncode == 0
    text = kl("tokens", "create", "acme", "--name", "ci", "--environment", "prod", cwd=tmp_path, env=env)
    assert text.returncode == 0, text.stderr
    assert 'address        = "https://kl.example.com/v1/states/' in text.stdout
    created = kl("tokens", "create", "acme", "--name", "cd", "--environment", "stage", "--json", cwd=tmp_path, env=env)
    answer = json.loads(created.stdout)
    ids = f"{answer['workspace_id']}/{answer['environment_id']}"
    assert (answer["workspace_id"], answer["environment_id"]) == (answer["token"]["workspace_id"],
                                                                   answer["token"]["environment_id"])
    assert f'"https://kl.example.com/v1/states/{ids}/prod"' in answer["backend_block"]
    assert f'username       = "{answer["workspace_id"]}"' in answer["backend_block"]
    chosen = kl("tokens", "create", "acme", "--name", "x", "--environment", "prod", "--server-url",
                "http://10.0.0.5:8080", cwd=tmp_path, env=env)
    assert '"http://10.0.0.5:8080/v1/states/' in chosen.stdout and "kl.example.com" not in chosen.stdout


def _open(url: str, actor: str, glob: str, info: dict) -> str:  # type: ignore[type-arg]
    response = requests.post(f"{url}/v1/engine/states/shared/runs", timeout=10, json={
        "actor": actor, "reservations": [{"glob": glob, "mode": "write"}], "info": info})
    assert response.status_code == 201, response.text
    return str(response.json()["run"]["id"])


def _close(url: str, run_id: str, actor: str, status: str, summary: str = "") -> None:
    response = requests.post(f"{url}/v1/engine/runs/{run_id}/close", timeout=10,
                             json={"holder": actor, "status": status, "error_summary": summary})
    assert response.status_code == 200, response.text


def test_kl_runs_shows_kinds_finish_times_durations_and_why_a_run_failed(live_server, tmp_path):
    url = live_server.url
    dry = _open(url, "alice", "module.a.*", {"dry_run": True})
    _close(url, dry, "alice", "aborted")
    drift = _open(url, "bob", "module.b.*", {"kind": "drift"})
    _close(url, drift, "bob", "aborted")
    failed = _open(url, "carol", "module.c.*", {"dry_run": False})
    _close(url, failed, "carol", "failed", "Error: exit status 1\n\n  on main.tf line 3:\nprovisioner failed")
    live = _open(url, "dave", "module.d.*", {})

    listed = kl("runs", "--address", url, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split("\t")[0]: line.split("\t") for line in listed.stdout.splitlines()}
    assert [c.strip() for c in rows[dry][2:4]] == ["dry-run", "aborted"]
    assert [c.strip() for c in rows[drift][2:4]] == ["drift", "aborted"]
    assert [c.strip() for c in rows[failed][2:4]] == ["apply", "failed"]
    assert rows[failed][-1] == "Error: exit status 1"  # the error summary's first line
    assert rows[failed][6].startswith("finished 20") and rows[live][6] == "finished -"
    assert rows[live][7].endswith("so far")
    by_kind = {r["id"]: r["kind"] for r in json.loads(kl("runs", "--json", "--address", url, cwd=tmp_path).stdout)}
    assert by_kind == {dry: "dry-run", drift: "drift", failed: "apply", live: "apply"}
    assert kl("runs", "--status", "committed", "--address", url, cwd=tmp_path).stdout == \
        "no apply runs with status committed\n"

    shown = kl("runs", "show", failed, "--address", url, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert out.startswith(f"run {failed} on shared: apply, failed\n")
    assert "  why it failed:\n    Error: exit status 1\n" in out and "provisioner failed" in out
    assert "opened, reservations granted" in out and "  by carol" in out
    held = kl("runs", "show", live, "--address", url, cwd=tmp_path).stdout
    assert "  holds:\n    write module.d.*\n" in held
    doc = json.loads(kl("runs", "show", live, "--json", "--address", url, cwd=tmp_path).stdout)
    assert doc["run"]["kind"] == "apply" and [r["glob"] for r in doc["reservations"]] == ["module.d.*"]
    assert {e["kind"] for e in doc["events"]} == {"run_open", "reservation_acquire"}
    missing = kl("runs", "show", "ar_missing", "--address", url, cwd=tmp_path)
    assert missing.returncode == 1 and "ar_missing" in missing.stderr
