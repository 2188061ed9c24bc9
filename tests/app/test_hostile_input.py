"""Malformed and hostile requests, replayed: each answers 4xx in its lane's shape, writes no row, and
leaves nothing in the log but one escaped line per record without the request's content."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import psycopg
import pytest
import requests

from app.web.logs import JsonFormatter, TextFormatter
from tests.helpers import counted_state, lock_info

SECRET = "hunter2-sensitive-value"


def snapshot(database_url: str) -> tuple[object, ...]:
    """Every table a refused request must leave untouched."""
    with psycopg.connect(database_url) as conn:
        return tuple(
            conn.execute(query).fetchall()
            for query in (
                "SELECT id, name, lineage, current_serial, head_version_id, lock_id FROM states ORDER BY id",
                "SELECT id, serial, sha256 FROM state_versions ORDER BY id",
                "SELECT id, address, create_serial, delete_serial FROM resources ORDER BY id",
                "SELECT id, kind FROM events ORDER BY id",
                "SELECT id, status FROM apply_runs ORDER BY id",
                "SELECT id, glob FROM resource_reservations ORDER BY id",
                "SELECT id, slug FROM tenants ORDER BY id",
                "SELECT delivery_id FROM webhook_deliveries ORDER BY 1",
            )
        )


@pytest.fixture
def logged() -> Iterator[io.StringIO]:
    """Everything the process logs while the test runs, in both formats."""
    out = io.StringIO()
    handlers = []
    for formatter in (TextFormatter(), JsonFormatter()):
        handler = logging.StreamHandler(out)
        handler.setFormatter(formatter)
        handlers.append(handler)
    root = logging.getLogger()
    previous = root.level
    root.setLevel(logging.INFO)
    for handler in handlers:
        root.addHandler(handler)
    yield out
    for handler in handlers:
        root.removeHandler(handler)
    root.setLevel(previous)


def _with_value(value: str) -> bytes:
    doc = json.loads(counted_state(1, 2))
    doc["resources"][0]["instances"][1]["attributes"]["input"]["value"] = value
    return json.dumps(doc).encode()


def _assert_clean_log(logged: io.StringIO) -> None:
    text = logged.getvalue()
    assert SECRET not in text
    assert "Traceback" not in text, text
    for line in text.splitlines():
        # Every line is a record of its own: a text line starting with a timestamp, or a JSON object.
        assert line.startswith(("20", "{")), line


NUL_STATES = [
    pytest.param(_with_value(SECRET + "\u0000"), id="nul-in-value"),
    pytest.param(_with_value(SECRET + "\ud800"), id="lone-high-surrogate"),
    pytest.param(_with_value("\udc00" + SECRET), id="lone-low-surrogate"),
    pytest.param(counted_state(1, 1).replace(b'"v-0"', b'"\xed\xa0\x80' + SECRET.encode() + b'"'),
                 id="utf8-encoded-surrogate"),
    pytest.param(counted_state(1, 1).replace(b'"input"', b'"in\\u0000put"', 1), id="nul-in-key"),
]


@pytest.mark.parametrize("body", NUL_STATES)
def test_a_state_holding_nul_or_lone_surrogates_is_400_naming_the_field(client, clean_db, logged, body):
    before = snapshot(clean_db)
    response = client.post("/v1/states/prod", data=body, content_type="application/json")
    assert response.status_code == 400
    assert "$." in response.text or '$["' in response.text, response.text
    assert "NUL character or a lone UTF-16 surrogate" in response.text
    assert SECRET not in response.text
    assert snapshot(clean_db) == before
    _assert_clean_log(logged)


def test_valid_surrogate_pairs_and_escaped_backslashes_are_stored_byte_exact(client):
    doc = json.loads(counted_state(1, 2))
    doc["resources"][0]["instances"][0]["attributes"]["input"]["value"] = "emoji \U0001f600"
    doc["resources"][0]["instances"][1]["attributes"]["input"]["value"] = "literal \\u0000 text"
    body = json.dumps(doc, ensure_ascii=True).encode()  # writes \ud83d\ude00 and \\u0000
    assert client.post("/v1/states/pairs", data=body, content_type="application/json").status_code == 200
    assert client.get("/v1/states/pairs").data == body


@pytest.mark.parametrize("serial", [2**63, 2**64 + 5, 10**30])
def test_a_serial_beyond_64_bits_is_400(client, clean_db, serial):
    before = snapshot(clean_db)
    response = client.post("/v1/states/prod", data=counted_state(serial, 1), content_type="application/json")
    assert response.status_code == 400
    assert "64-bit" in response.text
    assert snapshot(clean_db) == before


def test_the_largest_64_bit_serial_is_accepted(client):
    assert client.post("/v1/states/big", data=counted_state(2**63 - 1, 1)).status_code == 200


LOCK_BODIES = [
    pytest.param(lock_info("a\u0000b"), id="nul-id"),
    pytest.param(lock_info("x").replace(b'"x"', b'"\\ud800"'), id="surrogate-id"),
    pytest.param(lock_info("x").replace(b'"alice@laptop"', b'"\\u0000"'), id="nul-who"),
    pytest.param(b'{"ID": ' + b"[" * 20_000 + b"]" * 20_000 + b"}", id="nested-20k"),
    pytest.param(b"[" * 100_000 + b"]" * 100_000, id="nested-100k"),
    pytest.param(b'{"ID": "x", "Info": ' + b"9" * 5000 + b"}", id="huge-integer"),
    pytest.param(b'{"ID": "x", "Info": NaN}', id="nan"),
]


@pytest.mark.parametrize("body", LOCK_BODIES)
def test_malformed_lock_bodies_are_4xx_and_lock_nothing(client, clean_db, logged, body):
    before = snapshot(clean_db)
    response = client.open("/v1/states/prod", method="LOCK", data=body)
    assert 400 <= response.status_code < 500, response.text
    assert response.mimetype == "text/plain"
    assert snapshot(clean_db) == before
    _assert_clean_log(logged)


@pytest.mark.parametrize("body", [b"a\x00b", b"id\r\nforged", "\u2028x".encode()])
def test_plain_text_unlock_ids_with_control_characters_are_400(client, clean_db, body):
    assert client.open("/v1/states/prod", method="LOCK", data=lock_info("l1")).status_code == 200
    before = snapshot(clean_db)
    response = client.open("/v1/states/prod", method="UNLOCK", data=body)
    assert response.status_code == 400
    assert snapshot(clean_db) == before


@pytest.mark.parametrize("query", ["ID=a%00b", "ID=x%0d%0aforged"])
def test_lock_ids_in_the_query_with_control_characters_are_400(client, clean_db, query):
    before = snapshot(clean_db)
    response = client.post(f"/v1/states/prod?{query}", data=counted_state(1, 1))
    assert response.status_code == 400
    assert snapshot(clean_db) == before


ENGINE_ATTACKS = [
    pytest.param("GET", "/v1/engine/runs?limit=abc", None, id="limit-abc"),
    pytest.param("GET", "/v1/engine/runs?limit=1e3", None, id="limit-float"),
    pytest.param("GET", "/v1/engine/runs?limit=99999999999999999999999", None, id="limit-huge"),
    pytest.param("GET", "/v1/engine/states/prod/resources?serial=99999999999999999999999", None, id="serial-huge"),
    pytest.param("GET", "/v1/engine/states/prod/events?limit=-1", None, id="events-negative"),
    pytest.param("GET", "/v1/engine/runs?state=a%00b", None, id="state-nul"),
    pytest.param("GET", "/v1/engine/states/prod/history?address=x" + "y" * 5000, None, id="address-5000"),
    pytest.param("POST", "/v1/engine/states/prod/runs",
                 {"actor": "a", "lease_seconds": 1e308, "reservations": [{"glob": "x.y", "mode": "write"}]},
                 id="lease-1e308"),
    pytest.param("POST", "/v1/engine/states/prod/runs",
                 {"actor": "a", "lease_seconds": -1e308, "reservations": [{"glob": "x.y", "mode": "write"}]},
                 id="lease-negative"),
    pytest.param("POST", "/v1/engine/states/prod/runs",
                 {"actor": "a\u0000", "reservations": [{"glob": "x.y", "mode": "write"}]}, id="actor-nul"),
    pytest.param("POST", "/v1/engine/states/prod/runs",
                 {"actor": "a", "base_serial": 2**70, "reservations": [{"glob": "x.y", "mode": "write"}]},
                 id="base-serial-2^70"),
    pytest.param("POST", "/v1/engine/states/prod/runs",
                 {"actor": "a", "info": {"k\u0000": 1}, "reservations": [{"glob": "x.y", "mode": "write"}]},
                 id="info-key-nul"),
    pytest.param("POST", "/v1/engine/states/prod/runs", b"[" * 100_000 + b"]" * 100_000, id="nested-100k"),
    pytest.param("POST", "/v1/engine/states/prod/runs", b'{"actor": "a", "wait_seconds": Infinity}', id="inf"),
    pytest.param("POST", "/v1/engine/states/prod/slice", b'{"globs": ["\\ud800"]}', id="slice-surrogate"),
    pytest.param("POST", "/v1/engine/states/prod/edges", b"{" * 50_000, id="edges-unterminated"),
]


@pytest.mark.parametrize(("method", "url", "body"), ENGINE_ATTACKS)
def test_engine_lane_attacks_are_400_with_the_json_envelope(client, clean_db, logged, method, url, body):
    assert client.post("/v1/states/prod", data=counted_state(1, 1)).status_code == 200
    before = snapshot(clean_db)
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    response = client.open(url, method=method, data=data, content_type="application/json")
    assert response.status_code == 400, response.text
    envelope = response.get_json()
    assert envelope["ok"] is False and envelope["status"] == 400 and envelope["code"]
    assert snapshot(clean_db) == before
    _assert_clean_log(logged)


def test_control_api_tenant_names_with_nul_are_400(live_server_factory, clean_db):
    server = live_server_factory(auth_mode=__import__("app.config").config.AuthMode.DATABASE,
                                 control_token="c" * 40, session_secret="s" * 40)
    before = snapshot(clean_db)
    response = requests.post(f"{server.url}/v1/api/tenants", json={"slug": "acme", "name": "Acme\u0000"},
                             headers={"Authorization": "Bearer " + "c" * 40}, timeout=30)
    assert response.status_code == 400
    assert response.json()["ok"] is False
    assert snapshot(clean_db) == before


@pytest.mark.parametrize("username", ["alice\u0000", "bob\r\nforged", "x" * 201])
def test_basic_usernames_that_would_become_bad_actors_are_401(client, clean_db, username):
    import base64

    before = snapshot(clean_db)
    creds = base64.b64encode(f"{username}:pw".encode()).decode()
    response = client.post("/v1/states/prod", data=counted_state(1, 1), headers={"Authorization": f"Basic {creds}"})
    assert response.status_code == 401
    assert snapshot(clean_db) == before


# --- routes exactly as documented -------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/v1/states//prod", "/v1/states/prod//", "/v1/states//", "/v1/states/prod%0a",
                                  "/v1/states/prod%0d%0aX-Forged:%201", "/v1/states/ws_a%2Fenv_b%2Fprod",
                                  "/v1/states/ws_a/env_b%2fprod", "/v1/state-unlock//prod"])
@pytest.mark.parametrize("method", ["GET", "POST", "LOCK"])
def test_malformed_state_paths_are_400_never_404_or_a_redirect(client, clean_db, logged, path, method):
    method = "POST" if path.startswith("/v1/state-unlock") else method
    before = snapshot(clean_db)
    response = client.open(path, method=method, data=counted_state(1, 1) if method == "POST" else lock_info("l"))
    assert response.status_code == 400, (path, response.status_code)
    assert "Location" not in response.headers
    assert snapshot(clean_db) == before
    _assert_clean_log(logged)


def test_a_forged_log_line_through_the_path_stays_one_escaped_line(client, logged):
    client.get("/v1/states/prod%0a2026-01-01 00:00:00,000 INFO kilolock.web request id=forged GET /x -> 200")
    client.get("/nowhere%0d%0a2026-01-01 INFO forged")
    text = logged.getvalue()
    assert "\\n2026-01-01" in text or "\\\\n2026-01-01" in text
    _assert_clean_log(logged)


def test_login_next_with_crlf_falls_back_to_the_dashboard(live_server_factory):
    server = live_server_factory(auth_mode=__import__("app.config").config.AuthMode.STATIC,
                                 auth_token="t" * 40)
    for query in ("next=/ui/%0d%0aSet-Cookie:%20x=1", "next=/ui/%E2%80%A8x"):
        response = requests.get(f"{server.url}/ui/login?{query}", timeout=30, allow_redirects=False)
        assert 400 <= response.status_code < 500 or response.status_code == 200
        assert "Set-Cookie: x" not in response.text


# --- body limits ------------------------------------------------------------------------------------------

def test_a_chunked_body_over_the_limit_is_413_and_stores_nothing(live_server_factory, clean_db):
    body = counted_state(1, 3)
    server = live_server_factory(max_body_bytes=len(body))
    padded = body + b" " * 10  # parses after truncation to the limit: must still be refused

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(padded), 100):
            yield padded[start:start + 100]

    before = snapshot(clean_db)
    response = requests.post(server.state_url("prod"), data=chunks(), timeout=30)
    assert response.status_code == 413
    assert snapshot(clean_db) == before
    exact = requests.post(server.state_url("prod"), data=iter([body[:50], body[50:]]), timeout=30)
    assert exact.status_code == 200
    assert requests.get(server.state_url("prod"), timeout=30).content == body


def test_a_declared_body_over_the_limit_is_413_for_every_lane(live_server_factory, clean_db):
    server = live_server_factory(max_body_bytes=1000)
    before = snapshot(clean_db)
    big = b'{"actor": "' + b"a" * 2000 + b'"}'
    assert requests.post(server.state_url("prod"), data=big, timeout=30).status_code == 413
    engine = requests.post(f"{server.url}/v1/engine/states/prod/runs", data=big, timeout=30,
                           headers={"Content-Type": "application/json"})
    assert engine.status_code == 413
    assert engine.json()["code"] == "payload_too_large"
    assert snapshot(clean_db) == before


# --- the webhook ------------------------------------------------------------------------------------------

def _signed(secret: str, body: bytes) -> str:
    import hashlib
    import hmac

    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


@pytest.mark.parametrize(("delivery", "body"), [
    pytest.param("d" * 5000, b'{"zen": "x"}', id="delivery-5000"),
    pytest.param("abc\u00e9", b'{"zen": "x"}', id="delivery-non-ascii"),
    pytest.param("ok-1", b"[" * 100_000 + b"]" * 100_000, id="nested-100k"),
    pytest.param("ok-2", b'{"zen": "\\u0000"}', id="nul"),
])
def test_signed_webhook_attacks_are_4xx(live_server_factory, clean_db, delivery, body):
    secret = "w" * 40
    server = live_server_factory(github_webhook_secret=secret, redis_url="redis://127.0.0.1:6379/15")
    headers = {"X-GitHub-Event": "ping", "X-GitHub-Delivery": delivery, "Content-Type": "application/json",
               "X-Hub-Signature-256": _signed(secret, body)}
    response = requests.post(f"{server.url}/webhooks/github", data=body, headers=headers, timeout=30)
    assert 400 <= response.status_code < 500, response.text
    assert response.json()["ok"] is False


# --- unexpected errors never log state content ------------------------------------------------------------

def test_a_database_error_quoting_row_data_is_logged_without_it(database_url, logged):
    log = logging.getLogger("kilolock.test")
    with psycopg.connect(database_url) as conn:
        try:
            conn.execute("SELECT %s::jsonb", (json.dumps({"password": SECRET + "\\u0000"}).replace("\\\\", "\\"),))
        except psycopg.Error:
            log.exception("unexpected")
        else:  # pragma: no cover - the statement must fail for the test to mean anything
            raise AssertionError("Postgres accepted a NUL in jsonb")
    text = logged.getvalue()
    assert "SQLSTATE" in text and "Traceback" in text
    assert SECRET not in text


def test_an_unexpected_error_is_logged_without_its_message(settings, logged):
    from app.web import create_app

    application = create_app(settings)

    @application.get("/v1/engine/boom")
    def boom() -> str:
        raise RuntimeError(f"instance JSON {{'password': '{SECRET}'}}")

    try:
        response = application.test_client().get("/v1/engine/boom")
    finally:
        application.extensions["kilolock"].db.close()
    assert response.status_code == 500
    assert response.get_json()["error"] == "internal error; see the server log"
    text = logged.getvalue()
    assert "RuntimeError (message withheld)" in text and "Traceback" in text
    assert SECRET not in text


def test_large_bodies_beyond_the_bound_are_503_with_retry_after_and_store_nothing(settings, clean_db):
    from dataclasses import replace

    from app.web import create_app
    from app.web.inputs import LARGE_BODIES

    application = create_app(replace(settings, large_body_bytes=1000, max_large_bodies=1))
    client = application.test_client()
    body = counted_state(1, 20)
    assert len(body) > 1000
    slots = application.extensions[LARGE_BODIES]._slots
    try:
        assert slots.acquire(blocking=False)  # another large body is being processed
        before = snapshot(clean_db)
        refused = client.post("/v1/states/prod", data=body, content_type="application/json")
        assert refused.status_code == 503
        assert refused.headers["Retry-After"] == "5"
        assert snapshot(clean_db) == before
        small = client.open("/v1/states/other", method="LOCK", data=lock_info("l1"))
        assert small.status_code == 200  # small bodies never wait for a slot
        slots.release()
        assert client.post("/v1/states/prod", data=body, content_type="application/json").status_code == 200
        assert client.post("/v1/states/prod2", data=body, content_type="application/json").status_code == 200
    finally:
        application.extensions["kilolock"].db.close()


def test_a_large_body_returns_its_memory_after_its_answer_is_sent(settings, clean_db, monkeypatch):
    """The collection and heap trim after a large body run once the response closes (the WSGI server has
    sent it), not before the client is answered; its slot is free by then, refused or not."""
    from dataclasses import replace

    from app.web import create_app, inputs
    from app.web.inputs import LARGE_BODIES

    returned: list[str] = []
    monkeypatch.setattr(inputs, "_return_memory", lambda: returned.append("returned"))
    application = create_app(replace(settings, large_body_bytes=1000, max_large_bodies=1))
    client = application.test_client()
    slots = application.extensions[LARGE_BODIES]._slots
    body = counted_state(1, 20)
    try:
        for serial, status in ((1, 200), (1, 409)):  # a write, then a refused one (the serial is not new)
            doc = json.loads(body)
            doc["serial"] = serial
            doc["resources"][0]["instances"][0]["attributes"]["input"]["value"] = f"s{status}"
            response = client.post("/v1/states/prod", data=json.dumps(doc), content_type="application/json",
                                   buffered=False)  # closed below, as a WSGI server closes it once sent
            assert response.status_code == status
            assert returned == []  # answered: the memory is returned when the response closes
            assert slots.acquire(blocking=False)  # the slot is free once the request ends
            slots.release()
            response.close()
            assert returned == ["returned"]
            returned.clear()
        small = client.open("/v1/states/other", method="LOCK", data=lock_info("l1"), buffered=False)
        assert small.status_code == 200
        small.close()
        assert returned == []  # a small body holds no slot and returns nothing
    finally:
        application.extensions["kilolock"].db.close()
