"""A first GET after commits (assembled from rows, spliced from cached bytes, spliced from the stored base of a
POSTed version) and a whole-state slice read stay within their memory bound on the server.

The server runs as its own gunicorn process (one worker, as deployed), so the RSS read from ``/proc`` is
the server's alone: its peak during the request (``VmHWM`` after a reset, else sampled every 5 ms) minus
its size just before. tracemalloc in-process would miss what psycopg, libpq and the allocator hold, which
is where a whole-state read used to go. The bound is the documented one: at most 1.5 times the state's
size. The size (about 20 MB) is one CI can afford; the benchmark measures the large ones.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import psycopg
import pytest
import requests

from bench.body_memory_bench import Sampler, Server, start_server, stop_server
from tests.app.test_lazy_state import commit_one
from tests.conftest import wait_for
from tests.helpers import counted_state

COUNT = 30_000
BOUND = 1.5


@pytest.fixture
def server(clean_db: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    """The server with no splice bases after a POST, so the first GET after commits assembles from all rows."""
    monkeypatch.setenv("KL_SPLICE_BASE_BYTES", "0")
    started = start_server(clean_db, max_large_bodies=2, large_body_bytes=1024 * 1024)
    yield started
    stop_server(started)


@pytest.fixture
def based_server(clean_db: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    """The server building a splice base after every large POST (the default, at this test's size)."""
    monkeypatch.setenv("KL_SPLICE_BASE_BYTES", str(1024 * 1024))
    started = start_server(clean_db, max_large_bodies=2, large_body_bytes=1024 * 1024)
    yield started
    stop_server(started)


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))


def _cached(url: str, serial: int) -> tuple[bytes, str]:
    """The version's cached bytes and digest, once the cache write that follows its first GET's body has
    committed (waiting on the version's row lock, which that write holds until then)."""
    with psycopg.connect(url) as conn:
        conn.execute("SELECT 1 FROM state_versions WHERE serial = %s FOR NO KEY UPDATE", (serial,))
        conn.rollback()
        row = conn.execute("SELECT raw_state, sha256 FROM state_versions WHERE serial = %s", (serial,)).fetchone()
    assert row is not None
    return row[0], row[1]


def test_a_first_get_and_a_slice_read_grow_the_server_by_less_than_the_bound(server: Server, clean_db: str) -> None:
    body = counted_state(1, COUNT)
    http = requests.Session()
    assert http.post(f"{server.url}/v1/states/big", data=body).status_code == 200
    # A GET of the stored bytes first: its database connection is retired (tests/app/test_retired_connection.py).
    assert http.get(f"{server.url}/v1/states/big").content == body
    serial = 1
    for i in range(3):
        serial = commit_one(http, server.url, i, f"new-{i}", serial)

    before = _rss(server.worker)
    with Sampler(server.worker) as sampler:
        got = http.get(f"{server.url}/v1/states/big")
        cached = _cached(clean_db, serial)  # the cache write follows the body: sampled until it is done
    assert got.status_code == 200 and got.content.startswith(b"{\n")
    growth = sampler.peak - before
    assert growth <= BOUND * len(got.content), (growth, len(got.content))
    assert cached is not None and bytes(cached[0]) == got.content
    assert cached[1] == hashlib.sha256(got.content).hexdigest()

    # The next version is spliced from these cached bytes: the process holds them while it writes.
    serial = commit_one(http, server.url, 7, "spliced", serial)
    before = _rss(server.worker)
    with Sampler(server.worker) as sampler:
        spliced = http.get(f"{server.url}/v1/states/big")
        stored = _cached(clean_db, serial)
    assert spliced.status_code == 200 and b'"spliced"' in spliced.content
    growth = sampler.peak - before
    assert growth <= BOUND * len(spliced.content), (growth, len(spliced.content))
    assert stored[1] == hashlib.sha256(spliced.content).hexdigest()

    before = _rss(server.worker)
    with Sampler(server.worker) as sampler:
        sliced = http.post(f"{server.url}/v1/engine/states/big/slice", json={"globs": ["*"]})
    assert sliced.status_code == 200 and sliced.content == spliced.content
    growth = sampler.peak - before
    assert growth <= BOUND * len(sliced.content), (growth, len(sliced.content))


def test_a_first_get_spliced_from_a_posted_versions_base_grows_the_server_by_less_than_the_bound(
        based_server: Server, clean_db: str) -> None:
    body = counted_state(1, COUNT)
    http = requests.Session()
    assert http.post(f"{based_server.url}/v1/states/big", data=body).status_code == 200
    wait_for(lambda: _has_base(clean_db, 1), "the POSTed version's splice base")
    serial = 1
    for i in range(3):
        serial = commit_one(http, based_server.url, i, f"new-{i}", serial)

    before = _rss(based_server.worker)
    with Sampler(based_server.worker) as sampler:
        got = http.get(f"{based_server.url}/v1/states/big")
        cached = _cached(clean_db, serial)
    assert got.status_code == 200 and b'"new-2"' in got.content
    growth = sampler.peak - before
    assert growth <= BOUND * len(got.content), (growth, len(got.content))
    assert cached[1] == hashlib.sha256(got.content).hexdigest()


def _has_base(url: str, serial: int) -> bool:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT 1 FROM state_version_bases b JOIN state_versions v ON v.id = b.version_id "
                            "WHERE v.serial = %s", (serial,)).fetchone() is not None
