"""A large whole-state POST keeps the server's memory bounded: the server's RSS grows by a small multiple of
the body.

The server is the real app in its own process (werkzeug, threaded), so its RSS is
read from ``/proc`` without the test's own allocations mixed in. Its peak is ``VmHWM`` after resetting it
(``/proc/PID/clear_refs``), with a 5 ms sampler of ``VmRSS`` beside it (``bench.body_memory_bench.Sampler``).

What the server must hold, and why the bound is 5x the body: the body itself (1x, read once), the rows parsed
from it instance by instance (each instance's canonical JSON, its content hash and its address strings, about
2x the indented text for these small instances), the open set it keeps for the next write (well under 1x)
and one COPY buffer. A second copy of the body, or of the rows, crosses the bound. The state is 40,000
instances (about 20 MB): large enough that fixed costs (imports, pools) are small beside it, small enough
for CI.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import requests

from bench.body_memory_bench import Sampler, _status
from bench.states import counted_state
from tests.conftest import wait_for

REPO = Path(__file__).resolve().parents[2]
INSTANCES = 40_000
BOUND = 5.0  # RSS growth during the POST, in bodies
_SERVE = """
import sys
from werkzeug.serving import make_server
from app.config import Settings
from app.web import create_app
server = make_server("127.0.0.1", 0, create_app(Settings(database_url=sys.argv[1], auto_migrate=False,
                                                         log_level="WARNING")), threaded=True)
print(server.server_port, flush=True)
server.serve_forever()
"""
@pytest.fixture
def server(clean_db: str, tmp_path: Path) -> Iterator[tuple[str, int]]:
    env = {**os.environ, "KL_AUTH_MODE": "open", "KL_DATA_DIR": str(tmp_path)}
    env.pop("KL_REDIS_URL", None)
    proc = subprocess.Popen([sys.executable, "-c", _SERVE, clean_db], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: requests.get(url + "/healthz", timeout=30).status_code == 200, "the server", timeout=180)
        yield url, proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def test_large_post_grows_the_server_by_a_few_bodies(server: tuple[str, int], clean_db: str) -> None:
    url, pid = server
    # Warm up every code path (imports, the pool, the COPY machinery) with a small state of the same shape.
    small = counted_state(1, 100)
    assert requests.post(f"{url}/v1/states/warm", data=small, timeout=60).status_code == 200
    body = counted_state(1, INSTANCES)
    before = _status(pid, "VmRSS")
    with Sampler(pid) as peak:
        response = requests.post(f"{url}/v1/states/big", data=body, timeout=300,
                                 headers={"Content-Type": "application/json"})
    assert response.status_code == 200, response.text
    growth = peak.peak - before
    assert growth < BOUND * len(body), (
        f"a {len(body) / 1e6:.1f} MB POST grew the server by {growth / 1e6:.1f} MB "
        f"({growth / len(body):.1f}x the body, bound {BOUND}x)")
    # The write really happened: every instance is a live row and the head is the body, byte for byte.
    with psycopg.connect(clean_db) as conn:
        row = conn.execute("SELECT count(*) FROM resources r JOIN states s ON s.id = r.state_id "
                           "WHERE s.name = 'big' AND r.delete_serial IS NULL").fetchone()
    assert row is not None and row[0] == INSTANCES
    got = requests.get(f"{url}/v1/states/big", timeout=120)
    assert hashlib.sha256(got.content).digest() == hashlib.sha256(body).digest()
