"""Private Terraform working directories: the configuration copied, its backend replaced by a
local one, a state slice written as terraform.tfstate, and a shared provider plugin cache.

Terraform never talks to the Kilolock backend from here: a configured backend would receive the
apply's writes whatever ``-state`` says, so the backend is overridden instead.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from app import atomic
from runner.core import childenv

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
    present = {p.name: p for p in config_dir.iterdir()
               if (p.name in AUTO_VAR_NAMES or p.name.endswith((".auto.tfvars", ".auto.tfvars.json"))) and p.is_file()}
    fixed = [present[n] for n in AUTO_VAR_NAMES if n in present]
    auto = [present[n] for n in sorted(present) if n.endswith((".auto.tfvars", ".auto.tfvars.json"))]
    return fixed + auto


def file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True, slots=True)
class Workspace:
    path: Path

    @property
    def state_file(self) -> Path:
        return self.path / "terraform.tfstate"

    def read_state(self) -> bytes | None:
        return self.state_file.read_bytes() if self.state_file.exists() else None


def build(config_dir: Path, dest: Path, state: bytes | None) -> Workspace:
    """Copy the configuration into ``dest`` (which must not exist), override its backend with a
    local one, and write ``state`` (the slice) as terraform.tfstate."""
    dest.mkdir(parents=True)
    for path in _copied(config_dir):
        target = dest / path.relative_to(config_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    (dest / OVERRIDE_NAME).write_text(OVERRIDE)
    if state is not None:
        (dest / "terraform.tfstate").write_bytes(state)
    return Workspace(dest)


@contextmanager
def plugin_cache_lock(cache_dir: Path, *, exclusive: bool = True) -> Iterator[None]:
    """Serialise ``terraform init`` runs that may write the shared plugin cache: concurrent inits
    writing the same cache entries are a known source of corrupt or half-written providers. Inits
    that only read it share the lock, so parallel applies do not queue behind each other."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / ".kilolock-init.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


_RESOURCE_TYPE = re.compile(r'^\s*(?:resource|data|ephemeral)\s+"([A-Za-z0-9_-]+)"', re.M)
_LOCKED_PROVIDER = re.compile(r'provider\s+"([^"]+)"\s*\{[^}]*?version\s*=\s*"([^"]+)"', re.S)


def may_install_providers(ws: Workspace, cache_dir: Path) -> bool:
    """Whether ``terraform init`` in ``ws`` may write to the plugin cache (conservative: True
    unless every provider is built in or already cached at the locked version)."""
    lock_file = ws.path / ".terraform.lock.hcl"
    if lock_file.exists():
        locked = _LOCKED_PROVIDER.findall(lock_file.read_text())
        return any(not (cache_dir / source / version).is_dir() for source, version in locked)
    for path in ws.path.rglob("*.tf"):
        text = path.read_text(errors="replace")
        if "required_providers" in text:
            return True
        if any(t.split("_", 1)[0] != "terraform" for t in _RESOURCE_TYPE.findall(text)):
            return True
    return False


LOCK_FILE = ".terraform.lock.hcl"
_CLI_CACHE_DIR = re.compile(r'^\s*plugin_cache_dir\s*=\s*"([^"]+)"', re.M)


def cli_config_file(env: Mapping[str, str]) -> Path | None:
    """The Terraform CLI configuration the user's own ``terraform`` would read (TF_CLI_CONFIG_FILE, else
    ~/.terraformrc), or None."""
    configured = env.get("TF_CLI_CONFIG_FILE")
    if configured:
        return Path(configured).expanduser().absolute()
    home = env.get("HOME")
    rc = Path(home) / ".terraformrc" if home else None
    return rc if rc is not None and rc.is_file() else None


def plugin_cache(env: Mapping[str, str], default: Path) -> Path:
    """The provider plugin cache workspaces share: the user's own (TF_PLUGIN_CACHE_DIR, else the CLI
    configuration's ``plugin_cache_dir``), else ``default`` (under KL_DATA_DIR)."""
    if env.get("TF_PLUGIN_CACHE_DIR"):
        return Path(env["TF_PLUGIN_CACHE_DIR"]).expanduser().absolute()
    rc = cli_config_file(env)
    try:
        text = rc.read_text(errors="replace") if rc is not None else ""
    except OSError:
        text = ""
    found = _CLI_CACHE_DIR.search(text)
    if found:
        return Path(found.group(1).replace("$HOME", env.get("HOME", "~"))).expanduser().absolute()
    return default


def carry_lock_file(config_dir: Path, dest: Path) -> None:
    """Copy the configuration's dependency lock file, so the workspace installs the providers it pins."""
    lock = config_dir / LOCK_FILE
    if lock.is_file():
        shutil.copy2(lock, dest / LOCK_FILE)


def terraform_env(base: Mapping[str, str], cache_dir: Path) -> dict[str, str]:
    """The environment of Terraform in a private workspace: ``base`` (already the worker's allowlist, or the
    user's own) without ``KL_*`` and ``TF_HTTP_*`` (``runner.core.childenv``), with the CLI configuration's
    path made absolute (Terraform runs inside the workspace), the shared plugin cache, and no TF_DATA_DIR
    (every workspace keeps its own .terraform, or parallel runs would overwrite each other's)."""
    env = childenv.for_person(base)
    env["TF_PLUGIN_CACHE_DIR"] = str(plugin_cache(base, cache_dir))
    rc = cli_config_file(base)
    if base.get("TF_CLI_CONFIG_FILE") and rc is not None:
        env["TF_CLI_CONFIG_FILE"] = str(rc)
    env.pop("TF_DATA_DIR", None)
    env["TF_IN_AUTOMATION"] = "1"
    env["TF_INPUT"] = "0"
    # A TF_CLI_CONFIG_FILE naming a missing file makes Terraform prefix every output with "Unable to open
    # CLI configuration file" and then run with no CLI configuration; an empty file gives that same
    # configuration without the warning burying the real error.
    configured = env.get("TF_CLI_CONFIG_FILE")
    if configured and not Path(configured).expanduser().is_file():
        env["TF_CLI_CONFIG_FILE"] = os.devnull
    return env
