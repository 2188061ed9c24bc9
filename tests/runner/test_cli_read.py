"""kl's read commands against a live server, finding it from the backend block."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import requests

from tests.helpers import instance, resource, state


def kl(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("kl")
    return subprocess.run([str(exe), *args], cwd=cwd, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", **(env or {})})


def write_backend(directory: Path, address: str) -> None:
    (directory / "backend.tf").write_text(
        'terraform {\n  backend "http" {\n'
        f'    address = "{address}"\n    lock_address = "{address}"\n    unlock_address = "{address}"\n'
        '    lock_method = "LOCK"\n    unlock_method = "UNLOCK"\n  }\n}\n'
    )


def seed(url: str) -> None:
    for body in (
        state(1, [resource("a", [instance(0, "x"), instance(1, "y")])]),
        state(2, [resource("a", [instance(0, "x2")]), resource("b", [instance(None, "z")], module="module.web")]),
    ):
        assert requests.post(url, data=body, timeout=10).status_code == 200


def test_state_ls_finds_the_server_from_the_backend_block(live_server, tmp_path):
    seed(live_server.state_url("team"))
    write_backend(tmp_path, live_server.state_url("team"))
    result = kl("state", "ls", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["module.web.terraform_data.b", "terraform_data.a[0]"]
    older = kl("state", "ls", "--serial", "1", cwd=tmp_path)
    assert older.stdout.splitlines() == ["terraform_data.a[0]", "terraform_data.a[1]"]
    scoped = kl("state", "ls", "--prefix", "module.web", "--json", cwd=tmp_path)
    assert [r["address"] for r in json.loads(scoped.stdout)["resources"]] == ["module.web.terraform_data.b"]


def test_state_history_prints_each_lifecycle(live_server, tmp_path):
    seed(live_server.state_url("team"))
    result = kl("state", "history", "terraform_data.a[0]", "--address", live_server.state_url("team"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith("serials [1, 2)") and lines[1].startswith("serials [2, )")


def test_kl_blame_prints_who_changed_each_instance_and_pages_a_glob(live_server, tmp_path):
    seed(live_server.state_url("team"))
    url = live_server.state_url("team")
    result = kl("blame", "terraform_data.a.*", "--address", url, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "terraform_data.a[0]" and lines[3] == "terraform_data.a[1]"
    assert "serial      2  changed   id, input, output  by anonymous via terraform" in lines[1]
    assert "serial      1  created" in lines[2] and "serial      2  destroyed" in lines[4]
    assert "x2" not in result.stdout  # names, never values
    paged = kl("blame", "*", "--limit", "1", "--json", "--address", url, cwd=tmp_path)
    page = json.loads(paged.stdout)
    assert [i["address"] for i in page["instances"]] == ["module.web.terraform_data.b"]
    assert page["next_after"] == "module.web.terraform_data.b"
    rest = json.loads(kl("blame", "*", "--after", page["next_after"], "--json", "--address", url, cwd=tmp_path).stdout)
    assert [i["address"] for i in rest["instances"]] == ["terraform_data.a[0]", "terraform_data.a[1]"]
    assert rest["next_after"] is None


def test_flags_and_kl_variables_override_the_backend_block(live_server, tmp_path):
    seed(live_server.state_url("other"))
    write_backend(tmp_path, live_server.state_url("missing"))
    via_env = kl("state", "ls", cwd=tmp_path, env={"KL_STATE": "other"})
    assert via_env.returncode == 0 and "terraform_data.a[0]" in via_env.stdout
    via_flag = kl("states", "--json", "--address", live_server.url, cwd=tmp_path)
    assert [s["name"] for s in json.loads(via_flag.stdout)] == ["other"]


def test_errors_say_what_to_do_and_use_the_documented_exit_codes(live_server, tmp_path):
    no_config = kl("state", "ls", cwd=tmp_path)
    assert no_config.returncode == 3 and "--address" in no_config.stderr
    unknown = kl("state", "ls", "--address", live_server.state_url("nope"), cwd=tmp_path)
    assert unknown.returncode == 1 and "no state named 'nope'" in unknown.stderr
    down = kl("state", "ls", "--address", "http://127.0.0.1:9/v1/states/x", cwd=tmp_path)
    assert down.returncode == 1 and "kl serve" in down.stderr


def test_kl_migrate_is_safe_to_rerun(clean_db, tmp_path):
    result = kl("migrate", cwd=tmp_path, env={"KL_DATABASE_URL": clean_db})
    assert result.returncode == 0, result.stderr
    assert "up to date" in result.stdout


def test_kl_states_says_so_when_nothing_is_visible(live_server, tmp_path):
    empty = kl("states", "--address", live_server.url, cwd=tmp_path)
    assert empty.returncode == 0 and f"no states visible on {live_server.url}" in empty.stdout
    assert json.loads(kl("states", "--json", "--address", live_server.url, cwd=tmp_path).stdout) == []
