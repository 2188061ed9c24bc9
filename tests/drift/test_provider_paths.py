"""The existing end-to-end paths with a provider that has real remote objects: installation in every
private workspace from the user's CLI configuration (a filesystem mirror), aliases, data sources, and
parallel applies whose workspaces install the provider at the same time."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.terraform


def test_a_sliced_apply_installs_the_provider_from_the_mirror_and_converges(cloud_repo):
    cloud_repo.edit("buckets.tf", "size   = 10", "size   = 20")
    planned = cloud_repo.kl("plan")
    assert planned.returncode == 0, planned.stdout + planned.stderr
    applied = cloud_repo.kl("apply", "kl-plan.json", "--actor", "alice")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "committed at serial" in applied.stdout
    assert cloud_repo.cloud.get("local", "bucket", "logs")["size"] == 20
    assert cloud_repo.instance("fakecloud_bucket.logs")["size"] == 20
    cloud_repo.converged()


def test_a_file_scoped_apply_of_an_aliased_resource_changes_only_that_region(cloud_repo):
    cloud_repo.edit("buckets.tf", "size     = 1", "size     = 3")
    applied = cloud_repo.kl("apply", "-f", "buckets.tf", "--confirm-scope", "--actor", "alice")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert cloud_repo.cloud.get("east", "bucket", "backup")["size"] == 3
    assert cloud_repo.cloud.get("local", "bucket", "backup") is None
    cloud_repo.converged()


def test_a_relative_cli_config_and_a_lock_file_are_honoured_in_private_workspaces(cloud_repo):
    # The user's TF_CLI_CONFIG_FILE relative to where kl runs, and the lock file terraform init wrote.
    assert (cloud_repo.dir / ".terraform.lock.hcl").is_file()
    rc = cloud_repo.env["TF_CLI_CONFIG_FILE"]
    (cloud_repo.dir / "cli.tfrc").write_text(open(rc).read())
    cloud_repo.edit("queues.tf", "delay  = 5", "delay  = 7")
    applied = cloud_repo.kl("apply", "-f", "queues.tf", "--confirm-scope", "--actor", "alice",
                            env={"TF_CLI_CONFIG_FILE": "cli.tfrc", "TF_DATA_DIR": str(cloud_repo.dir / "shared")})
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert cloud_repo.cloud.get("local", "queue", "jobs")["delay"] == 7
    assert not (cloud_repo.dir / "shared").exists()
    cloud_repo.converged()


def test_parallel_file_scoped_applies_install_the_provider_concurrently_and_both_commit(cloud_repo):
    cloud_repo.edit("archive.tf", "size     = 100", "size     = 101")
    cloud_repo.edit("queues.tf", "delay  = 5", "delay  = 6")
    # A cold plugin cache: both workspaces install the provider at the same moment.
    first = cloud_repo.kl_popen("apply", "-f", "archive.tf", "--confirm-scope", "--actor", "alice")
    second = cloud_repo.kl_popen("apply", "-f", "queues.tf", "--confirm-scope", "--actor", "bob")
    outs = [p.communicate(timeout=600) for p in (first, second)]
    assert first.returncode == 0 and second.returncode == 0, outs
    serials = sorted(int(o[0].split("committed at serial ")[1].split()[0]) for o in outs)
    assert serials[1] == serials[0] + 1
    assert cloud_repo.cloud.get("east", "bucket", "archive")["size"] == 101
    assert cloud_repo.cloud.get("local", "queue", "jobs")["delay"] == 6
    cloud_repo.converged()
