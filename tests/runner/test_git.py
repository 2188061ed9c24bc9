"""runner.core.git against real repositories created in temp dirs: entries, texts at a ref, merge bases and
the --changed-from scope, for the working tree and for two refs (the pull-request case)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from git import Repo

from analyzer.gitdiff import FULL, DeletedFile, DiffEntry
from runner.core.git import (
    GitError,
    NotARepositoryError,
    UnknownRefError,
    changed_entries,
    changed_from,
    merge_base,
    text_at,
)

DB = 'resource "terraform_data" "db" {\n  input = "postgres"\n}\n'
WEB = 'resource "terraform_data" "web" {\n  input = file("${path.module}/templates/index.html")\n}\n'
# Long enough that a one-line edit stays above git's 50 % rename similarity.
QUEUE = "".join(f'resource "terraform_data" "q{i}" {{\n  input = "queue-{i}"\n}}\n\n' for i in range(8))


class Sandbox:
    """A git repository in a temp dir with its own identity, so no global git config is needed."""

    def __init__(self, root: Path):
        self.root = root
        self.repo = Repo.init(root, initial_branch="main")
        with self.repo.config_writer() as config:
            config.set_value("user", "name", "Kilolock Test")
            config.set_value("user", "email", "test@kilolock.invalid")
            config.set_value("commit", "gpgsign", "false")

    def write(self, path: str, text: str) -> None:
        target = self.root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)

    def remove(self, path: str) -> None:
        (self.root / path).unlink()

    def git(self, *args: str) -> str:
        return self.repo.git.execute(["git", *args])

    def commit(self, message: str) -> str:
        self.git("add", "--all")
        self.git("commit", "--quiet", "--allow-empty", "-m", message)
        return self.repo.head.commit.hexsha


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[Sandbox]:
    box = Sandbox(tmp_path / "repo")
    box.write("main.tf", DB)
    box.write("web.tf", WEB)
    box.write("queue.tf", QUEUE)
    box.write("templates/index.html", "<h1>hello</h1>\n")
    box.write("modules/web/main.tf", 'variable "name" {}\n')
    box.write("terraform.tfvars", 'name = "a"\n')
    box.write(".terraform.lock.hcl", "# providers\n")
    box.write(".gitignore", ".terraform/\n*.tfstate\n")
    box.commit("base")
    yield box
    box.repo.close()


def scope(box: Sandbox, ref: str = "HEAD", **kwargs):
    return changed_from(box.root, Path("."), ref, module_sources={"web": "modules/web"},
                        file_readers={"templates/index.html": ("web.tf",)}, **kwargs)


# --- the working tree against a ref ------------------------------------------------------------------------


def test_an_edited_tf_file_is_a_file_to_plan(sandbox):
    sandbox.write("main.tf", DB.replace("postgres", "mysql"))
    result = scope(sandbox)
    assert result.files == ("main.tf",)
    assert (result.deleted, result.widen, result.failures, result.unrelated) == ((), (), (), ())


def test_staged_changes_count_as_well_as_unstaged_ones(sandbox):
    sandbox.write("main.tf", DB.replace("postgres", "mysql"))
    sandbox.git("add", "main.tf")
    sandbox.write("web.tf", WEB + "\n")
    assert scope(sandbox).files == ("main.tf", "web.tf")


def test_an_untracked_tf_file_is_a_file_to_plan(sandbox):
    sandbox.write("cache.tf", 'resource "terraform_data" "cache" {}\n')
    assert changed_entries(sandbox.root, "HEAD") == [DiffEntry("added", "cache.tf")]
    assert scope(sandbox).files == ("cache.tf",)


def test_a_committed_new_tf_file_is_a_file_to_plan(sandbox):
    base = sandbox.repo.head.commit.hexsha
    sandbox.write("cache.tf", 'resource "terraform_data" "cache" {}\n')
    sandbox.commit("add cache")
    assert scope(sandbox, base).files == ("cache.tf",)


def test_ignored_files_are_not_changes(sandbox):
    sandbox.write(".terraform/providers/x", "binary")
    sandbox.write("terraform.tfstate", "{}")
    assert changed_entries(sandbox.root, "HEAD") == []


def test_a_deleted_tf_file_is_kept_with_its_text_at_ref(sandbox):
    sandbox.remove("main.tf")
    result = scope(sandbox)
    assert result.deleted == (DeletedFile("main.tf", DB),)
    assert result.files == ()


def test_a_git_mv_rename_plans_the_new_path_and_deletes_nothing(sandbox):
    sandbox.git("mv", "main.tf", "database.tf")
    assert changed_entries(sandbox.root, "HEAD") == [DiffEntry("renamed", "database.tf", "main.tf", 100)]
    result = scope(sandbox)
    assert result.files == ("database.tf",)
    assert result.deleted == ()


def test_an_unstaged_move_is_followed_as_a_rename_too(sandbox):
    (sandbox.root / "main.tf").rename(sandbox.root / "database.tf")
    assert changed_entries(sandbox.root, "HEAD") == [DiffEntry("renamed", "database.tf", "main.tf", 100)]
    assert scope(sandbox).deleted == ()


def test_a_rename_with_an_edit_plans_the_new_path_and_keeps_the_old_text(sandbox):
    sandbox.git("mv", "queue.tf", "queues.tf")
    sandbox.write("queues.tf", QUEUE.replace("queue-7", "queue-seven"))
    [entry] = changed_entries(sandbox.root, "HEAD")
    assert (entry.change, entry.path, entry.old_path) == ("renamed", "queues.tf", "queue.tf")
    assert entry.similarity is not None and 50 <= entry.similarity < 100
    result = scope(sandbox)
    assert result.files == ("queues.tf",)
    assert result.deleted == (DeletedFile("queue.tf", QUEUE),)


def test_the_users_index_is_left_untouched(sandbox):
    sandbox.write("cache.tf", "# new\n")
    sandbox.remove("main.tf")
    index = Path(sandbox.repo.git_dir) / "index"
    before = (index.read_bytes(), sandbox.git("status", "--porcelain"))
    changed_entries(sandbox.root, "HEAD")
    assert (index.read_bytes(), sandbox.git("status", "--porcelain")) == before


def test_a_tfvars_change_widens_to_the_changed_variables(sandbox):
    sandbox.write("terraform.tfvars", 'name = "b"\n')
    result = scope(sandbox)
    assert [(w.path, w.effect) for w in result.widen] == [("terraform.tfvars", "variables:terraform.tfvars")]
    assert not result.needs_full_plan


def test_a_var_file_only_tfvars_change_widens_to_a_full_plan(sandbox):
    sandbox.write("prod.tfvars", 'name = "b"\n')
    result = scope(sandbox)
    assert [(w.path, w.effect) for w in result.widen] == [("prod.tfvars", FULL)]
    assert result.needs_full_plan and "kl plan without -f" in result.widen[0].reason


def test_a_change_inside_a_module_directory_widens_to_the_module(sandbox):
    sandbox.write("modules/web/main.tf", 'variable "name" {\n  default = "x"\n}\n')
    result = scope(sandbox)
    assert [(w.path, w.effect) for w in result.widen] == [("modules/web/main.tf", "module:web")]
    assert result.files == ()


def test_a_template_read_by_file_widens_to_its_readers(sandbox):
    sandbox.write("templates/index.html", "<h1>bye</h1>\n")
    result = scope(sandbox)
    assert [(w.path, w.effect) for w in result.widen] == [("templates/index.html", "files:web.tf")]
    assert result.files == ("web.tf",)


def test_the_dependency_lock_file_widens_to_a_full_plan(sandbox):
    sandbox.write(".terraform.lock.hcl", "# providers, upgraded\n")
    assert [(w.path, w.effect) for w in scope(sandbox).widen] == [(".terraform.lock.hcl", FULL)]


@pytest.mark.skipif(os.name == "nt", reason="symbolic links")
def test_a_file_turned_into_a_symbolic_link_is_a_failure(sandbox):
    sandbox.write("shared.tf", DB)
    sandbox.remove("main.tf")
    (sandbox.root / "main.tf").symlink_to("shared.tf")
    result = scope(sandbox)
    assert [f.split(":")[0] for f in result.failures] == ["main.tf"]
    assert "type changed" in result.failures[0]


# --- a configuration in a subdirectory -----------------------------------------------------------------------


@pytest.fixture
def monorepo(tmp_path: Path) -> Iterator[Sandbox]:
    box = Sandbox(tmp_path / "mono")
    box.write("README.md", "# infra\n")
    box.write("infra/prod/main.tf", DB)
    box.write("infra/prod/old.tf", WEB)
    box.write("infra/production/main.tf", DB)
    box.write("modules/web/main.tf", "# shared module\n")
    box.write("app/server.py", "print('hi')\n")
    box.commit("base")
    yield box
    box.repo.close()


def test_a_config_dir_in_a_subdirectory_scopes_paths_to_it_and_ignores_the_rest(monorepo):
    monorepo.write("README.md", "# infra, documented\n")
    monorepo.write("app/server.py", "print('bye')\n")
    monorepo.write("infra/production/main.tf", DB + "\n")
    monorepo.write("infra/prod/main.tf", DB.replace("postgres", "mysql"))
    monorepo.remove("infra/prod/old.tf")
    monorepo.write("modules/web/main.tf", "# shared module, changed\n")
    result = changed_from(monorepo.root, Path("infra/prod"), "HEAD", module_sources={"web": "../../modules/web"})
    assert result.config_dir == "infra/prod"
    assert result.files == ("main.tf",)
    assert result.deleted == (DeletedFile("old.tf", WEB),)
    assert [(w.path, w.effect) for w in result.widen] == [("modules/web/main.tf", "module:web")]
    assert result.unrelated == ("README.md", "app/server.py", "infra/production/main.tf")


def test_the_repository_is_found_from_the_config_dir_itself(monorepo):
    monorepo.write("infra/prod/main.tf", DB.replace("postgres", "mysql"))
    config = monorepo.root / "infra" / "prod"
    assert changed_from(config, Path("."), "HEAD").files == ("main.tf",)
    assert changed_from(config, config, "HEAD").config_dir == "infra/prod"


def test_a_config_dir_outside_the_repository_is_refused(monorepo, tmp_path):
    with pytest.raises(GitError, match="is not inside the repository"):
        changed_from(monorepo.root, tmp_path, "HEAD")


# --- two refs: the pull-request case ---------------------------------------------------------------------------


def test_against_mode_diffs_the_merge_base_with_the_head_of_a_branch(sandbox):
    fork = sandbox.repo.head.commit.hexsha
    sandbox.git("checkout", "--quiet", "-b", "feature")
    sandbox.write("cache.tf", 'resource "terraform_data" "cache" {}\n')
    sandbox.git("mv", "main.tf", "database.tf")
    head = sandbox.commit("feature work")
    sandbox.git("checkout", "--quiet", "main")
    sandbox.write("other.tf", "# merged to main after the fork\n")
    sandbox.commit("main moves on")
    sandbox.write("web.tf", "# an uncommitted edit that against mode must not see\n")

    base = merge_base(sandbox.root, "main", "feature")
    assert base == fork
    assert changed_entries(sandbox.root, base, against=head) == [
        DiffEntry("added", "cache.tf"), DiffEntry("renamed", "database.tf", "main.tf", 100)]
    result = scope(sandbox, base, against="feature")
    assert result.files == ("cache.tf", "database.tf")
    assert (result.deleted, result.widen, result.failures) == ((), (), ())


def test_against_mode_reads_deleted_texts_at_the_base(sandbox):
    base = sandbox.repo.head.commit.hexsha
    sandbox.remove("main.tf")
    sandbox.write("main.tf", "# rewritten later, then deleted\n")
    sandbox.commit("rewrite")
    sandbox.remove("main.tf")
    head = sandbox.commit("delete")
    assert scope(sandbox, base, against=head).deleted == (DeletedFile("main.tf", DB),)


def test_histories_without_a_common_ancestor_have_no_merge_base(sandbox):
    sandbox.git("checkout", "--quiet", "--orphan", "island")
    sandbox.commit("unrelated root")
    with pytest.raises(GitError, match="no common ancestor"):
        merge_base(sandbox.root, "main", "island")


# --- texts at a ref ----------------------------------------------------------------------------------------------


def test_text_at_reads_a_file_as_it_was_at_the_ref(sandbox):
    base = sandbox.repo.head.commit.hexsha
    sandbox.write("main.tf", "# changed\n")
    sandbox.commit("change")
    assert text_at(sandbox.root, base, "main.tf") == DB
    assert text_at(sandbox.root, "HEAD", "main.tf") == "# changed\n"


def test_text_at_refuses_a_missing_path_and_a_directory(sandbox):
    with pytest.raises(GitError, match="nope.tf does not exist at HEAD"):
        text_at(sandbox.root, "HEAD", "nope.tf")
    with pytest.raises(GitError, match="is not a file"):
        text_at(sandbox.root, "HEAD", "modules")


# --- errors -----------------------------------------------------------------------------------------------------------


def test_an_unknown_ref_says_how_to_fetch_it(sandbox, tmp_path):
    Repo.clone_from(sandbox.root, tmp_path / "clone").close()
    with pytest.raises(UnknownRefError) as caught:
        changed_from(tmp_path / "clone", Path("."), "origin/feature")
    assert caught.value.ref == "origin/feature"
    assert "git fetch origin feature" in str(caught.value)


def test_an_unknown_ref_without_a_remote_asks_to_check_the_spelling(sandbox):
    with pytest.raises(UnknownRefError, match="check the spelling"):
        changed_entries(sandbox.root, "mian")


def test_a_ref_that_looks_like_an_option_is_refused(sandbox):
    with pytest.raises(UnknownRefError, match="cannot be empty or start with '-'"):
        changed_entries(sandbox.root, "--output=/tmp/x")


def test_a_directory_outside_any_repository_is_not_a_repository(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(NotARepositoryError, match="is not inside a git repository") as caught:
        changed_entries(plain, "HEAD")
    assert caught.value.path == plain


def test_an_edit_with_the_same_size_and_mtime_as_the_commit_is_seen(sandbox):
    """git's stat cache says "clean" for a same-size edit whose mtime equals the index entry's (racy git, and
    a copied index loses the racy marker): the working tree is compared by content."""
    sandbox.write("db.tf", DB)
    sandbox.commit("db")
    path = sandbox.root / "db.tf"
    stat = path.stat()
    sandbox.git("update-index", "--refresh")
    path.write_text(DB.replace("postgres", "postgrez"))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    entries = changed_entries(sandbox.root, "HEAD")
    assert [(e.change, e.path) for e in entries] == [("modified", "db.tf")]
