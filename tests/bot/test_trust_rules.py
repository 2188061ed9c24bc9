"""The pure parts of the trust rules: which repositories are served, which pull requests are trusted, and
what an untrusted preview's Terraform is left of the worker's environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.config import Settings
from app.domain.repositories import is_allowed, parse_patterns
from runner.bot import trust
from runner.bot.config import BotConfig
from runner.bot.flow import Workbench
from runner.bot.github import PullInfo


@pytest.mark.parametrize("patterns, repo, allowed", [
    (("acme/infra",), "acme/infra", True),
    (("acme/infra",), "Acme/Infra", True),
    (("acme/infra",), "acme/infra2", False),
    (("acme/*",), "acme/anything", True),
    (("acme/*",), "acme-corp/infra", False),
    (("*",), "anyone/anything", True),
    (("*",), "not a repository", False),
    ((), "acme/infra", False),
])
def test_repository_patterns_match_whole_names_ignoring_case(patterns, repo, allowed):
    assert is_allowed(parse_patterns(patterns), repo) is allowed


def test_a_pattern_that_is_not_owner_slash_name_is_refused():
    with pytest.raises(ValueError, match="'acme', '\\*/infra', 'a/b/c'"):
        parse_patterns(["acme", "*/infra", "a/b/c", "ok/fine"])


def pull(head_repo: str | None) -> PullInfo:
    return PullInfo(number=1, head_sha="a" * 40, head_ref="x", base_ref="main", base_sha="b" * 40, merged=False,
                    state="open", author="mallory", head_repo=head_repo)


@pytest.mark.parametrize("head_repo, reason", [
    ("mallory/infra", "its commits come from the fork mallory/infra, not from acme/infra"),
    (None, "its commits come from a fork that no longer exists, not from acme/infra"),
])
def test_a_fork_or_a_deleted_fork_is_untrusted_without_asking_github(head_repo, reason):
    # No GitHub client: a fork is decided from the pull request alone.
    found = trust.of_pull_request(None, "acme/infra", pull(head_repo))  # type: ignore[arg-type]
    assert found == trust.Trust(False, reason)


def test_untrusted_previews_are_enabled_by_the_server_or_the_default_branch_only():
    settings = Settings(github_untrusted_previews=("acme/*",))
    assert trust.previews_enabled(settings, "acme/infra", None)
    assert not trust.previews_enabled(Settings(), "acme/infra", None)
    assert trust.previews_enabled(Settings(), "acme/infra", BotConfig(projects=(), untrusted_previews=True))


def test_an_untrusted_bench_keeps_no_secret_of_the_worker(tmp_path: Path):
    env = {"PATH": "/usr/bin", "HOME": "/root", "KL_TERRAFORM_BIN": "/opt/kl-terraform", "KL_GITHUB_TOKEN": "ghp_x",
           "KL_BOT_TOKEN": "klbot_x", "KL_DATABASE_URL": "postgresql://u:p@db/kl", "AWS_SECRET_ACCESS_KEY": "s",
           "TF_VAR_password": "p", "TF_CLI_CONFIG_FILE": "/root/.terraformrc", "TF_TOKEN_app_terraform_io": "t"}
    workbench = Workbench(Settings(), env, tmp_path).without_credentials()
    assert workbench.env == {"PATH": "/usr/bin", "KL_TERRAFORM_BIN": "/opt/kl-terraform",
                         "HOME": str(tmp_path / "untrusted-home"), "TF_INPUT": "0", "TF_IN_AUTOMATION": "1",
                         "CHECKPOINT_DISABLE": "1"}
    assert (tmp_path / "untrusted-home").is_dir() and not any((tmp_path / "untrusted-home").iterdir())
