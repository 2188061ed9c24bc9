"""The Terraform session stage: Terraform run over one private workspace — init, plan (or a refresh-only
plan) into the workspace's saved plan, show it as JSON, and apply it. How the binary itself is found and
run is ``runner.core.terraform``; what the workspace holds is ``runner.core.workbuild``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.core import workspace
from runner.core.errors import Failed
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


def terraform(ctx: TerraformContext, ws: workspace.Workspace, args: Sequence[str], *, quiet: bool = False,
              ok: tuple[int, ...] = (0,)) -> str:
    """Run one Terraform command in the workspace, streaming its output unless quiet."""
    def forward(_: str, line: str) -> None:
        ctx.echo("  │ " + line.rstrip("\n"))

    env = workspace.terraform_env(ctx.env, ctx.plugin_cache)
    try:
        result = run(ctx.binary, ["-chdir=" + str(ws.path), *args], cwd=ws.path, env=env,
                     stream=None if quiet or not ctx.stream else forward, stop=ctx.stop)
        result.check(ok_codes=ok)
    except TerraformError as exc:
        raise Failed(f"terraform {args[0]} failed (exit {exc.exit_code}):\n{exc.stderr_tail}") from exc
    return result.stdout


def init(ctx: TerraformContext, ws: workspace.Workspace) -> None:
    cache = workspace.plugin_cache(ctx.env, ctx.plugin_cache)
    with workspace.plugin_cache_lock(cache, exclusive=workspace.may_install_providers(ws, cache)):
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


def apply_plan(ctx: TerraformContext, ws: workspace.Workspace, *, quiet: bool = False) -> None:
    """``terraform apply`` of the workspace's saved plan."""
    terraform(ctx, ws, ["apply", "-input=false", "-lock=false", "-auto-approve", "-no-color", PLAN_FILE], quiet=quiet)
