"""A checkout of a configuration using the fakecloud provider, against a live Kilolock server: files for
buckets (one in an aliased region, one with a sensitive secret), a queue referencing a bucket, and a data
source reading a bucket. Tests drive vanilla Terraform, ``kl``, and the cloud behind Terraform's back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import requests

from bench.common import http_backend
from bench.fakecloud.cloud import Cloud
from bench.fakecloud.install import Installed, required_providers

PROVIDERS = required_providers() + """
provider "fakecloud" {}

provider "fakecloud" {
  alias  = "east"
  region = "east"
}
"""

FILES = {
    "providers.tf": PROVIDERS,
    "buckets.tf": 'resource "fakecloud_bucket" "logs" {\n  name   = "logs"\n  size   = 10\n'
                  '  secret = "hunter2-original"\n}\n\n'
                  'resource "fakecloud_bucket" "backup" {\n  provider = fakecloud.east\n  name     = "backup"\n'
                  '  size     = 1\n}\n',
    "queues.tf": 'resource "fakecloud_queue" "jobs" {\n  name   = "jobs"\n  bucket = fakecloud_bucket.logs.name\n'
                 '  delay  = 5\n}\n',
    "lookups.tf": 'data "fakecloud_bucket" "logs" {\n  name = fakecloud_bucket.logs.name\n}\n\n'
                  'output "logs_size" {\n  value = data.fakecloud_bucket.logs.size\n}\n',
    "archive.tf": 'resource "fakecloud_bucket" "archive" {\n  provider = fakecloud.east\n  name     = "archive"\n'
                  '  size     = 100\n}\n',
    "misc.tf": 'resource "terraform_data" "note" {\n  input = "v1"\n}\n',
}


def kl_terraform_bin() -> str:
    from tests.conftest import kl_terraform_bin as found

    return found()


class CloudRepo:
    def __init__(self, root: Path, url: str, env: dict[str, str], cloud: Cloud) -> None:
        self.dir, self.url, self.env, self.cloud = root, url, env, cloud
        root.mkdir(parents=True, exist_ok=True)

    def write(self, name: str, text: str) -> None:
        (self.dir / name).write_text(text)

    def edit(self, name: str, old: str, new: str) -> None:
        text = (self.dir / name).read_text()
        assert old in text, (name, old)
        self.write(name, text.replace(old, new))

    def run(self, *args: str, check: bool = True, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(list(args), cwd=cwd or self.dir, env={**self.env, **(env or {})}, capture_output=True,
                              text=True, timeout=300)
        assert not check or proc.returncode == 0, proc.stdout + proc.stderr
        return proc

    def tf(self, *args: str, check: bool = True, binary: str | None = None) -> subprocess.CompletedProcess[str]:
        return self.run(binary or kl_terraform_bin(), *args, check=check)

    def kl(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return self.run(str(Path(sys.executable).with_name("kl")), *args, check=False, env=env)

    def kl_popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([str(Path(sys.executable).with_name("kl")), *args], cwd=self.dir, env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def trunk(self) -> dict[str, Any]:
        doc: dict[str, Any] = requests.get(self.url, timeout=10).json()
        return doc

    def instance(self, address: str) -> dict[str, Any] | None:
        """The trunk's attributes of a root-module managed instance ``type.name`` (None when absent)."""
        type_, name = address.split(".")
        for res in self.trunk()["resources"]:
            if res["mode"] == "managed" and res["type"] == type_ and res["name"] == name:
                attributes: dict[str, Any] = res["instances"][0]["attributes"]
                return attributes
        return None

    def serial(self) -> int:
        return int(self.trunk()["serial"])

    def converged(self) -> None:
        plan = self.tf("plan", "-detailed-exitcode", "-input=false", "-refresh=false", check=False)
        assert plan.returncode == 0, "vanilla terraform plan shows changes:\n" + plan.stdout[-3000:] + plan.stderr

    def drift_json(self, *args: str) -> tuple[int, dict[str, Any]]:
        done = self.kl("drift", "--json", *args)
        assert done.returncode in (0, 2), done.stdout + done.stderr
        return done.returncode, json.loads(done.stdout)


def make_repo(root: Path, url: str, installed: Installed, base_env: dict[str, str]) -> CloudRepo:
    """Write the configuration, create everything with vanilla Terraform through the HTTP backend."""
    cloud_root = root / "cloud"
    env = {**base_env, **installed.env(cloud_root), "KL_DATA_DIR": str(root / "kl-data"),
           "PATH": os.environ["PATH"], "HOME": str(root)}
    repo = CloudRepo(root / "repo", url, env, Cloud(cloud_root))
    repo.write("backend.tf", http_backend(url))
    for name, text in FILES.items():
        repo.write(name, text)
    repo.tf("init", "-input=false")
    repo.tf("apply", "-auto-approve", "-input=false")
    return repo
