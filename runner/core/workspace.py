"""Private Terraform working directories: the configuration copied, its backend replaced by a
local one, a state slice written as terraform.tfstate (the plugin cache and Terraform's environment are the
session's, ``runner.core.session``).

Terraform never talks to the Kilolock backend from here: a configured backend would receive the
apply's writes whatever ``-state`` says, so the backend is overridden instead.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from app import atomic

# Copied configuration never includes Terraform's own working data, local states or our artifacts.
_SKIP_DIRS = {".terraform", ".git", ".hg", ".kilolock"}  # .kilolock: ARTIFACT_DIR
_SKIP_SUFFIXES = (".tfstate", ".tfstate.backup", ".tfplan", ".igplan")
_SKIP_NAMES = {"kl-plan.json", ".terraform.tfstate.lock.info"}
# Files that decide what Terraform plans; their hash pins a kl-plan.json to the configuration.
_CONFIG_SUFFIXES = (".tf", ".tf.json", ".tfvars", ".tfvars.json", ".tftpl", ".tpl", ".hcl")

# Beside a configuration, kl keeps its own files (the default plan file of kl plan -f) in this directory.
ARTIFACT_DIR = ".kilolock"
_ARTIFACT_IGNORE = "# Kilolock's own files (plan files): never configuration, never committed\n*\n"

OVERRIDE_NAME = "kilolock_override.tf"
OVERRIDE = 'terraform {\n  backend "local" {}\n}\n'


def _copied(config_dir: Path) -> Iterator[Path]:
    for path in sorted(config_dir.rglob("*")):
        relative = path.relative_to(config_dir)
        if any(part in _SKIP_DIRS for part in relative.parts):
            continue
        if path.is_file() and not path.name.endswith(_SKIP_SUFFIXES) and path.name not in _SKIP_NAMES \
                and path.name != OVERRIDE_NAME:
            yield path


def artifact_dir(config_dir: Path) -> Path:
    """``config_dir/.kilolock``, created with a ``.gitignore`` that ignores everything in it, so git (and
    ``kl plan --changed-from``) never sees what kl keeps there; workspaces never copy it."""
    where = config_dir / ARTIFACT_DIR
    ignore = where / ".gitignore"
    if not ignore.is_file():
        atomic.write_text(ignore, _ARTIFACT_IGNORE, mode=0o644)
    return where


def copied_files(config_dir: Path) -> list[Path]:
    """The files a workspace copies from ``config_dir`` (no Terraform working data or states)."""
    return list(_copied(config_dir))


def config_hash(config_dir: Path) -> str:
    """SHA-256 over the configuration files (paths and contents) that shape a plan."""
    digest = hashlib.sha256()
    for path in _copied(config_dir):
        if path.name.endswith(_CONFIG_SUFFIXES):
            digest.update(str(path.relative_to(config_dir)).encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


AUTO_VAR_NAMES = ("terraform.tfvars", "terraform.tfvars.json")


def auto_var_files(config_dir: Path) -> list[Path]:
    """The variable-definitions files Terraform loads by itself, in its order: ``terraform.tfvars``,
    ``terraform.tfvars.json``, then ``*.auto.tfvars`` and ``*.auto.tfvars.json`` in lexical order of their names."""
    if not config_dir.is_dir():
        return []
    with os.scandir(config_dir) as entries:  # names only: no path object per file of a large directory
        present = {e.name: config_dir / e.name for e in entries
                   if (e.name in AUTO_VAR_NAMES or e.name.endswith((".auto.tfvars", ".auto.tfvars.json")))
                   and e.is_file()}
    fixed = [present[n] for n in AUTO_VAR_NAMES if n in present]
    auto = [present[n] for n in sorted(present) if n.endswith((".auto.tfvars", ".auto.tfvars.json"))]
    return fixed + auto


@dataclass(frozen=True, slots=True)
class Workspace:
    path: Path

    @property
    def state_file(self) -> Path:
        return self.path / "terraform.tfstate"


def build(config_dir: Path, dest: Path, state: bytes | None) -> Workspace:
    """Copy the configuration into ``dest`` (which must not exist), override its backend with a
    local one, and write ``state`` (the slice) as terraform.tfstate."""
    dest.mkdir(parents=True)
    for path in _copied(config_dir):
        target = dest / path.relative_to(config_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    (dest / OVERRIDE_NAME).write_text(OVERRIDE)
    built = Workspace(dest)
    if state is not None:
        built.state_file.write_bytes(state)
    return built


LOCK_FILE = ".terraform.lock.hcl"


def carry_lock_file(config_dir: Path, dest: Path) -> None:
    """Copy the configuration's dependency lock file, so the workspace installs the providers it pins."""
    lock = config_dir / LOCK_FILE
    if lock.is_file():
        shutil.copy2(lock, dest / LOCK_FILE)
