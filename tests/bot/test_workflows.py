"""The GitHub Actions workflows in workflows/github/: every ``kl`` they call is a real command, and their
shell steps, run as GitHub would run them (``bash -eo pipefail``, the workflow's env, ``${{ … }}`` filled
in), install kl from a wheel of this checkout into a new virtualenv, plan a pull request and apply a push
against a real server from a real checkout; the install step refuses an unset or unpinned spec."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from runner.cli import build_parser
from tests.bot.botworld import FILES, REPO, World, git, world_factory  # noqa: F401

CHECKOUT = Path(__file__).resolve().parents[2]
WORKFLOWS = CHECKOUT / "workflows" / "github"
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
    top_level = {o for a in build_parser()._actions for o in a.option_strings}
    for words in calls:
        if words[1].startswith("-"):
            assert words[1:] and set(words[1:]) <= top_level, f"{name}: kl {' '.join(words[1:])} is not a kl option"
            continue
        assert words[1] in commands, f"{name}: kl {words[1]} is not a kl command"
        options = {w.split("=")[0] for w in words[2:] if w.startswith("-")}
        assert options <= commands[words[1]], f"{name}: unknown options {options - commands[words[1]]}"


def evaluate(text: str, context: dict[str, str]) -> str:
    def lookup(match: re.Match[str]) -> str:
        key = match.group(1)
        assert key in context, f"the test does not know the expression ${{{{ {key} }}}}"
        return context[key]

    return EXPRESSION.sub(lookup, text)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Kilolock's wheel, built offline from a copy of this checkout (setuptools is a test dependency)."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(CHECKOUT / name, source / name)
    for package in ("app", "analyzer", "runner"):
        shutil.copytree(CHECKOUT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                            "--disable-pip-version-check", "-q", "-w", str(root / "dist"), str(source)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    [found] = (root / "dist").glob("kilolock-*.whl")
    return found


def ci_python(where: Path) -> Path:
    """A new virtualenv, like the runner's setup-python: it has pip and nothing of Kilolock's."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, capture_output=True, timeout=300)
    return where / "bin"


def step_env(w: World, checkout: Path, name: str, bin_dir: Path) -> dict[str, str]:
    summary = checkout.parent / f"{name}.summary.md"
    runner_temp = checkout.parent / f"{name}.runner-temp"
    runner_temp.mkdir(exist_ok=True)
    # The runner fetches Kilolock's dependencies from PyPI; the suite has no network, so pip installs only the
    # wheel (no index, no dependencies) and the dependencies are this environment's, added after it (below).
    return {**w.tf_env, "HOME": str(w.tmp), "GITHUB_STEP_SUMMARY": str(summary), "RUNNER_TEMP": str(runner_temp),
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PIP_NO_INDEX": "1", "PIP_NO_DEPS": "1",
            "PIP_FIND_LINKS": "", "PIP_CONSTRAINT": ""}


def run_step(step: dict[str, Any], checkout: Path, env: dict[str, str],
             context: dict[str, str]) -> subprocess.CompletedProcess[str]:
    cwd = checkout / evaluate(step.get("working-directory", "."), {**context, "env.KL_DIR": env["KL_DIR"]})
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", evaluate(step["run"], context)],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def run_workflow(w: World, name: str, checkout: Path, context: dict[str, str], bin_dir: Path) -> str:
    """Run every shell step of the workflow as GitHub's runner would, the install step included, with the
    ``python`` of ``bin_dir``; returns the step summary."""
    doc = workflows()[name]
    env = step_env(w, checkout, name, bin_dir)
    env.update({key: evaluate(str(value), context) for key, value in doc.get("env", {}).items()})
    _borrow_dependencies(bin_dir)
    for step in run_blocks(doc):
        proc = run_step(step, checkout, env, context)
        assert proc.returncode == 0, f"{name} step {step.get('id')}: {proc.stdout}{proc.stderr}"
        if step.get("id") == "install-kilolock":  # the wheel's kl, in the new environment
            assert (bin_dir / "kl").is_file() and "kl 0." in proc.stdout
    summary = checkout.parent / f"{name}.summary.md"
    return summary.read_text() if summary.exists() else ""


