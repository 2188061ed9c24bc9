"""The GitHub Actions workflows in workflows/github/: every ``kl`` they call is a real command, and their
shell steps, run as GitHub would run them (``bash -eo pipefail``, the workflow's env, ``${{ … }}`` filled
in), plan a pull request and apply a push against a real server from a real checkout."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from runner.cli import build_parser
from tests.bot.botworld import FILES, REPO, World, git, world_factory  # noqa: F401

WORKFLOWS = Path(__file__).resolve().parents[2] / "workflows" / "github"
EXPRESSION = re.compile(r"\$\{\{\s*(.+?)\s*\}\}")


def workflows() -> dict[str, dict[str, Any]]:
    return {path.name: yaml.safe_load(path.read_text()) for path in sorted(WORKFLOWS.glob("*.yml"))}


def run_blocks(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [step for job in doc["jobs"].values() for step in job["steps"] if "run" in step]


def kl_invocations(script: str) -> list[list[str]]:
    """Every ``kl …`` command line of a shell script (continuation lines joined)."""
    found = []
    for line in script.replace("\\\n", " ").splitlines():
        for part in re.split(r"[|;&]+", line):
            words = shlex.split(EXPRESSION.sub("X", part), comments=True)
            if words and words[0] == "kl":
                found.append(words)
    return found


def real_commands() -> dict[str, set[str]]:
    """kl command → its option strings."""
    import argparse

    found: dict[str, set[str]] = {}
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[name] = {o for a in sub._actions for o in a.option_strings}
    return found


def test_there_are_workflows_for_plan_and_apply():
    names = workflows()
    assert set(names) == {"kilolock-plan.yml", "kilolock-apply.yml"}
    assert "pull_request" in names["kilolock-plan.yml"][True]  # YAML 1.1 reads the key `on` as True
    assert names["kilolock-apply.yml"][True]["push"]["branches"] == ["main"]


@pytest.mark.parametrize("name", sorted(workflows()))
def test_workflows_call_only_real_kl_commands_and_options(name: str):
    commands = real_commands()
    calls = [words for step in run_blocks(workflows()[name]) for words in kl_invocations(step["run"])]
    assert calls, f"{name} calls no kl command"
    for words in calls:
        assert words[1] in commands, f"{name}: kl {words[1]} is not a kl command"
        options = {w.split("=")[0] for w in words[2:] if w.startswith("-")}
        assert options <= commands[words[1]], f"{name}: unknown options {options - commands[words[1]]}"


def evaluate(text: str, context: dict[str, str]) -> str:
    def lookup(match: re.Match[str]) -> str:
        key = match.group(1)
        assert key in context, f"the test does not know the expression ${{{{ {key} }}}}"
        return context[key]

    return EXPRESSION.sub(lookup, text)


def run_workflow(w: World, name: str, checkout: Path, context: dict[str, str]) -> str:
    """Run the workflow's shell steps as GitHub's runner would; returns the step summary."""
    doc = workflows()[name]
    summary = checkout.parent / f"{name}.summary.md"
    runner_temp = checkout.parent / f"{name}.runner-temp"
    runner_temp.mkdir()
    env = {**w.tf_env, "HOME": str(w.tmp), "GITHUB_STEP_SUMMARY": str(summary), "RUNNER_TEMP": str(runner_temp),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.update({key: evaluate(str(value), context) for key, value in doc.get("env", {}).items()})
    for step in run_blocks(doc):
        if step.get("id") == "install-kilolock":
            continue  # kl is this checkout's, already on PATH
        cwd = checkout / evaluate(step.get("working-directory", "."), {**context, "env.KL_DIR": env["KL_DIR"]})
        proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c",
                               evaluate(step["run"], context)], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, f"{name} step {step.get('id')}: {proc.stdout}{proc.stderr}"
    return summary.read_text() if summary.exists() else ""


@pytest.mark.terraform
def test_the_workflows_plan_a_pull_request_and_apply_the_push_after_the_merge(world_factory, tmp_path):  # noqa: F811
    w = world_factory()
    secrets = {"secrets.KILOLOCK_TOKEN": ""}
    w.commit("db-v2", {"db.tf": FILES["db.tf"].replace("db-v1", "db-v2")}, "db v2")
    pr = tmp_path / "ci-pr"
    git(tmp_path, "clone", "-q", str(w.origin), str(pr))
    git(pr, "checkout", "-q", "db-v2")

    summary = run_workflow(w, "kilolock-plan.yml", pr, {**secrets, "github.base_ref": "main"})

    assert "File-scoped: db.tf" in summary and "update   terraform_data.db" in summary
    assert (tmp_path / "kilolock-plan.yml.runner-temp" / "kl-plan.igplan").is_file() and w.serial() == 1

    before = w.head("main")
    git(w.work, "merge", "-q", "--no-ff", "-m", "Merge db-v2", "db-v2")
    git(w.work, "push", "-q", "origin", "main")
    after = w.head("main")
    main = tmp_path / "ci-main"
    git(tmp_path, "clone", "-q", str(w.origin), str(main))

    summary = run_workflow(w, "kilolock-apply.yml", main, {
        **secrets, "github.event.before": before, "github.sha": after, "github.repository": REPO})

    assert "committed at serial 2" in summary
    assert w.trunk()["terraform_data.db"] == "prod-app-db-v2"
    [run] = w.runs()
    assert run["actor"] == f"github-actions:{REPO}@{after}"
