"""runner.core.terraform: which binary is chosen, and how a run is captured, timed out and interrupted.

Fake binaries are tiny shell scripts, so these tests check process handling without Terraform;
one test runs the real embedded kl-terraform through run().
"""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path

import pytest

from runner.core.terraform import (
    BinaryKind,
    TerraformBinary,
    TerraformError,
    TerraformNotFoundError,
    TerraformResult,
    resolve_binary,
    run,
)

KL_TERRAFORM = Path(sys.executable).with_name("kl-terraform")


def write_script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def script_binary(tmp_path: Path, body: str) -> TerraformBinary:
    return TerraformBinary(write_script(tmp_path / "bin" / "fake-terraform", body), BinaryKind.CONFIGURED)


def test_kl_terraform_bin_wins_over_terraform_on_path(tmp_path: Path) -> None:
    write_script(tmp_path / "path" / "terraform", "exit 0\n")
    configured = write_script(tmp_path / "opt" / "my-terraform", "exit 0\n")

    binary = resolve_binary({"PATH": str(tmp_path / "path"), "KL_TERRAFORM_BIN": str(configured)})

    assert binary == TerraformBinary(configured, BinaryKind.CONFIGURED)


def test_kl_terraform_bin_may_name_a_program_on_path(tmp_path: Path) -> None:
    found = write_script(tmp_path / "path" / "terraform-1.9", "exit 0\n")

    binary = resolve_binary({"PATH": str(tmp_path / "path"), "KL_TERRAFORM_BIN": "terraform-1.9"})

    assert binary == TerraformBinary(found, BinaryKind.CONFIGURED)


def test_terraform_on_path_wins_over_tofu_and_the_embedded_script(tmp_path: Path) -> None:
    terraform = write_script(tmp_path / "path" / "terraform", "exit 0\n")
    write_script(tmp_path / "path" / "tofu", "exit 0\n")

    assert resolve_binary({"PATH": str(tmp_path / "path")}) == TerraformBinary(terraform, BinaryKind.TERRAFORM)


def test_tofu_on_path_is_used_when_terraform_is_not(tmp_path: Path) -> None:
    tofu = write_script(tmp_path / "path" / "tofu", "exit 0\n")

    assert resolve_binary({"PATH": str(tmp_path / "path")}) == TerraformBinary(tofu, BinaryKind.TOFU)


def test_an_empty_path_falls_back_to_kl_terraform_next_to_the_interpreter() -> None:
    assert KL_TERRAFORM.exists(), f"{KL_TERRAFORM} is missing: install the project (pip install -e .)"

    assert resolve_binary({"PATH": ""}) == TerraformBinary(KL_TERRAFORM, BinaryKind.EMBEDDED)


def test_a_missing_kl_terraform_bin_raises_saying_what_to_set(tmp_path: Path) -> None:
    write_script(tmp_path / "path" / "terraform", "exit 0\n")
    missing = tmp_path / "nowhere" / "terraform"

    with pytest.raises(TerraformNotFoundError) as caught:
        resolve_binary({"PATH": str(tmp_path / "path"), "KL_TERRAFORM_BIN": str(missing)})

    message = str(caught.value)
    assert str(missing) in message
    assert "Set KL_TERRAFORM_BIN to the path of a terraform or tofu binary, or unset it" in message


def test_a_non_executable_kl_terraform_bin_raises(tmp_path: Path) -> None:
    plain = tmp_path / "terraform"
    plain.write_text("not a program")

    with pytest.raises(TerraformNotFoundError, match="KL_TERRAFORM_BIN"):
        resolve_binary({"PATH": "", "KL_TERRAFORM_BIN": str(plain)})


def test_run_captures_output_and_exit_code_and_marks_the_run_as_automation(tmp_path: Path) -> None:
    binary = script_binary(
        tmp_path,
        'echo "args: $*"\necho "automation=$TF_IN_AUTOMATION checkpoint=$CHECKPOINT_DISABLE kept=$KEPT"\n'
        'echo "bad thing" >&2\nexit 3\n',
    )
    streamed: list[tuple[str, str]] = []

    result = run(
        binary,
        ["plan", "-input=false"],
        cwd=tmp_path,
        env={"PATH": os.defpath, "KEPT": "yes"},
        stream=lambda channel, line: streamed.append((channel, line)),
    )

    assert result.exit_code == 3
    assert result.stdout == "args: plan -input=false\nautomation=1 checkpoint=1 kept=yes\n"
    assert result.stderr == "bad thing\n"
    assert result.timed_out is False
    assert sorted(streamed) == [
        ("stderr", "bad thing\n"),
        ("stdout", "args: plan -input=false\n"),
        ("stdout", "automation=1 checkpoint=1 kept=yes\n"),
    ]


def test_check_raises_terraform_error_with_the_command_exit_code_and_stderr_tail() -> None:
    stderr = "".join(f"line {n}\n" for n in range(100)) + "Error: boom\n"
    result = TerraformResult(("terraform", "apply"), exit_code=1, stdout="", stderr=stderr)

    with pytest.raises(TerraformError) as caught:
        result.check()

    error = caught.value
    assert (error.command, error.exit_code) == (("terraform", "apply"), 1)
    assert error.stderr_tail.endswith("Error: boom")
    assert "line 0\n" not in error.stderr_tail
    assert "terraform apply exited with code 1" in str(error)
    assert TerraformResult(("terraform", "plan"), 2, "", "").check(ok_codes=(0, 2)).exit_code == 2


def test_a_timeout_sends_sigint_and_waits_for_the_graceful_exit(tmp_path: Path) -> None:
    # Like Terraform: on SIGINT, finish up (write state), then exit non-zero.
    binary = script_binary(
        tmp_path,
        "trap 'echo \"interrupted; state written\"; kill $child; exit 7' INT\n"
        "echo started\nsleep 30 &\nchild=$!\nwait $child\n",
    )

    began = time.monotonic()
    result = run(binary, ["apply"], cwd=tmp_path, env={"PATH": os.defpath}, timeout=1, grace_period=20)
    elapsed = time.monotonic() - began

    assert result.timed_out is True
    assert result.exit_code == 7
    assert result.stdout == "started\ninterrupted; state written\n"
    assert elapsed < 10
    with pytest.raises(TerraformError, match="timed out"):
        result.check()


def test_a_timeout_kills_a_child_that_ignores_sigint_after_the_grace_period(tmp_path: Path) -> None:
    binary = script_binary(tmp_path, "trap '' INT\necho started\nsleep 30\n")

    began = time.monotonic()
    result = run(binary, ["apply"], cwd=tmp_path, env={"PATH": os.defpath}, timeout=0.5, grace_period=1)
    elapsed = time.monotonic() - began

    assert result.timed_out is True
    assert result.exit_code == -9
    assert result.stdout == "started\n"
    assert 1.5 <= elapsed < 10


@pytest.mark.terraform
def test_run_drives_the_embedded_kl_terraform(tmp_path: Path) -> None:
    binary = resolve_binary({"PATH": ""})
    home = tmp_path / "home"
    home.mkdir()

    result = run(binary, ["version"], cwd=tmp_path, env={"PATH": os.defpath, "HOME": str(home)}).check()

    assert result.stdout.startswith("Terraform v1.15")
    assert result.stderr == ""
