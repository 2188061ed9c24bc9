"""Fixtures for the GitHub bot: a real Redis on a database index of its own.

``redis_url`` is the machine's Redis (``KL_TEST_REDIS_URL``, default ``redis://127.0.0.1:6379``) on
one of the database indexes 8–15, claimed for the whole test session, so two sessions on one
machine (two engineers, or pytest-xdist workers) never flush each other's queues. The index is
flushed before and after each test. When the machine's Redis is unreachable the suite fails if
``KL_TEST_REQUIRE_SERVICES=1`` (CI) and otherwise starts the embedded Redis in a temp dir.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

DEFAULT_REDIS = "redis://127.0.0.1:6379"
REQUIRE = os.environ.get("KL_TEST_REQUIRE_SERVICES") == "1"
# Indexes 0–7 are left to people's own use of the machine's Redis.
_TEST_INDEXES = range(8, 16)
_CLAIM_TTL = 4 * 3600


def with_db(url: str, index: int) -> str:
    """``url`` pointed at database ``index`` (redis:// path or unix:// ``?db=``)."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        query = "&".join(p for p in parts.query.split("&") if p and not p.startswith("db="))
        # urlunsplit would drop the empty host and the "//" redis-py needs.
        return f"unix://{parts.path}?" + (f"{query}&db={index}" if query else f"db={index}")
    return urlunsplit(parts._replace(path=f"/{index}"))


def _server(tmp_factory: pytest.TempPathFactory) -> tuple[str, Path | None]:
    url = os.environ.get("KL_TEST_REDIS_URL", DEFAULT_REDIS)
    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
    try:
        client.ping()
        return url, None
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        if REQUIRE:
            pytest.fail(f"Redis required (KL_TEST_REQUIRE_SERVICES=1) but unreachable at {url}: {exc}")
    finally:
        client.close()
    from app.embedded import start_embedded_redis

    data_dir = tmp_factory.mktemp("embedded-redis")
    return start_embedded_redis(data_dir), data_dir


@pytest.fixture(scope="session")
def _redis_session_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server, embedded_dir = _server(tmp_path_factory)
    try:
        yield from _claimed_index(server)
    finally:
        if embedded_dir is not None:
            from app.embedded import stop_embedded_redis

            stop_embedded_redis(embedded_dir)


def _claimed_index(server: str) -> Iterator[str]:
    claim = f"kl-test:claim:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    # The claims live in index 0 of that server, one key per index, so concurrent sessions pick different ones.
    with redis.Redis.from_url(with_db(server, 0)) as admin:
        index = next((i for i in _TEST_INDEXES
                      if admin.set(f"kl-test:redis-index:{i}", claim, nx=True, ex=_CLAIM_TTL)), None)
        if index is None:
            pytest.fail(f"every test Redis index {_TEST_INDEXES.start}-{_TEST_INDEXES.stop - 1} is claimed "
                        "by another test session; wait for it or delete the kl-test:redis-index:* keys")
        try:
            yield with_db(server, index)
        finally:
            if admin.get(f"kl-test:redis-index:{index}") == claim.encode():
                admin.delete(f"kl-test:redis-index:{index}")


@pytest.fixture
def redis_url(_redis_session_url: str) -> Iterator[str]:
    """A Redis URL on this session's own database index, empty at the start and end of the test."""
    with redis.Redis.from_url(_redis_session_url) as client:
        client.flushdb()
        try:
            yield _redis_session_url
        finally:
            client.flushdb()


@pytest.fixture
def redis_conn(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


# --- the bot's app: a real Flask app with a webhook secret and the test Redis -------------------

_TRUNCATE_BOT = "TRUNCATE webhook_deliveries, pull_request_footprints, bot_jobs, pull_request_holds"


@pytest.fixture
def bot_db(db):  # type: ignore[no-untyped-def]
    """The session database (``db``) with the bot's tables emptied too."""
    with db.transaction() as conn:
        conn.execute(_TRUNCATE_BOT)
    return db


@pytest.fixture
def bot_settings(settings, redis_url: str, bot_db):  # type: ignore[no-untyped-def]
    """Settings with the webhook secret of ``bench.webhooks.SECRET``, the test Redis, and the repositories
    of GitHub's example payloads (``Codertocat/Hello-World``) and of the bot's world served."""
    from dataclasses import replace

    from bench.webhooks import SECRET

    return replace(settings, github_webhook_secret=SECRET, redis_url=redis_url,
                   github_repositories=("Codertocat/Hello-World", "octo-org/*"))


@pytest.fixture
def bot_app(bot_settings):  # type: ignore[no-untyped-def]
    from app.web import create_app

    application = create_app(bot_settings)
    yield application
    application.extensions["kilolock"].db.close()


@pytest.fixture
def bot_client(bot_app):  # type: ignore[no-untyped-def]
    return bot_app.test_client()