def _borrow_dependencies(bin_dir: Path) -> None:
    """Put this environment's site-packages after the new one's: the wheel's kl comes first, its dependencies
    (which the runner would have downloaded) from here. A path line adds the directory without running its
    .pth files, so this checkout's editable install stays out (and pip never uninstalls outside its own
    environment)."""
    import site
    import sysconfig

    ask = "import sysconfig; print(sysconfig.get_path('purelib'))"
    target = Path(subprocess.run([str(bin_dir / "python"), "-c", ask], capture_output=True, text=True, check=True,
                                 timeout=60).stdout.strip())
    ours = [p for p in site.getsitepackages() if Path(p).is_dir()] or [sysconfig.get_path("purelib")]
    (target / "zz-suite-dependencies.pth").write_text("\n".join(ours) + "\n")


def test_the_install_step_refuses_an_unset_or_unpinned_spec(tmp_path):
    [step] = [s for s in run_blocks(workflows()["kilolock-plan.yml"]) if s.get("id") == "install-kilolock"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # A python that records being called: neither refusal may reach pip.
    (bin_dir / "python").write_text(f"#!/bin/sh\necho called >> {tmp_path}/calls\n")
    (bin_dir / "python").chmod(0o755)
    env = {"PATH": f"{bin_dir}{os.pathsep}/usr/bin:/bin", "KL_DIR": "."}
    for spec, said in (("", "set KILOLOCK_SPEC"),
                       ("git+https://github.com/acme/kilolock", "is not pinned"),
                       ("git+https://github.com/acme/kilolock.git", "is not pinned")):
        proc = run_step(step, tmp_path, {**env, "KILOLOCK_SPEC": spec}, {})
        assert proc.returncode == 1 and said in proc.stdout, (spec, proc.stdout, proc.stderr)
    assert not (tmp_path / "calls").exists()
    pinned = run_step(step, tmp_path, {**env, "KILOLOCK_SPEC": "git+https://github.com/acme/kilolock@v0.1.0"}, {})
    assert (tmp_path / "calls").read_text() == "called\n", pinned.stdout + pinned.stderr


@pytest.mark.terraform
def test_the_workflows_install_kl_from_a_wheel_plan_a_pull_request_and_apply_the_push(world_factory, wheel,  # noqa: F811
                                                                                       tmp_path):
    w = world_factory()
    secrets = {"secrets.KILOLOCK_TOKEN": "", "vars.KILOLOCK_SPEC": str(wheel)}
    w.commit("db-v2", {"db.tf": FILES["db.tf"].replace("db-v1", "db-v2")}, "db v2")
    pr = tmp_path / "ci-pr"
    git(tmp_path, "clone", "-q", str(w.origin), str(pr))
    git(pr, "checkout", "-q", "db-v2")

    bin_dir = ci_python(tmp_path / "ci-python")
    summary = run_workflow(w, "kilolock-plan.yml", pr, {**secrets, "github.base_ref": "main"}, bin_dir)

    assert "File-scoped: db.tf" in summary and "update   terraform_data.db" in summary
    assert (tmp_path / "kilolock-plan.yml.runner-temp" / "kl-plan.igplan").is_file() and w.serial() == 1

    before = w.head("main")
    git(w.work, "merge", "-q", "--no-ff", "-m", "Merge db-v2", "db-v2")
    git(w.work, "push", "-q", "origin", "main")
    after = w.head("main")
    main = tmp_path / "ci-main"
    git(tmp_path, "clone", "-q", str(w.origin), str(main))

    summary = run_workflow(w, "kilolock-apply.yml", main, {
        **secrets, "github.event.before": before, "github.sha": after, "github.repository": REPO}, bin_dir)

    assert "committed at serial 2" in summary
    assert w.trunk()["terraform_data.db"] == "prod-app-db-v2"
    [run] = w.runs()
    assert run["actor"] == f"github-actions:{REPO}@{after}"
