"""Failed-authentication throttling: per client address and per token, 429 with Retry-After, and an
audit trail that grows by at most a couple of rows per key and window, never one per failure."""

from __future__ import annotations

import base64
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from app.config import AuthMode, Settings
from app.domain.throttle import Counter, after_failure, client_address, parse_networks, retry_after
from tests.helpers import counted_state

TOKEN = "s" * 40
CONTROL = "c" * 40
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _basic(secret: str, username: str = "ci") -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{username}:{secret}".encode()).decode()}


def _audit(database_url: str) -> list[str]:
    with psycopg.connect(database_url) as conn:
        return [k for (k,) in conn.execute("SELECT kind FROM events WHERE kind LIKE 'auth_%' ORDER BY id")]


@pytest.fixture
def static_client(settings: Settings):  # type: ignore[no-untyped-def]
    from app.web import create_app

    application = create_app(replace(settings, auth_mode=AuthMode.STATIC, auth_token=TOKEN, auth_failure_limit=5,
                                     auth_failure_window=600, trusted_proxies=("10.0.0.0/8",)))
    yield application.test_client()
    application.extensions["kilolock"].db.close()


def test_wrong_tokens_are_throttled_per_address_with_retry_after(static_client, clean_db):
    peer = {"REMOTE_ADDR": "198.51.100.7"}
    statuses = [static_client.get("/v1/states/prod", headers=_basic(f"wrong-{i}"), environ_base=peer).status_code
                for i in range(200)]
    assert statuses[:4] == [403] * 4
    assert set(statuses[4:]) == {429}
    refused = static_client.get("/v1/states/prod", headers=_basic(TOKEN), environ_base=peer)
    assert refused.status_code == 429  # even the right token waits: guessing must not pay off
    assert 0 < int(refused.headers["Retry-After"]) <= 600
    assert "retry in" in refused.text
    # 200 failures, two audit rows: the window's first failure and the one that blocked the address
    assert _audit(clean_db) == ["auth_failed", "auth_throttled"]
    other = static_client.get("/v1/states/prod", headers=_basic(TOKEN), environ_base={"REMOTE_ADDR": "203.0.113.9"})
    assert other.status_code == 404  # another client is not affected


def test_forwarded_for_is_ignored_unless_the_peer_is_a_trusted_proxy(static_client, clean_db):
    for i in range(5):
        static_client.get("/v1/states/prod", headers={**_basic(f"bad-{i}"), "X-Forwarded-For": f"192.0.2.{i}"},
                          environ_base={"REMOTE_ADDR": "198.51.100.8"})
    # The untrusted peer could not spread its failures over invented addresses
    blocked = static_client.get("/v1/states/prod", headers={**_basic(TOKEN), "X-Forwarded-For": "192.0.2.99"},
                                environ_base={"REMOTE_ADDR": "198.51.100.8"})
    assert blocked.status_code == 429


def test_behind_a_trusted_proxy_each_forwarded_client_is_counted_alone(static_client, clean_db):
    proxy = {"REMOTE_ADDR": "10.1.2.3"}
    for i in range(6):
        static_client.get("/v1/states/prod", headers={**_basic(f"bad-{i}"), "X-Forwarded-For": "192.0.2.50"},
                          environ_base=proxy)
    attacker = static_client.get("/v1/states/prod", headers={**_basic(TOKEN), "X-Forwarded-For": "192.0.2.50"},
                                 environ_base=proxy)
    assert attacker.status_code == 429
    # A spoofed left-most entry does not escape the block: the proxy appended the real address
    spoofed = static_client.get("/v1/states/prod",
                                headers={**_basic(TOKEN), "X-Forwarded-For": "1.2.3.4, 192.0.2.50"},
                                environ_base=proxy)
    assert spoofed.status_code == 429
    colleague = static_client.get("/v1/states/prod", headers={**_basic(TOKEN), "X-Forwarded-For": "192.0.2.51"},
                                  environ_base=proxy)
    assert colleague.status_code == 404


def test_a_blocked_client_writes_nothing(static_client, clean_db):
    peer = {"REMOTE_ADDR": "198.51.100.10"}
    for i in range(5):
        static_client.get("/v1/states/prod", headers=_basic(f"x{i}"), environ_base=peer)
    response = static_client.post("/v1/states/prod", data=counted_state(1, 1), headers=_basic(TOKEN),
                                  environ_base=peer)
    assert response.status_code == 429
    with psycopg.connect(clean_db) as conn:
        assert conn.execute("SELECT count(*) FROM states").fetchone() == (0,)


