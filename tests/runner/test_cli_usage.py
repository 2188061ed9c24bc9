"""The installed ``kl`` as a first-day user meets it: usage errors, startup failures, hints, pipes.
Every test runs the real console script in a subprocess."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from runner.cli import build_parser
from runner.cli.support import leaf_parsers
from tests.runner.test_cli_read import seed, write_backend

KL = Path(sys.executable).with_name("kl")
REPO = Path(__file__).resolve().parents[2]


def kl(*args: str, cwd: Path, env: dict[str, str] | None = None,
       timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(KL), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={"PATH": os.environ["PATH"], "HOME": str(cwd), **(env or {})})


def leaf_commands() -> list[list[str]]:
    found = []
    for leaf in leaf_parsers(build_parser()):
        found.append(leaf.prog.split()[1:])
    return found


def test_kl_version_prints_the_package_version(tmp_path):
    result = kl("--version", cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.startswith("kl 0.") and result.stderr == ""


@pytest.mark.parametrize("command", leaf_commands(), ids=" ".join)
def test_every_subcommand_exits_3_with_its_own_usage_on_a_bad_flag(command, tmp_path):
    result = kl(*command, "--no-such-flag", cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    assert result.stderr.startswith(f"usage: kl {' '.join(command)} "), result.stderr
    assert ("unrecognized arguments: --no-such-flag" in result.stderr or "are required" in result.stderr)
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("args", [["state"], ["tokens", "create"], ["apply", "--wait", "soon"], ["runs", "--status",
                                                                                                 "happy"], []])
def test_missing_and_malformed_arguments_exit_3_with_the_right_usage(args, tmp_path):
    result = kl(*args, cwd=tmp_path)
    assert result.returncode == 3
    assert result.stderr.startswith("usage: kl" + "".join(f" {a}" for a in args if not a.startswith("-")
                                                        and a not in ("soon", "happy")))


def test_every_client_command_names_its_configuration_directory_with_dash_c_only():
    for leaf in leaf_parsers(build_parser()):
        options = {o for a in leaf._actions for o in a.option_strings}
        assert "--config-dir" not in options, leaf.prog
        if "--address" in options:
            assert {"-C", "--chdir"} <= options, leaf.prog
            assert not any(a.dest == "config_dir" for a in leaf._actions), leaf.prog


def test_dash_c_finds_the_backend_block_of_another_directory(live_server, tmp_path):
    seed(live_server.state_url("team"))
    (tmp_path / "infra").mkdir()
    write_backend(tmp_path / "infra", live_server.state_url("team"))
    result = kl("state", "ls", "-C", "infra", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "terraform_data.a[0]" in result.stdout
    missing = kl("plan", "-C", "nowhere", cwd=tmp_path)
    assert missing.returncode == 3 and "-C nowhere: no such directory" in missing.stderr


def test_dev_kl_runs_in_the_callers_directory(live_server, tmp_path):
    seed(live_server.state_url("team"))
    write_backend(tmp_path, live_server.state_url("team"))
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "KL_VENV": str(Path(sys.executable).parents[1])}
    result = subprocess.run([str(REPO / "dev"), "kl", "state", "ls"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=600, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["module.web.terraform_data.b", "terraform_data.a[0]"]


# --- startup failures: one paragraph with a hint, never a traceback ----------------------------------------------

def test_a_bad_log_level_is_a_configuration_error(tmp_path, clean_db):
    result = kl("migrate", cwd=tmp_path, env={"KL_LOG_LEVEL": "verbose", "KL_DATABASE_URL": clean_db})
    assert result.returncode == 3 and "Traceback" not in result.stderr
    assert "KL_LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL" in result.stderr


@pytest.mark.parametrize("url, hint", [
    ("postgresql://postgres@127.0.0.1:5432/kl_no_such_database", "createdb"),
    ("postgresql://postgres@127.0.0.1:9/kilolock", "is Postgres running"),
])
def test_an_unreachable_database_is_one_paragraph_with_a_hint(url, hint, tmp_path):
    for command in (["migrate"], ["serve", "--port", "0"], ["tenants", "list"]):
        result = kl(*command, cwd=tmp_path, env={"KL_DATABASE_URL": url})
        assert result.returncode == 1, (command, result.stderr)
        assert "Traceback" not in result.stderr and hint in result.stderr, (command, result.stderr)
        assert len(result.stderr.strip().splitlines()) <= 2, result.stderr
        assert "listening" not in result.stdout


def test_a_port_clash_is_reported_before_anything_is_printed(tmp_path, clean_db):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = kl("serve", "--port", str(port), cwd=tmp_path, env={"KL_DATABASE_URL": clean_db})
    assert result.returncode == 3 and result.stdout == ""
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr and "--port" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_banner_says_where_it_listens_where_clients_reach_it_and_the_dashboard(tmp_path, clean_db):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([str(KL), "serve", "--port", str(port)], cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env={"PATH": os.environ["PATH"], "KL_DATABASE_URL": clean_db,
                                 "KL_PUBLIC_URL": "https://kilolock.example.com"})
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(4)]
        assert lines[0].startswith(f"Kilolock listening on http://localhost:{port} ")
        assert lines[1].strip() == f"Dashboard: http://localhost:{port}/ui/"
        assert "https://kilolock.example.com (KL_PUBLIC_URL)" in lines[2]
        deadline = time.monotonic() + 60
        while True:
            try:
                root = requests.get(f"http://127.0.0.1:{port}/", timeout=5, allow_redirects=False)
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert root.status_code == 302 and root.headers["Location"].endswith("/ui/")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_closed_pipe_ends_kl_quietly(live_server, tmp_path):
    for n in range(30):
        requests.post(live_server.state_url(f"s{n:02d}"), data=json.dumps(
            {"version": 4, "serial": 1, "lineage": "l", "terraform_version": "1.9.0", "resources": [],
             "outputs": {}}), timeout=10)
    proc = subprocess.Popen([str(KL), "states", "--address", live_server.url], cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={"PATH": os.environ["PATH"]})
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader (head) went away before kl wrote anything
    stderr = proc.stderr.read()
    assert proc.wait(timeout=60) in (0, 1)
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr


# --- errors that say what to do next ---------------------------------------------------------------------------

def test_an_unknown_state_points_at_kl_states(live_server, tmp_path):
    result = kl("state", "ls", "--address", live_server.state_url("nope"), cwd=tmp_path)
    assert result.returncode == 1 and "kl states lists the states" in result.stderr


def test_a_refused_credential_names_where_it_came_from(live_server_factory, tmp_path):
    from app.config import AuthMode

    server = live_server_factory(auth_mode=AuthMode.STATIC, auth_token="the-right-token")
    url = server.state_url("x")
    flagged = kl("state", "ls", "--address", url, "--token", "wrong", cwd=tmp_path)
    assert flagged.returncode == 1 and "the credential came from --token" in flagged.stderr
    env = kl("state", "ls", "--address", url, cwd=tmp_path, env={"KL_TOKEN": "wrong", "TF_HTTP_PASSWORD": "x"})
    assert "the credential came from KL_TOKEN" in env.stderr
    tf = kl("state", "ls", "--address", url, cwd=tmp_path, env={"TF_HTTP_PASSWORD": "wrong"})
    assert "the credential came from TF_HTTP_PASSWORD" in tf.stderr
    (tmp_path / "main.tf").write_text(f'terraform {{\n  backend "http" {{\n    address = "{url}"\n'
                                      '    username = "ci"\n    password = "wrong"\n  }\n}\n')
    block = kl("state", "ls", cwd=tmp_path)
    assert "the credential came from the backend block's password" in block.stderr
    (tmp_path / "main.tf").unlink()
    none = kl("state", "ls", "--address", url, cwd=tmp_path)
    assert "kl sent no credential" in none.stderr


def test_file_selection_mistakes_say_which_file_to_name(tmp_path):
    write_backend(tmp_path, "http://127.0.0.1:9/v1/states/x")
    (tmp_path / "database.tf").write_text('resource "terraform_data" "db" {}\n')
    (tmp_path / "app.tf").write_text('module "app" {\n  source = "./modules/app"\n}\n')
    (tmp_path / "modules" / "app").mkdir(parents=True)
    (tmp_path / "modules" / "app" / "main.tf").write_text('resource "terraform_data" "m" {}\n')
    typo = kl("plan", "-f", "databse.tf", cwd=tmp_path)
    assert typo.returncode == 3 and "did you mean -f database.tf?" in typo.stderr
    inner = kl("plan", "-f", "modules/app/main.tf", cwd=tmp_path)
    assert inner.returncode == 3 and "-f app.tf (the file that calls that module)" in inner.stderr
    assert "--changed-from" in inner.stderr


def test_changed_from_sees_a_same_size_edit_made_in_the_second_of_the_commit(tmp_path):
    """git trusts an index entry whose stat data match unless the index is not older than the file; the
    copy of the index kl diffs with must keep that age, or such an edit goes unseen (a narrower plan)."""
    write_backend(tmp_path, "http://127.0.0.1:9/v1/states/x")
    (tmp_path / "app.tf").write_text('module "app" {\n  source = "./modules/app"\n}\n')
    (tmp_path / "modules" / "app").mkdir(parents=True)
    module = tmp_path / "modules" / "app" / "main.tf"
    module.write_text('resource "terraform_data" "m" {\n  input = "v1"\n}\n')
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "start"]):
        subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args], cwd=tmp_path,
                       check=True, capture_output=True, timeout=60)
    module.write_text('resource "terraform_data" "m" {\n  input = "v2"\n}\n')  # same size, same second
    result = kl("plan", "--changed-from", "HEAD", cwd=tmp_path)
    assert "no Terraform files changed" not in result.stderr
    assert result.returncode == 1 and "cannot reach Kilolock" in result.stderr, result.stderr


def test_a_tfvars_refusal_gives_its_full_plan_advice_once(tmp_path):
    write_backend(tmp_path, "http://127.0.0.1:9/v1/states/x")
    (tmp_path / "main.tf").write_text('variable "a" {}\nresource "terraform_data" "x" {\n  input = var.a\n}\n')
    # A values file Terraform does not load by itself (only -var-file reads it) cannot be scoped.
    (tmp_path / "prod.tfvars").write_text('a = "1"\n')
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "start"]):
        subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args], cwd=tmp_path,
                       check=True, capture_output=True, timeout=60)
    (tmp_path / "prod.tfvars").write_text('a = "2"\n')
    result = kl("plan", "--changed-from", "HEAD", cwd=tmp_path)
    assert result.returncode == 3 and "prod.tfvars: a variable-definitions file" in result.stderr, result.stderr
    assert result.stderr.count("full plan") == 1, result.stderr


def test_the_client_settings_and_data_directory_are_documented():
    text = (REPO / "docs" / "configuration.md").read_text()
    for needle in ("`KL_ACTOR`", "`KL_VENV`", "runs/RUN_ID/", "plugin-cache/", "hcl-cache.pickle"):
        assert needle in text, needle
