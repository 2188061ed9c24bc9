"""Static checks run as part of the suite: ruff everywhere, mypy --strict on the pure core and the runner."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _tool(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def test_ruff_finds_nothing():
    result = subprocess.run([_tool("ruff"), "check", "--output-format", "concise", "analyzer", "app", "runner",
                             "tests", "bench"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-4000:]


def test_the_pure_core_and_the_runner_pass_mypy_strict():
    result = subprocess.run([_tool("mypy"), "--strict", "analyzer", "app/domain", "runner"], cwd=REPO,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-4000:]
