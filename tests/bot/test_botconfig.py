""".kilolock.yml: read as is, validated into frozen dataclasses with every problem listed, projects
discovered when the file is absent, and changed paths mapped to projects by their trigger globs."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.bot.config import (
    DEFAULT_MERGE_WAIT,
    BotConfig,
    BotConfigError,
    Project,
    is_triggered,
    load,
    parse,
    projects_for,
)

BACKEND = 'terraform {\n  backend "http" {\n    address = "http://kilolock.internal:8080/v1/states/%s"\n  }\n}\n'
MODULE_CALL = 'module "net" {\n  source = "../../modules/net"\n}\n\nmodule "local" {\n  source = "./local"\n}\n'


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return tree(tmp_path, {
        "infra/prod/backend.tf": BACKEND % "prod",
        "infra/prod/main.tf": MODULE_CALL,
        "infra/prod/local/main.tf": 'resource "terraform_data" "x" {}\n',
        "infra/staging/backend.tf": BACKEND % "staging",
        "modules/net/main.tf": 'resource "terraform_data" "net" {}\n',
        "scratch/main.tf": 'resource "terraform_data" "no_backend" {}\n',
        "README.md": "# infra\n",
    })


def test_without_a_file_every_directory_with_an_http_backend_is_a_project(repo: Path):
    config = load(repo)

    assert config.source == "discovered" and config.apply_on_merge and not config.apply_on_push
    assert config.merge_wait == DEFAULT_MERGE_WAIT
    prod, staging = config.projects
    assert prod == Project(name="infra/prod", dir="infra/prod", state="prod", address="http://kilolock.internal:8080",
                           files=("infra/prod/**", "modules/net/**"), apply_on_merge=True)
    assert (staging.name, staging.state, staging.files) == ("infra/staging", "staging", ("infra/staging/**",))


def test_a_file_names_projects_overrides_defaults_and_reads_durations(repo: Path):
    (repo / ".kilolock.yml").write_text(
        "apply_on_merge: false\napply_on_push: true\nmerge_wait: 1h30m\nprojects:\n"
        "  - dir: infra/prod\n    name: prod\n    files: [infra/prod/*.tf, '!infra/prod/experimental.tf']\n"
        "    apply_on_merge: true\n"
        "  - dir: scratch/\n    state: scratch-state\n")

    config = load(repo)

    assert (config.apply_on_merge, config.apply_on_push, config.merge_wait) == (False, True, 5400)
    prod, scratch = config.projects
    assert (prod.name, prod.state, prod.apply_on_merge) == ("prod", "prod", True)
    assert prod.files == ("infra/prod/*.tf", "!infra/prod/experimental.tf")
    assert (scratch.name, scratch.dir, scratch.state, scratch.address) == ("scratch", "scratch", "scratch-state", None)
    assert scratch.apply_on_merge is False and config.source == ".kilolock.yml"
    assert config.project("prod") is prod and config.project("nope") is None


def test_every_problem_is_listed_at_once_with_what_to_change(repo: Path):
    (repo / ".kilolock.yml").write_text(
        "aply_on_merge: true\nmerge_wait: forever\nversion: 2\nprojects:\n"
        "  - dir: nowhere\n  - dir: ../outside\n  - name: x\n  - dir: scratch\n    files: ['!*.md']\n"
        "  - dir: infra/prod\n    name: same\n  - dir: infra/staging\n    name: same\n    apply_on_merge: sometimes\n")

    with pytest.raises(BotConfigError) as caught:
        load(repo)

    assert caught.value.problems == (
        "unknown key 'aply_on_merge' (known: apply_branch, apply_on_comment, apply_on_merge, apply_on_push, "
        "apply_requirements, drift, env, hold_expiry, merge_wait, owners, projects, untrusted_previews, version)",
        "version must be 1, got 2",
        "merge_wait must be a duration between 0 and 6h such as 600, 90s, 10m or 1h, got 'forever'",
        "projects[0]: dir 'nowhere' does not exist in this commit",
        "projects[1]: dir '../outside' must stay inside the repository",
        "projects[2]: dir is required: the Terraform root module's directory, relative to the repository root "
        "('.' for the root)",
        "projects[3]: files has only exclusions (!…): add a glob that includes something",
        "projects[3] (dir scratch): no state name: add state: NAME, or a backend \"http\" block whose address ends "
        "in /v1/states/NAME",
        "projects[5]: apply_on_merge must be true or false, got 'sometimes'",
        "project name 'same' is used 2 times: give each project a unique name",
    )
    assert str(caught.value).startswith(".kilolock.yml is invalid:\n  - unknown key")


@pytest.mark.parametrize("text, problem", [
    ("projects: [\n", "not valid YAML at line 2, column 1"),
    ("- a\n- b\n", "the top level must be a mapping"),
    ("projects: {}\n", "projects must be a non-empty list"),
])
def test_unreadable_files_say_where(text: str, problem: str):
    with pytest.raises(BotConfigError) as caught:
        from runner.bot.config import RawConfig, validate

        validate(RawConfig(".kilolock.yml", parse(text)), Path("/nonexistent"))
    assert caught.value.problems[0].startswith(problem)


def test_an_empty_file_means_the_defaults_with_discovered_projects(repo: Path):
    (repo / ".kilolock.yml").write_text("")
    config = load(repo)
    assert [p.name for p in config.projects] == ["infra/prod", "infra/staging"]


@pytest.mark.parametrize("globs, path, hit", [
    (["infra/prod/**"], "infra/prod/db.tf", True),
    (["infra/prod/**"], "infra/prod/sub/x.tf", True),
    (["infra/prod/**"], "infra/production/db.tf", False),
    (["infra/prod/*.tf"], "infra/prod/sub/x.tf", False),
    (["**/*.tf"], "db.tf", True),
    (["**/*.tf"], "a/b/db.tf", True),
    (["modules/"], "modules/net/main.tf", True),
    (["infra/**", "!**/*.md"], "infra/README.md", False),
    (["infra/**", "!**/*.md", "infra/README.md"], "infra/README.md", True),
    (["db.t?"], "db.tf", True),
])
def test_trigger_globs_follow_gitignore_rules(globs: list[str], path: str, hit: bool):
    assert is_triggered(globs, path) is hit


def test_changed_paths_map_to_the_projects_they_trigger():
    config = BotConfig(projects=(
        Project("prod", "infra/prod", "prod", None, ("infra/prod/**", "modules/net/**"), True),
        Project("staging", "infra/staging", "staging", None, ("infra/staging/**",), True),
    ))
    assert projects_for(config, ["modules/net/main.tf", "README.md", "infra/prod/db.tf"]) == {
        "prod": ("modules/net/main.tf", "infra/prod/db.tf")}
    assert projects_for(config, ["docs/x.md"]) == {}


def test_comment_applies_are_off_by_default_and_require_approval_and_mergeability(repo: Path):
    (repo / ".kilolock.yml").write_text("projects:\n  - dir: infra/prod\n")

    config = load(repo)

    assert config.apply_requirements == ("approved", "mergeable")
    assert [p.apply_on_comment for p in config.projects] == [False]


def test_apply_on_comment_is_set_at_the_top_and_per_project_and_requirements_may_be_empty(repo: Path):
    (repo / ".kilolock.yml").write_text(
        "apply_on_comment: true\napply_requirements: []\nprojects:\n  - dir: infra/prod\n"
        "  - dir: infra/staging\n    apply_on_comment: false\n")

    config = load(repo)

    assert config.apply_requirements == ()
    assert [(p.name, p.apply_on_comment) for p in config.projects] == [("infra/prod", True), ("infra/staging", False)]


def test_unknown_requirements_and_non_boolean_apply_on_comment_are_listed(repo: Path):
    (repo / ".kilolock.yml").write_text(
        "apply_on_comment: yes please\napply_requirements: [approved, green]\nprojects:\n  - dir: infra/prod\n"
        "    apply_on_comment: 1\n")

    with pytest.raises(BotConfigError) as caught:
        load(repo)

    assert caught.value.problems == (
        "apply_on_comment must be true or false, got 'yes please'",
        "apply_requirements: unknown requirement(s) 'green' (known: approved, last_push_approved, owners_approved, "
        "mergeable, undiverged)",
        "projects[0]: apply_on_comment must be true or false, got 1",
    )


def test_env_names_the_provider_variables_and_never_kilolocks_own(repo: Path):
    (repo / ".kilolock.yml").write_text(
        "env: [AWS_PROFILE, 'TF_VAR_*']\nhold_expiry: 7d\nprojects:\n"
        "  - dir: infra/prod\n    env: [GOOGLE_APPLICATION_CREDENTIALS, AWS_PROFILE]\n"
        "  - dir: scratch\n    state: scratch\n")

    config = load(repo)

    prod, scratch = config.projects
    assert prod.env == ("AWS_PROFILE", "TF_VAR_*", "GOOGLE_APPLICATION_CREDENTIALS")
    assert scratch.env == ("AWS_PROFILE", "TF_VAR_*") and config.hold_expiry == 7 * 86400

    (repo / ".kilolock.yml").write_text(
        "env: [KL_BOT_TOKEN, 'KL*', '*', TF_HTTP_PASSWORD, 'bad name']\nhold_expiry: 5m\n"
        "projects:\n  - dir: scratch\n    state: s\n    env: AWS_PROFILE\n")
    with pytest.raises(BotConfigError) as caught:
        load(repo)
    problems = caught.value.problems
    assert sum("names Kilolock's own settings" in p for p in problems) == 3
    assert any("'*' would pass the whole environment" in p for p in problems)
    assert any("'bad name' is not a variable name" in p for p in problems)
    assert any(p.startswith("hold_expiry must be a duration from 1h to 366d") for p in problems)
    assert any(p.startswith("projects[0]: env must be a list") for p in problems)


def test_a_pull_requests_project_takes_state_server_and_env_from_the_default_branch():
    from dataclasses import replace

    from runner.bot import flow
    from runner.bot.config import BotConfig, Project
    from runner.core.config import ClientConfigError

    trusted = BotConfig(projects=(Project("infra", "infra", "infra", "http://trusted:8080", ("infra/**",), True,
                                          env=("AWS_PROFILE",)),))
    head = Project("infra", "infra", "other-state", "http://127.0.0.1:9", ("infra/**",), True,
                   env=("AWS_PROFILE", "SECRET_*"))

    anchored = flow.anchored(head, trusted)

    assert (anchored.state, anchored.address, anchored.env) == ("infra", "http://trusted:8080", ("AWS_PROFILE",))
    assert anchored.files == head.files  # what triggers it is the change's own business
    for unknown in (replace(head, name="new"), replace(head, dir="elsewhere")):
        with pytest.raises(ClientConfigError, match="come from the default branch"):
            flow.anchored(unknown, trusted)
    with pytest.raises(ClientConfigError, match="default branch's .kilolock.yml is invalid"):
        flow.anchored(head, None)
