"""File-scoped applies over real objects (the fakecloud provider): a deleted block and its output, a module
renamed with ``moved`` and nothing else, a data source reading a resized bucket. Each ends as a full apply
would: the objects, the trunk and a vanilla plan agree."""

from __future__ import annotations

import pytest

from tests.fakecloud.world import CloudRepo

pytestmark = pytest.mark.terraform

MODULE = ('variable "name" {\n  type = string\n}\n\nresource "terraform_data" "x" {\n  input = var.name\n}\n\n'
          'output "out" {\n  value = terraform_data.x.output\n}\n')
NETWORK = 'resource "fakecloud_bucket" "keep" {\n  name = "keep"\n}\n'
OLD = '\nresource "fakecloud_bucket" "old" {\n  name = "old"\n  size = 3\n}\n'
OUTPUTS = 'output "keep_arn" {\n  value = fakecloud_bucket.keep.arn\n}\n'
OLD_OUTPUT = '\noutput "old_arn" {\n  value = fakecloud_bucket.old.arn\n}\n'


def commit(repo: CloudRepo) -> None:
    repo.run("git", "add", "-A")
    repo.run("git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "step")


def applied(repo: CloudRepo, *args: str) -> str:
    done = repo.kl("apply", *args, "--confirm-scope", "--actor", "alice")
    assert done.returncode == 0 and "committed at serial" in done.stdout, done.stdout + done.stderr
    return done.stdout


def test_deletions_moves_and_data_sources_end_as_a_full_apply(cloud_repo: CloudRepo) -> None:
    repo = cloud_repo
    (repo.dir / "mods" / "m").mkdir(parents=True)
    repo.write("mods/m/main.tf", MODULE)
    repo.write("c.tf", 'module "m" {\n  source = "./mods/m"\n  name   = "c1"\n}\n')
    repo.write("d.tf", 'resource "terraform_data" "d" {\n  input = module.m.out\n}\n')
    repo.write("network.tf", NETWORK + OLD)
    repo.write("outputs.tf", OUTPUTS + OLD_OUTPUT)
    repo.tf("init", "-input=false")
    repo.tf("apply", "-auto-approve", "-input=false")
    repo.write(".gitignore", ".terraform/\n*.igplan\n.terraform.lock.hcl\n")
    repo.run("git", "init", "-q")
    commit(repo)
    assert "old" in repo.cloud.names("local", "bucket")

    # A block and its output deleted, not yet committed: -f sees them against HEAD.
    repo.write("network.tf", NETWORK)
    repo.write("outputs.tf", OUTPUTS)
    out = applied(repo, "-f", "network.tf", "-f", "outputs.tf")
    assert "delete   fakecloud_bucket.old" in out and "old_arn (delete)" in out and "write output.old_arn" in out
    assert repo.cloud.names("local", "bucket") == ["keep", "logs"]
    assert repo.instance("fakecloud_bucket.old") is None and "old_arn" not in repo.trunk()["outputs"]
    repo.converged()
    commit(repo)

    # A module renamed with moved and nothing else: the row depending on it is rewritten, and committed.
    repo.write("c.tf", 'module "m2" {\n  source = "./mods/m"\n  name   = "c1"\n}\n\n'
                       'moved {\n  from = module.m\n  to   = module.m2\n}\n')
    repo.write("d.tf", 'resource "terraform_data" "d" {\n  input = module.m2.out\n}\n')
    out = applied(repo, "--changed-from", "HEAD")
    assert "no-op    terraform_data.d" in out
    deps = {r["name"]: r["instances"][0].get("dependencies") for r in repo.trunk()["resources"]}
    assert deps["d"] == ["module.m2.terraform_data.x"]
    repo.tf("init", "-input=false")
    repo.converged()
    commit(repo)

    # The bucket a data source reads is resized: the data source is re-read after it, and committed.
    repo.edit("buckets.tf", "size   = 10", "size   = 20")
    out = applied(repo, "-f", "buckets.tf")
    assert "write data.fakecloud_bucket.logs.*" in out
    data = [r for r in repo.trunk()["resources"] if r["mode"] == "data" and r["name"] == "logs"]
    assert data[0]["instances"][0]["attributes"]["size"] == 20
    assert repo.trunk()["outputs"]["logs_size"]["value"] == 20
    repo.converged()