def test_database_mode_throttles_a_token_named_by_a_refused_credential(settings, clean_db):
    from app.web import create_app

    application = create_app(replace(settings, auth_mode=AuthMode.DATABASE, control_token=CONTROL,
                                     auth_failure_limit=3, auth_failure_window=600))
    client = application.test_client()
    try:
        control = {"Authorization": f"Bearer {CONTROL}"}
        assert client.post("/v1/api/tenants", json={"slug": "acme", "name": "Acme"}, headers=control).status_code == 201
        made = client.post("/v1/api/tenants/acme/tokens", json={"name": "ci", "environment": "prod"},
                           headers=control).get_json()
        secret, workspace = made["token_secret"], made["workspace_id"]
        # Someone holding the secret tries it under other workspaces, from ever new addresses
        for i in range(3):
            response = client.get("/v1/states/prod", headers=_basic(secret, "ws_wrong"),
                                  environ_base={"REMOTE_ADDR": f"192.0.2.{i}"})
            assert response.status_code in (403, 429)
        blocked = client.get("/v1/states/prod", headers=_basic(secret, workspace),
                             environ_base={"REMOTE_ADDR": "192.0.2.200"})
        assert blocked.status_code == 429 and blocked.headers["Retry-After"]
        # The control API counts its own failures per address, too
        for i in range(3):
            client.get("/v1/api/tenants", headers={"Authorization": f"Bearer wrong-{i}"},
                       environ_base={"REMOTE_ADDR": "192.0.2.77"})
        refused = client.get("/v1/api/tenants", headers=control, environ_base={"REMOTE_ADDR": "192.0.2.77"})
        assert refused.status_code == 429
        assert refused.get_json()["code"] == "auth_throttled"
    finally:
        application.extensions["kilolock"].db.close()


# --- the pure rules ---------------------------------------------------------------------------------------

def test_a_window_counts_failures_and_blocks_at_the_limit():
    verdict = after_failure(None, NOW, limit=3, window=60)
    assert verdict.counter == Counter(NOW, 1) and verdict.audit and not verdict.blocked
    second = after_failure(verdict.counter, NOW + timedelta(seconds=10), limit=3, window=60)
    assert second.counter.failures == 2 and not second.audit and not second.blocked
    third = after_failure(second.counter, NOW + timedelta(seconds=20), limit=3, window=60)
    assert third.blocked and third.audit and third.retry_after == 40
    assert retry_after(third.counter, NOW + timedelta(seconds=59), limit=3, window=60) == 1
    assert retry_after(third.counter, NOW + timedelta(seconds=60), limit=3, window=60) is None


def test_a_new_window_audits_again_with_the_previous_count():
    old = Counter(NOW, 250)
    verdict = after_failure(old, NOW + timedelta(seconds=61), limit=3, window=60)
    assert verdict.counter == Counter(NOW + timedelta(seconds=61), 1)
    assert verdict.audit and verdict.previous_failures == 250 and not verdict.blocked


@pytest.mark.parametrize(("peer", "forwarded", "expected"), [
    ("198.51.100.1", "192.0.2.1", "198.51.100.1"),  # untrusted peer: the header is the client's claim
    ("10.0.0.5", "192.0.2.1", "192.0.2.1"),
    ("10.0.0.5", "1.1.1.1, 192.0.2.1", "192.0.2.1"),  # right-most untrusted entry
    ("10.0.0.5", "192.0.2.1, 10.0.0.9", "192.0.2.1"),  # skips trusted hops
    ("10.0.0.5", "not-an-ip, 10.0.0.9", "10.0.0.9"),
    ("10.0.0.5", None, "10.0.0.5"),
])
def test_client_address_trusts_only_configured_proxies(peer, forwarded, expected):
    assert client_address(peer, forwarded, parse_networks(["10.0.0.0/8"])) == expected


def test_trusted_proxies_are_validated_when_settings_are_read():
    from app.errors import ConfigError

    with pytest.raises(ConfigError, match="KL_TRUSTED_PROXIES"):
        Settings.from_env({"KL_TRUSTED_PROXIES": "10.0.0.0/8, nonsense"})
    assert Settings.from_env({"KL_TRUSTED_PROXIES": "10.0.0.0/8, ::1"}).trusted_proxies == ("10.0.0.0/8", "::1")
