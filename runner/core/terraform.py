"""Finding and running the Terraform binary: the only place Kilolock spawns Terraform.

Owns: choosing the binary (``KL_TERRAFORM_BIN``, else ``terraform`` or ``tofu`` on ``PATH``, else the
embedded ``kl-terraform``), the child's environment, its process group, output
capture, and interrupting it on timeout so an apply can still write its state.

Must not: interpret Terraform's output or know about workspaces, plans or state (``runner.core.workspace``,
``runner.core.plan`` and ``runner.core.apply`` do that), nor read the process environment: callers pass ``env`` in.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import IO, Literal

from runner.core import childenv

_log = logging.getLogger("kilolock.terraform")

# Terraform's own default for how long a provider may take to stop is minutes; 30 s is enough for
# the core to persist state after an interrupt while keeping a stuck run from hanging a worker.
DEFAULT_GRACE_PERIOD = 30.0

EMBEDDED_SCRIPT = "kl-terraform"

# Every child runs unattended: TF_IN_AUTOMATION trims "next steps" hints meant for humans and
# CHECKPOINT_DISABLE stops the version-check call home.
_AUTOMATION_ENV = {"TF_IN_AUTOMATION": "1", "CHECKPOINT_DISABLE": "1"}

_STDERR_TAIL_LINES = 20

OutputChannel = Literal["stdout", "stderr"]
LineCallback = Callable[[OutputChannel, str], None]


class BinaryKind(StrEnum):
    """Where the Terraform binary came from."""

    CONFIGURED = "configured"
    TERRAFORM = "terraform"
    TOFU = "tofu"
    EMBEDDED = "embedded"


@dataclass(frozen=True, slots=True)
class TerraformBinary:
    """An executable that speaks the Terraform CLI, and how it was found."""

    path: Path
    kind: BinaryKind


@dataclass(frozen=True, slots=True)
class TerraformResult:
    """One finished Terraform command. ``exit_code`` is negative when a signal ended it."""

    command: tuple[str, ...]
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    stopped: bool = False  # ended on request (``run(stop=...)``)

    def check(self, ok_codes: Container[int] = (0,)) -> TerraformResult:
        """Return self, or raise TerraformError when the run timed out or its exit code is not ok.

        ``plan -detailed-exitcode`` callers pass ``ok_codes=(0, 2)``.
        """
        if self.timed_out or self.exit_code not in ok_codes:
            raise TerraformError(self.command, self.exit_code, self.stderr, timed_out=self.timed_out)
        return self


class TerraformNotFoundError(Exception):
    """No usable Terraform binary; the message says which setting to change."""


class TerraformError(Exception):
    """A Terraform command failed; carries the command, its exit code and the end of its stderr."""

    def __init__(self, command: Sequence[str], exit_code: int, stderr: str, *, timed_out: bool = False):
        self.command = tuple(command)
        self.exit_code = exit_code
        self.stderr_tail = _tail(stderr)
        self.timed_out = timed_out
        how = "timed out and was interrupted" if timed_out else f"exited with code {exit_code}"
        message = f"{' '.join(self.command)} {how}"
        if self.stderr_tail:
            message += f":\n{self.stderr_tail}"
        super().__init__(message)


def resolve_binary(env: Mapping[str, str]) -> TerraformBinary:
    """Pick the Terraform binary: KL_TERRAFORM_BIN, else terraform or tofu on PATH, else kl-terraform.

    Raises TerraformNotFoundError when KL_TERRAFORM_BIN is set but not an executable file, or when
    nothing is found at all.
    """
    from runner.core.config import ClientSettings  # the client's settings table owns KL_TERRAFORM_BIN

    search_path = env.get("PATH", os.defpath)
    configured = ClientSettings.from_env(env).terraform_bin
    if configured:
        # shutil.which accepts both a bare name (searched on PATH) and a path (checked as is).
        found = shutil.which(configured, path=search_path)
        if found is None:
            raise TerraformNotFoundError(
                f"KL_TERRAFORM_BIN is set to {configured!r}, which is not an executable file. "
                "Set KL_TERRAFORM_BIN to the path of a terraform or tofu binary, or unset it to use "
                f"terraform or tofu from PATH or the embedded {EMBEDDED_SCRIPT}."
            )
        return TerraformBinary(Path(found).absolute(), BinaryKind.CONFIGURED)

    for kind in (BinaryKind.TERRAFORM, BinaryKind.TOFU):
        found = shutil.which(kind.value, path=search_path)
        if found is not None:
            return TerraformBinary(Path(found).absolute(), kind)

    embedded = _find_embedded_script(search_path)
    if embedded is None:
        raise TerraformNotFoundError(
            "No Terraform binary found: KL_TERRAFORM_BIN is unset, neither terraform nor tofu is on "
            f"PATH, and {EMBEDDED_SCRIPT} is not installed next to {sys.executable} or on PATH. "
            "Set KL_TERRAFORM_BIN to a terraform binary, or reinstall kilolock to get "
            f"{EMBEDDED_SCRIPT}."
        )
    return TerraformBinary(embedded, BinaryKind.EMBEDDED)


def run(
    binary: TerraformBinary,
    args: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout: float | None = None,
    stream: LineCallback | None = None,
    grace_period: float = DEFAULT_GRACE_PERIOD,
    stop: threading.Event | None = None,
) -> TerraformResult:
    """Run ``binary args`` in ``cwd`` and return its exit code and captured output.

    The child gets ``env`` (less any ``KL_*``/``TF_HTTP_*``) plus TF_IN_AUTOMATION=1 and
    CHECKPOINT_DISABLE=1, no stdin, and its own process group. ``stream`` is called with each output
    line as it arrives (from reader threads).
    After ``timeout`` seconds the group gets SIGINT, Terraform's graceful stop, and after a further
    ``grace_period`` SIGKILL; the result then has ``timed_out=True``. If the caller is interrupted
    while waiting (KeyboardInterrupt), the child is stopped the same way before the exception
    propagates; so it is when ``stop`` is set (an abort: the result then has ``stopped=True``). If this
    process dies without stopping it (``kill -9``), the kernel sends the child SIGINT (Linux's parent-death
    signal), so Terraform never runs on unsupervised. A non-zero exit code does not raise: call
    ``result.check()`` for that.
    """
    command = (str(binary.path), *args)
    # A new session keeps the terminal's Ctrl-C away from the child, so that stopping it is always
    # this function's decision, and lets one killpg reach Terraform, its providers and provisioners.
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env={**childenv.for_person(env), **_AUTOMATION_ENV},  # never a KL_* secret, whoever the caller
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        encoding="utf-8",
        errors="replace",
        start_new_session=True,
        preexec_fn=_die_with_parent(),
    )
    assert process.stdout is not None and process.stderr is not None
    stdout_lines: list[str] = []
    stderr_lines: list[str] = []
    readers = (
        _start_reader(process.stdout, "stdout", stdout_lines, stream),
        _start_reader(process.stderr, "stderr", stderr_lines, stream),
    )
    timed_out = stopped = False
    try:
        stopped = _wait(process, timeout, stop)
        if stopped:
            _log.warning("%s was asked to stop; interrupting", " ".join(command))
            _interrupt(process, grace_period)
    except subprocess.TimeoutExpired:
        timed_out = True
        _log.warning("%s timed out after %ss; interrupting", " ".join(command), timeout)
        _interrupt(process, grace_period)
    except BaseException:
        _interrupt(process, grace_period)
        raise
    finally:
        for reader in readers:
            reader.join()
    return TerraformResult(
        command=command,
        exit_code=process.returncode,
        stdout="".join(stdout_lines),
        stderr="".join(stderr_lines),
        timed_out=timed_out,
        stopped=stopped,
    )


# How often a run that may be stopped looks at its stop event.
_STOP_POLL = 0.5


def _wait(process: subprocess.Popen[str], timeout: float | None, stop: threading.Event | None) -> bool:
    """Wait for the child; True when ``stop`` was set first. Raises TimeoutExpired after ``timeout``."""
    if stop is None:
        process.wait(timeout=timeout)
        return False
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise subprocess.TimeoutExpired(process.args, timeout or 0)
        try:
            process.wait(timeout=_STOP_POLL if left is None else min(_STOP_POLL, left))
            return False
        except subprocess.TimeoutExpired:
            if stop.is_set():
                return True


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the kernel SIGINT the child when the thread that spawned it dies (Linux
    ``PR_SET_PDEATHSIG``): SIGINT is Terraform's graceful stop, so a ``kill -9`` of kl leaves Terraform
    writing its state and exiting rather than applying on alone. ``prctl`` is resolved here, before the
    fork, so the child runs no Python import between fork and exec. None where there is no prctl."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGINT), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(_EXIT_ORPHANED)

    return arm


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_EXIT_ORPHANED = 130  # as if interrupted: it never started


def _find_embedded_script(search_path: str) -> Path | None:
    # Next to the interpreter first: a virtualenv's bin/ is often not on PATH (cron, systemd, RQ).
    beside_python = Path(sys.executable).parent / EMBEDDED_SCRIPT
    if beside_python.is_file() and os.access(beside_python, os.X_OK):
        return beside_python
    found = shutil.which(EMBEDDED_SCRIPT, path=search_path)
    return Path(found).absolute() if found is not None else None


def _interrupt(process: subprocess.Popen[str], grace_period: float) -> None:
    """SIGINT the child's group, SIGKILL it if the child outlives ``grace_period``."""
    _signal_group(process, signal.SIGINT)
    try:
        process.wait(timeout=grace_period)
    except subprocess.TimeoutExpired:
        _log.warning("%s ignored SIGINT for %ss; killing it", process.args, grace_period)
        _signal_group(process, signal.SIGKILL)
        process.wait()
        return
    # Terraform has stopped and written what it could; anything left in its group is an orphan
    # (a provisioner's grandchild, say) that would otherwise hold our pipes open.
    _signal_group(process, signal.SIGKILL)


def _signal_group(process: subprocess.Popen[str], signum: signal.Signals) -> None:
    try:
        # start_new_session made the child a group leader, so its pid is the group id.
        os.killpg(process.pid, signum)
    except ProcessLookupError:
        pass


def _start_reader(
    pipe: IO[str], channel: OutputChannel, lines: list[str], stream: LineCallback | None
) -> threading.Thread:
    thread = threading.Thread(
        target=_read_lines, args=(pipe, channel, lines, stream), name=f"terraform-{channel}", daemon=True
    )
    thread.start()
    return thread


def _read_lines(pipe: IO[str], channel: OutputChannel, lines: list[str], stream: LineCallback | None) -> None:
    with pipe:
        for line in pipe:
            lines.append(line)
            if stream is None:
                continue
            try:
                stream(channel, line)
            except Exception:
                # A broken callback must not stop the draining, or a full pipe would block
                # Terraform mid-apply; the output is still captured in the result.
                _log.exception("stream callback failed; no more lines will be streamed")
                stream = None


def _tail(text: str) -> str:
    return "\n".join(text.rstrip().splitlines()[-_STDERR_TAIL_LINES:])
