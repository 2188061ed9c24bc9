"""The Terraform session stage: Terraform run over one private workspace — init, plan (or a refresh-only
plan) into the workspace's saved plan, show it as JSON, and apply it — with the environment Terraform runs in
and the shared provider plugin cache its inits fill. How the binary itself is found and run is
``runner.core.terraform``; what the workspace holds is ``runner.core.workbuild``.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable, Container, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app import atomic
from runner.core import childenv, workspace
from runner.core.errors import Failed
from runner.core.spec import PinKind, PinnedVar
from runner.core.terraform import TerraformBinary, TerraformError, run

PLAN_FILE = "kl.tfplan"


@dataclass(frozen=True, slots=True)
class TerraformContext:
    """How to run Terraform for one command."""

    binary: TerraformBinary
    env: Mapping[str, str]
    plugin_cache: Path
    echo: Callable[[str], None]
    stream: bool = True
    stop: threading.Event | None = None  # set: interrupt the running Terraform command (an abort)


def given_var_flags(var_args: Sequence[tuple[str, str]], declared: Container[str] | None = None) -> list[str]:
    """``-var`` and ``-var-file`` flags as given (a file's path made absolute: Terraform runs in the workspace).
    With ``declared``, a -var for a variable not in it is left out: nothing in the workspace reads it, and
    Terraform rejects -var for an undeclared variable."""
    flags: list[str] = []
    for kind, raw in var_args:
        if kind != "var":
            flags.append(f"-var-file={Path(raw).resolve()}")
        elif declared is None or raw.partition("=")[0].strip() in declared:
            flags.append(f"-var={raw}")
    return flags


def var_flags(variables: Sequence[PinnedVar], supplied: Mapping[str, str]) -> list[str]:
    """Terraform flags for pinned inputs; sensitive values come from ``supplied`` (name → value)."""
    flags: list[str] = []
    for var in variables:
        if var.kind == PinKind.VAR:
            value = var.value if var.value is not None else supplied.get(var.name)
            flags.append(f"-var={var.name}={value}")
        elif var.kind == PinKind.VAR_FILE:
            flags.append(f"-var-file={var.name}")
    return flags


def terraform(ctx: TerraformContext, ws: workspace.Workspace, args: Sequence[str], *, quiet: bool = False,
              ok: tuple[int, ...] = (0,)) -> str:
    """Run one Terraform command in the workspace, streaming its output unless quiet."""
    def forward(_: str, line: str) -> None:
        ctx.echo("  │ " + line.rstrip("\n"))

    env = terraform_env(ctx.env, ctx.plugin_cache)
    try:
        result = run(ctx.binary, ["-chdir=" + str(ws.path), *args], cwd=ws.path, env=env,
                     stream=None if quiet or not ctx.stream else forward, stop=ctx.stop)
        result.check(ok_codes=ok)
    except TerraformError as exc:
        raise Failed(f"terraform {args[0]} failed (exit {exc.exit_code}):\n{exc.stderr_tail}") from exc
    return result.stdout


def init(ctx: TerraformContext, ws: workspace.Workspace) -> None:
    cache = plugin_cache(ctx.env, ctx.plugin_cache)
    with plugin_cache_lock(cache, exclusive=may_install_providers(ws, cache)):
        terraform(ctx, ws, ["init", "-input=false", "-no-color"], quiet=True)


def plan_in_workspace(
    ctx: TerraformContext, ws: workspace.Workspace, flags: Sequence[str], targets: Sequence[str],
    *, refresh: bool = False,
) -> dict[str, Any]:
    """init, plan -out, show -json; returns the plan JSON. Plans do not refresh unless asked (kl plan
    --refresh): Kilolock plans against the trunk as recorded (see docs/parallel-apply.md, docs/drift.md)."""
    init(ctx, ws)
    terraform(ctx, ws, ["plan", "-input=false", "-lock=false", *([] if refresh else ["-refresh=false"]), "-no-color",
                        f"-out={PLAN_FILE}", *flags, *(f"-target={t}" for t in targets)], quiet=True)
    return show_plan(ctx, ws)


def refresh_plan(ctx: TerraformContext, ws: workspace.Workspace, targets: Sequence[str]) -> dict[str, Any]:
    """init, plan -refresh-only -out, show -json (quietly: Terraform prints drifted values)."""
    init(ctx, ws)
    terraform(ctx, ws, ["plan", "-refresh-only", "-input=false", "-lock=false", "-no-color", f"-out={PLAN_FILE}",
                        *(f"-target={t}" for t in targets)], quiet=True)
    return show_plan(ctx, ws)


def show_plan(ctx: TerraformContext, ws: workspace.Workspace) -> dict[str, Any]:
    """``terraform show -json`` of the workspace's saved plan, as a JSON object."""
    shown = terraform(ctx, ws, ["show", "-json", PLAN_FILE], quiet=True)
    try:
        doc = json.loads(shown)
    except ValueError as exc:
        raise Failed("terraform show -json did not print JSON") from exc
    if not isinstance(doc, dict):
        raise Failed("terraform show -json did not print a plan object")
    return doc


def read_state(ws: workspace.Workspace) -> bytes | None:
    """The state Terraform left in the workspace (None: it wrote none)."""
    return ws.state_file.read_bytes() if ws.state_file.exists() else None


def apply_plan(ctx: TerraformContext, ws: workspace.Workspace, *, quiet: bool = False) -> None:
    """``terraform apply`` of the workspace's saved plan."""
    terraform(ctx, ws, ["apply", "-input=false", "-lock=false", "-auto-approve", "-no-color", PLAN_FILE], quiet=quiet)


@contextmanager
def plugin_cache_lock(cache_dir: Path, *, exclusive: bool = True) -> Iterator[None]:
    """Serialise ``terraform init`` runs that may write the shared plugin cache: concurrent inits
    writing the same cache entries are a known source of corrupt or half-written providers. Inits
    that only read it share the lock, so parallel applies do not queue behind each other."""
    with atomic.locked(cache_dir / ".kilolock-init.lock", shared=not exclusive):
        yield


_RESOURCE_TYPE = re.compile(r'^\s*(?:resource|data|ephemeral)\s+"([A-Za-z0-9_-]+)"', re.M)
_LOCKED_PROVIDER = re.compile(r'provider\s+"([^"]+)"\s*\{[^}]*?version\s*=\s*"([^"]+)"', re.S)


def may_install_providers(ws: workspace.Workspace, cache_dir: Path) -> bool:
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
