"""The parallel-apply demo runs as documented (with short sleeps) and passes its own assertions."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.terraform
@pytest.mark.slow
def test_the_parallel_apply_demo_passes(tmp_path):
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "DEMO_SLEEP": "3", "DEMO_PORT": str(_free_port()), "KL": str(bin_dir / "kl"),
           "TF": str(bin_dir / "kl-terraform"), "PYTHON": sys.executable, "TMPDIR": str(tmp_path)}
    result = subprocess.run(["bash", str(REPO / "examples" / "parallel-apply-demo" / "run.sh")], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "the two run windows overlapped" in result.stdout
    assert "terraform plan: no changes" in result.stdout
    assert "dave's kl apply exited 2" in result.stdout and "demo passed" in result.stdout
