"""The README's service command on a machine with no Postgres configured: `kl serve` boots the
embedded Postgres under KL_DATA_DIR, prints the backend block, and stock Terraform applies through it.
Also the control API on its own listener (`kl serve --control-port`)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import requests

from tests.conftest import kl_terraform_bin, terraform_env

BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(url: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else "server exited"
        try:
            if requests.get(url + "/healthz", timeout=1).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.2)
    raise AssertionError("server never became healthy")


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KL_", "TF_HTTP_"))}
    env.update(extra)
    return env


@pytest.mark.terraform
def test_kl_serve_runs_on_an_embedded_postgres_and_terraform_applies_through_it(tmp_path):
    port = _free_port()
    # Outside pytest's per-user root, which every pytest session starting on the machine resets to 0700:
    # as root, the embedded Postgres runs as its own user and must be able to reach its data.
    data_dir = Path(tempfile.mkdtemp(prefix="kl-fresh-machine-")) / "data"
    env = _clean_env(KL_DATA_DIR=str(data_dir))
    proc = subprocess.Popen([str(BIN / "kl"), "serve", "--port", str(port)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_healthy(base, proc)
        config = tmp_path / "config"
        config.mkdir()
        address = f"{base}/v1/states/fresh"
        (config / "main.tf").write_text(
            f'terraform {{\n  backend "http" {{\n    address = "{address}"\n    lock_address = "{address}"\n'
            f'    unlock_address = "{address}"\n    lock_method = "LOCK"\n    unlock_method = "UNLOCK"\n  }}\n}}\n'
            'resource "terraform_data" "hello" {\n  input = "world"\n}\n')
        tf_env = terraform_env(tmp_path)
        for args in (["init", "-input=false"], ["apply", "-auto-approve", "-input=false"]):
            done = subprocess.run([kl_terraform_bin(), *args], cwd=config, env=tf_env, capture_output=True,
                                  text=True, timeout=120)
            assert done.returncode == 0, done.stdout + done.stderr
        assert requests.get(address, timeout=5).json()["resources"][0]["name"] == "hello"
        assert (data_dir / "postgres").exists() or any(data_dir.iterdir())
    finally:
        proc.terminate()
        output, _ = proc.communicate(timeout=30)
        subprocess.run([str(BIN / "kl"), "embedded", "stop"], env=env, capture_output=True, timeout=60)
        shutil.rmtree(data_dir.parent, ignore_errors=True)
    assert 'backend "http"' in output and f"http://localhost:{port}/v1/states/example" in output
    assert "embedded Postgres" in output


def test_the_control_api_can_live_on_its_own_port(clean_db, tmp_path):
    port, control = _free_port(), _free_port()
    env = _clean_env(KL_DATABASE_URL=clean_db, KL_AUTH_MODE="database", KL_CONTROL_TOKEN="ctl-secret",
                     KL_SESSION_SECRET="test-session-secret-0123456789-abcdefghijkl",
                     KL_DATA_DIR=str(tmp_path))
    proc = subprocess.Popen([str(BIN / "kl"), "serve", "--port", str(port), "--control-port", str(control)],
                            env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", proc)
        headers = {"Authorization": "Bearer ctl-secret"}
        created = requests.post(f"http://127.0.0.1:{control}/v1/api/tenants", json={"slug": "acme"},
                                headers=headers, timeout=5)
        assert created.status_code == 201
        assert requests.get(f"http://127.0.0.1:{port}/v1/api/tenants", headers=headers, timeout=5).status_code == 404
        assert requests.get(f"http://127.0.0.1:{control}/v1/states/x", timeout=5).status_code == 404
        # The control API's block names the main listener, where states are served, not the control port.
        token = requests.post(f"http://127.0.0.1:{control}/v1/api/tenants/acme/tokens", headers=headers,
                              json={"name": "ci", "environment": "prod"}, timeout=5).json()
        ids = f"{token['workspace_id']}/{token['environment_id']}"
        assert f'address        = "http://localhost:{port}/v1/states/{ids}/prod"' in token["backend_block"]
        assert f":{control}" not in token["backend_block"]
    finally:
        proc.terminate()
        output, _ = proc.communicate(timeout=30)
    # In database mode the printed block carries the username Basic auth needs, and says where the ids come from.
    assert f'address        = "http://localhost:{port}/v1/states/<workspace_id>/<environment_id>/example"' in output
    assert 'username       = "<workspace_id>"' in output and "kl tokens create" in output


def test_open_mode_refuses_a_public_address_unless_forced(clean_db, tmp_path):
    env = _clean_env(KL_DATABASE_URL=clean_db, KL_DATA_DIR=str(tmp_path))
    refused = subprocess.run([str(BIN / "kl"), "serve", "--host", "0.0.0.0", "--port", str(_free_port())],
                             env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 3 and "--allow-open-on-network" in refused.stderr


def test_a_missing_secret_stops_startup_listing_every_missing_setting(tmp_path):
    env = _clean_env(KL_AUTH_MODE="database", KL_DATA_DIR=str(tmp_path))
    failed = subprocess.run([str(BIN / "kl"), "serve", "--port", str(_free_port())], env=env, capture_output=True,
                            text=True, timeout=60)
    assert failed.returncode == 3 and "KL_CONTROL_TOKEN" in failed.stderr


def test_a_port_in_use_is_one_line_and_exit_3(clean_db, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = _clean_env(KL_DATABASE_URL=clean_db, KL_DATA_DIR=str(tmp_path))
        refused = subprocess.run([str(BIN / "kl"), "serve", "--port", str(port)], env=env, capture_output=True,
                                 text=True, timeout=60)
    assert refused.returncode == 3 and refused.stdout == ""
    [line] = refused.stderr.splitlines()
    assert line.startswith(f"kl: cannot listen on 127.0.0.1:{port} for the service")


def test_kl_serve_logs_one_line_per_request_without_colour_codes(clean_db, tmp_path):
    port = _free_port()
    log = tmp_path / "serve.log"
    env = _clean_env(KL_DATABASE_URL=clean_db, KL_DATA_DIR=str(tmp_path))
    with log.open("w") as out:
        proc = subprocess.Popen([str(BIN / "kl"), "serve", "--port", str(port)], env=env, text=True, stdout=out,
                                stderr=subprocess.STDOUT)
        try:
            _wait_healthy(f"http://127.0.0.1:{port}", proc)
            assert requests.get(f"http://127.0.0.1:{port}/v1/states/nowhere", timeout=5).status_code == 404
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    text = log.read_text()
    assert "\x1b[" not in text
    assert len([line for line in text.splitlines() if "/v1/states/nowhere" in line]) == 1, text
