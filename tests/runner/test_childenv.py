"""The environments of Kilolock's children, with real processes: the embedded Terraform and git get what
``runner.core.childenv`` allows and never a ``KL_*`` secret, whoever the caller."""

from __future__ import annotations

import os
import stat
import subprocess

import pytest

from runner.core import childenv, git, session
from runner.core.terraform import resolve_binary, run

WORKER = {
    "PATH": "/usr/bin:/bin", "HOME": "/home/kl", "LANG": "C.UTF-8", "LC_ALL": "C", "TMPDIR": "/tmp",
    "KL_BOT_TOKEN": "klbot_" + "b" * 30, "KL_DATABASE_URL": "postgresql://u:pw@db/kl", "TF_HTTP_PASSWORD": "tf-pw",
    "AWS_PROFILE": "prod", "AWS_REGION": "eu-west-1", "TF_VAR_region": "eu", "GITHUB_TOKEN": "ghp_" + "x" * 36,
    "TF_CLI_CONFIG_FILE": "/etc/terraformrc", "GIT_TERMINAL_PROMPT": "0", "SSH_AUTH_SOCK": "/run/agent",
}


def test_a_worker_passes_the_basics_the_plumbing_and_the_named_provider_variables_only():
    env = childenv.for_worker(WORKER, ("AWS_PROFILE", "TF_VAR_*", "KL_BOT_TOKEN"))

    assert sorted(env) == ["AWS_PROFILE", "HOME", "LANG", "LC_ALL", "PATH", "TF_CLI_CONFIG_FILE", "TF_VAR_region",
                           "TMPDIR"]


def test_a_person_keeps_their_environment_without_kilolocks_settings_and_git_gets_its_own():
    person = childenv.for_person(WORKER)
    assert "GITHUB_TOKEN" in person and "AWS_REGION" in person
    assert not [k for k in person if k.startswith(("KL_", "TF_HTTP_"))]
    assert sorted(childenv.for_git(WORKER)) == ["GIT_TERMINAL_PROMPT", "HOME", "LANG", "LC_ALL", "PATH",
                                                 "SSH_AUTH_SOCK", "TMPDIR"]


@pytest.mark.parametrize("name, problem", [
    ("KL_BOT_TOKEN", "Kilolock's own settings"), ("KL*", "Kilolock's own settings"),
    ("TF_HTTP_*", "Kilolock's own settings"), ("*", "whole environment"), ("A*", "whole environment"),
    ("AWS PROFILE", "not a variable name"), ("AWS_*", None), ("TF_VAR_db_password", None),
])
def test_passthrough_names_are_checked(name, problem):
    found = childenv.passthrough_problem(name)
    assert (found is None) if problem is None else (problem in (found or ""))


