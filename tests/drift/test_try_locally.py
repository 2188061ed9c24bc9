"""Trying drift locally as docs/drift.md shows: one command installs the test provider and prints what to
export and a configuration; applied through a server, an object edited behind Terraform's back is drift."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import kl_terraform_bin, terraform_env

pytestmark = pytest.mark.terraform
BIN = Path(sys.executable).parent


def test_the_documented_steps_install_the_provider_and_show_drift(live_server, tmp_path):
    where = tmp_path / "fakecloud"
    said = subprocess.run([sys.executable, "-m", "bench.fakecloud.install", str(where)], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path, check=True).stdout
    export = next(line for line in said.splitlines() if line.startswith("export TF_CLI_CONFIG_FILE="))
    sample = said.split("(add your backend \"http\" block):\n", 1)[1]
    config = tmp_path / "try-drift"
    config.mkdir()
    address = live_server.state_url("try")
    (config / "main.tf").write_text(sample + f'\nterraform {{\n  backend "http" {{\n    address = "{address}"\n'
                                    f'    lock_address = "{address}"\n    unlock_address = "{address}"\n'
                                    '    lock_method = "LOCK"\n    unlock_method = "UNLOCK"\n  }\n}\n')
    env = {**terraform_env(tmp_path), "TF_CLI_CONFIG_FILE": export.split("=", 1)[1]}
    for args in (["init", "-input=false"], ["apply", "-auto-approve", "-input=false"]):
        done = subprocess.run([kl_terraform_bin(), *args], cwd=config, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert subprocess.run([str(BIN / "kl"), "drift"], cwd=config, env=env, capture_output=True, text=True,
                          timeout=300).returncode == 0  # nothing changed yet

    [bucket] = (where / "cloud").rglob("logs.json")
    obj = json.loads(bucket.read_text())
    obj["size"] = 99
    bucket.write_text(json.dumps(obj))
    drift = subprocess.run([str(BIN / "kl"), "drift"], cwd=config, env=env, capture_output=True, text=True,
                           timeout=300)
    assert drift.returncode == 2, drift.stdout + drift.stderr
    assert "drifted  fakecloud_bucket.logs: size" in drift.stdout
