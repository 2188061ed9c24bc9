"""runner.core.terraform keeps Terraform supervised: a stop request interrupts it gracefully, and a ``kill -9`` of
the process that spawned it sends it SIGINT (Linux's parent-death signal), so it never applies on alone.

Fake binaries are shell scripts that behave like Terraform on SIGINT: write their state, then exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from runner.core.terraform import run
from tests.runner.test_terraform_binary import script_binary

# Waits for a signal it will get; a test that fails never hangs longer than this.
_GRACEFUL = (
    "trap 'echo interrupted > {out}; kill $child; exit 7' INT\n"
    "echo $$ > {pid}\nsleep 120 &\nchild=$!\nwait $child\necho finished > {out}\n"
)


def _wait_for(predicate, what: str, timeout: float = 60):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_stop_request_interrupts_the_command_gracefully(tmp_path: Path) -> None:
    out, pid = tmp_path / "out", tmp_path / "pid"
    binary = script_binary(tmp_path, _GRACEFUL.format(out=out, pid=pid))
    stop = threading.Event()
    watcher = threading.Thread(target=lambda: (_wait_for(pid.exists, "the child"), stop.set()), daemon=True)
    watcher.start()

    result = run(binary, ["apply"], cwd=tmp_path, env={"PATH": os.defpath}, stop=stop, grace_period=60)

    assert result.stopped is True and result.timed_out is False
    assert result.exit_code == 7
    assert out.read_text() == "interrupted\n"


def test_a_command_that_ends_before_a_stop_request_is_not_stopped(tmp_path: Path) -> None:
    binary = script_binary(tmp_path, "echo done\n")
    result = run(binary, ["plan"], cwd=tmp_path, env={"PATH": os.defpath}, stop=threading.Event())
    assert (result.stopped, result.exit_code, result.stdout) == (False, 0, "done\n")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_terraform_is_interrupted_when_the_process_that_runs_it_is_killed(tmp_path: Path) -> None:
    out, pid = tmp_path / "out", tmp_path / "pid"
    binary = script_binary(tmp_path, _GRACEFUL.format(out=out, pid=pid))
    # A parent of its own that runs the fake Terraform through run(), as kl does, and is then killed with -9.
    parent = subprocess.Popen([sys.executable, "-c", (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from runner.core.terraform import BinaryKind, TerraformBinary, run\n"
        f"binary = TerraformBinary(Path({str(binary.path)!r}), BinaryKind.CONFIGURED)\n"
        f"run(binary, ['apply'], cwd=Path({str(tmp_path)!r}), env={{'PATH': os.defpath}})\n")],
        cwd=Path(__file__).resolve().parents[2])
    child = 0
    try:
        _wait_for(lambda: pid.exists() and pid.read_text().strip() != "", "the child to start")
        child = int(pid.read_text())
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)

        _wait_for(out.exists, "the child to be interrupted")
        assert out.read_text() == "interrupted\n"
    finally:
        if parent.poll() is None:
            parent.kill()
        if child:
            try:
                os.killpg(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