def test_the_embedded_terraform_never_sees_a_kl_secret_even_when_the_caller_hands_one_in(tmp_path):
    (tmp_path / "main.tf").write_text('output "home" {\n  value = "x"\n}\n')
    binary = resolve_binary({"PATH": os.environ["PATH"]})
    given = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "KL_BOT_TOKEN": "klbot_leak", "KEPT": "yes"}
    env = session.terraform_env(given, tmp_path / "cache")
    assert "KL_BOT_TOKEN" not in env and env["TF_PLUGIN_CACHE_DIR"]

    # run() itself drops KL_* from whatever it is given: a provisioner-free way to look is `terraform console`
    # reading the environment through a child of Terraform, so use a wrapper script as the "binary".
    script = tmp_path / "fake-terraform"
    script.write_text(f"#!/bin/sh\nenv > {tmp_path / 'seen.txt'}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    result = run(type(binary)(script, binary.kind), ["version"], cwd=tmp_path, env=given)
    assert result.exit_code == 0
    seen = (tmp_path / "seen.txt").read_text()
    assert "KEPT=yes" in seen and "KL_BOT_TOKEN" not in seen and "TF_IN_AUTOMATION=1" in seen


def test_git_run_through_gitpython_gets_the_git_allowlist(tmp_path, monkeypatch):
    real = subprocess.run(["sh", "-c", "command -v git"], capture_output=True, text=True, check=True).stdout.strip()
    wrapper_dir = tmp_path / "bin"
    wrapper_dir.mkdir()
    wrapper = wrapper_dir / "git"
    wrapper.write_text(f"#!/bin/sh\nenv >> {tmp_path / 'git-env.txt'}\nexec {real} \"$@\"\n")
    wrapper.chmod(0o755)
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run([real, "init", "-q", "-b", "main", str(repo)], check=True)
    (repo / "a.tf").write_text("# a\n")
    subprocess.run([real, "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@e", "add", "a.tf"], check=True)
    subprocess.run([real, "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "a"],
                   check=True)
    monkeypatch.setenv("PATH", f"{wrapper_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("KL_GITHUB_TOKEN", "ghp_" + "s" * 36)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret-value")
    monkeypatch.setenv("GIT_PYTHON_GIT_EXECUTABLE", str(wrapper))
    import git as gitpython

    gitpython.refresh(str(wrapper))
    try:
        assert git.commit_count(repo, git.resolve_commit(repo, "HEAD"), "HEAD") == 0
    finally:
        gitpython.refresh(real)
    seen = (tmp_path / "git-env.txt").read_text()
    assert "PATH=" in seen and "KL_GITHUB_TOKEN" not in seen and "aws-secret-value" not in seen


def test_the_redaction_rule_hides_tokens_secrets_and_terraforms_values():
    from app.domain.redaction import HIDDEN, Redactor

    text = ("│ Error: Invalid value for variable\n│     │ var.x_api_key is \"VALUE-1234567\"\n"
            "│     │ terraform_data.a.output is \"out-value\"\n│     │ var.y has a sensitive value\n"
            "main.tf is invalid\nghp_" + "a" * 36 + " github_pat_" + "b" * 30 + " klbot_abcdef123 kl_" + "c" * 40 +
            "\npostgresql://kl:db-pass@db/kl AKIAABCDEFGHIJKLMNOP\naws_secret_access_key = wJalrXUtnFEMI\n"
            "Authorization: Bearer abcdefghijklmnopq\n-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n"
            "the configured value: configured-secret-value")
    shown = Redactor.of(["configured-secret-value", "short"]).redact(text)

    for gone in ("VALUE-1234567", "out-value", "ghp_", "github_pat_", "klbot_", "kl_ccc", "db-pass", "AKIA",
                 "wJalr", "abcdefghijklmnopq", "MIIE", "configured-secret-value"):
        assert gone not in shown, gone
    assert "var.x_api_key is " + HIDDEN in shown and "var.y has a sensitive value" in shown
    assert "main.tf is invalid" in shown and "Error: Invalid value for variable" in shown


def test_one_escaping_rule_leaves_no_live_markdown_in_untrusted_text():
    from runner.bot.markdown import block, cell, code, prose

    hostile = "@octocat [x](https://evil.example) <img src=x> **b** | c www.evil.example `t`"
    line = prose(hostile)
    assert "@octocat" not in line and "](" not in line.replace("\\](", "") and "<img" not in line
    assert "https://" not in line
    assert "www.evil" not in line and "**" not in line and "\\| c" in line
    assert prose("a terraform_data.web[0] in db.tf") == "a terraform_data.web[0] in db.tf"
    assert code("a`b") == "``a`b``" and cell("a|b") == "`a\\|b`"
    assert block("x\n```\ny") == "````\nx\n```\ny\n````"
    assert "ghp_" not in code("ghp_" + "z" * 36)


def test_the_workers_log_records_pass_the_redaction_whoever_logs_them():
    import io
    import logging

    from app.domain.redaction import Redactor, redact_logs

    previous = logging.getLogRecordFactory()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("rq.worker.test-redaction")
    logger.addHandler(handler)
    try:
        redact_logs(Redactor.of(["worker-secret-value"]))
        redact_logs(Redactor.of(["ignored: installed once"]))
        logger.warning("job failed with %s and %s", "worker-secret-value", "ghs_" + "t" * 36)
        try:
            raise RuntimeError("boom: worker-secret-value")
        except RuntimeError:
            logger.exception("crashed")
    finally:
        logging.setLogRecordFactory(previous)
        logger.removeHandler(handler)
    written = stream.getvalue()
    assert "job failed with [redacted] and [redacted]" in written and "RuntimeError: boom: [redacted]" in written
    assert "worker-secret-value" not in written and "ghs_" not in written
