"""``changed_selection`` (``kl plan --changed-from`` and the bot) over a real git repository: it returns the root
module's files it chose from, so the plan reads the configuration once."""

from __future__ import annotations

import subprocess
from pathlib import Path

from runner.core.filescoped import changed_selection
from runner.core.pipeline import read_configuration

FILES = {
    "db.tf": 'resource "terraform_data" "db" {\n  input = "v1"\n}\n',
    "web.tf": 'resource "terraform_data" "web" {\n  input = "w1"\n}\n',
}


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=root, check=True,
                   capture_output=True)


def _repo(tmp_path: Path) -> Path:
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "trunk")
    (tmp_path / "db.tf").write_text(FILES["db.tf"].replace("v1", "v2"))
    return tmp_path


def test_the_selection_comes_with_the_files_it_was_chosen_from(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    changed = changed_selection(root, "HEAD")
    assert changed.selection.files == ("db.tf",)
    assert changed.selection.deleted["db.tf@HEAD"] == FILES["db.tf"]
    assert dict(changed.files) == read_configuration(root)


def test_files_already_read_are_used_instead_of_reading_again(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    texts = read_configuration(root)
    changed = changed_selection(root, "HEAD", files=texts)
    assert changed.files is texts
    assert changed.selection.files == ("db.tf",)
