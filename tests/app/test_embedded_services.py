"""app.embedded: embedded Postgres and Redis start, answer, are reused, and stop.

Every server started here lives under a pytest temp dir and is stopped by its fixture's finalizer.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis

from app.embedded import (
    default_data_dir,
    start_embedded_postgres,
    start_embedded_redis,
    stop_embedded_postgres,
    stop_embedded_redis,
)

REPO = Path(__file__).resolve().parents[2]


def outside_pytest_root() -> Iterator[Path]:
    """A directory for an embedded Postgres outside pytest's per-user temporary root: as root, Postgres runs
    as its own user, and every pytest session that starts on the machine resets that root to 0700."""
    where = Path(tempfile.mkdtemp(prefix="kl-embedded-test-"))
    try:
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


@pytest.fixture(scope="module")
def data_dir() -> Iterator[Path]:
    yield from outside_pytest_root()


@pytest.fixture
def pg_dir() -> Iterator[Path]:
    yield from outside_pytest_root()


@pytest.fixture(scope="module")
def postgres_url(data_dir: Path) -> Iterator[str]:
    url = start_embedded_postgres(data_dir)
    yield url
    stop_embedded_postgres(data_dir)


@pytest.fixture(scope="module")
def redis_url(data_dir: Path) -> Iterator[str]:
    url = start_embedded_redis(data_dir)
    yield url
    stop_embedded_redis(data_dir)


def postmaster_started_at(url: str) -> str:
    """Identifies the server process: a restarted or different server has another start time."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT pg_postmaster_start_time()::text").fetchone()
    assert row is not None
    return str(row[0])


def redis_pid(url: str) -> int:
    with redis.Redis.from_url(url) as client:
        return int(client.info("server")["process_id"])


def in_child_process(code: str) -> str:
    """Run ``code`` in a fresh interpreter with warnings as errors; return its last stdout line."""
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", result.stderr
    return result.stdout.strip().splitlines()[-1]


def test_embedded_postgres_answers_select_1_in_the_kilolock_database(postgres_url: str) -> None:
    with psycopg.connect(postgres_url) as conn:
        row = conn.execute("SELECT 1, current_database()").fetchone()

    assert row == (1, "kilolock")


def test_embedded_redis_answers_ping(redis_url: str) -> None:
    with redis.Redis.from_url(redis_url) as client:
        assert client.ping() is True


# service → (how it starts, what identifies the running server, the fixture that started it)
SERVICES = {
    "postgres": (start_embedded_postgres, postmaster_started_at, "postgres_url"),
    "redis": (start_embedded_redis, redis_pid, "redis_url"),
}


@pytest.mark.parametrize("service", SERVICES)
def test_a_second_start_reuses_the_running_server(service: str, data_dir: Path, request: pytest.FixtureRequest) -> None:
    start, identity, fixture = SERVICES[service]
    running_url = request.getfixturevalue(fixture)
    running = identity(running_url)

    again = start(data_dir)

    assert again == running_url
    assert identity(again) == running


@pytest.mark.parametrize("service", SERVICES)
def test_another_process_reuses_the_running_server_without_warnings(service: str, data_dir: Path,
                                                                     request: pytest.FixtureRequest) -> None:
    start, identity, fixture = SERVICES[service]
    running_url = request.getfixturevalue(fixture)
    running = identity(running_url)

    url = in_child_process(
        f"from pathlib import Path\nfrom app.embedded import {start.__name__}\n"
        f"print({start.__name__}(Path({str(data_dir)!r})))"
    )

    assert url == running_url
    assert identity(url) == running


def test_starting_redis_logs_which_server_started_where(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kilolock.embedded")
    try:
        url = start_embedded_redis(tmp_path)
    finally:
        stopped = stop_embedded_redis(tmp_path)

    assert stopped is True
    assert [r.getMessage() for r in caplog.records if r.name == "kilolock.embedded"][0] == (
        f"started embedded Redis in {tmp_path / 'redis'} at {url}"
    )


def test_a_stopped_redis_no_longer_answers_and_a_second_stop_is_a_no_op(tmp_path: Path) -> None:
    url = start_embedded_redis(tmp_path)

    assert stop_embedded_redis(tmp_path) is True

    with redis.Redis.from_url(url, socket_connect_timeout=1) as client, pytest.raises(redis.ConnectionError):
        client.ping()
    assert stop_embedded_redis(tmp_path) is False
    assert stop_embedded_postgres(tmp_path) is False


def test_redis_listens_on_loopback_when_the_socket_path_would_be_too_long(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    try:
        url = start_embedded_redis(deep)
        with redis.Redis.from_url(url) as client:
            assert client.ping() is True
    finally:
        stop_embedded_redis(deep)

    assert url.startswith("redis://127.0.0.1:")


def test_postgres_starts_again_after_a_stop_in_the_same_process(pg_dir: Path) -> None:
    first = start_embedded_postgres(pg_dir)
    try:
        assert stop_embedded_postgres(pg_dir) is True
        assert stop_embedded_postgres(pg_dir) is False

        second = start_embedded_postgres(pg_dir)

        with psycopg.connect(second) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert second == first
    finally:
        stop_embedded_postgres(pg_dir)


def test_default_data_dir_is_the_per_user_kilolock_folder() -> None:
    assert default_data_dir().name == "kilolock"


def test_a_postgres_that_cannot_start_is_one_clear_error_naming_its_log(pg_dir: Path) -> None:
    from app.embedded import EmbeddedServiceError

    where = pg_dir / "broken"
    start_embedded_postgres(where)
    stop_embedded_postgres(where)
    with (where / "postgres" / "postgresql.conf").open("a") as conf:
        conf.write("\nshared_buffers = 'not a size'\n")
    with pytest.raises(EmbeddedServiceError) as raised:
        start_embedded_postgres(where)
    message = str(raised.value)
    assert "did not start after 3 attempts" in message
    assert str(where / "postgres" / "log") in message and "shared_buffers" in message
    assert "KL_DATABASE_URL" in message
