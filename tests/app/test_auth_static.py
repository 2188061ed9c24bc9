"""Static and open auth on the backend and engine lanes."""

from __future__ import annotations

import base64
import logging

import pytest

from app.config import AuthMode
from tests.helpers import counted_state

TOKEN = "s3cret-token-value"


@pytest.fixture
def static_client(settings):  # type: ignore[no-untyped-def]
    from dataclasses import replace

    from app.web import create_app

    application = create_app(replace(settings, auth_mode=AuthMode.STATIC, auth_token=TOKEN))
    yield application.test_client()
    application.extensions["kilolock"].db.close()


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


@pytest.mark.parametrize("path", ["/v1/states/s", "/v1/engine/states", "/v1/engine/states/s/resources"])
def test_static_mode_answers_401_without_credentials_and_403_with_wrong_ones(static_client, path):
    missing = static_client.get(path)
    assert missing.status_code == 401
    assert missing.headers["WWW-Authenticate"].startswith("Basic")
    assert static_client.get(path, headers=basic("any", "wrong")).status_code == 403
    assert static_client.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 403


def test_static_mode_accepts_the_token_as_basic_password_or_bearer(static_client):
    body = counted_state(1, 1)
    assert static_client.post("/v1/states/s", data=body, headers=basic("ci", TOKEN)).status_code == 200
    assert static_client.get("/v1/states/s", headers={"Authorization": f"Bearer {TOKEN}"}).data == body


def test_a_rejected_request_changes_nothing(static_client):
    assert static_client.post("/v1/states/s", data=counted_state(1, 1), headers=basic("x", "no")).status_code == 403
    assert static_client.get("/v1/states/s", headers=basic("x", TOKEN)).status_code == 404


def test_secrets_and_state_bodies_never_reach_logs_or_error_bodies(static_client, caplog):
    caplog.set_level(logging.DEBUG)
    secret_body = counted_state(1, 1, value="SUPER-SECRET-VALUE")
    wrong = static_client.post("/v1/states/s", data=secret_body, headers=basic("x", "WRONG-PASSWORD"))
    assert b"WRONG-PASSWORD" not in wrong.data and b"SUPER-SECRET" not in wrong.data
    static_client.post("/v1/states/s", data=secret_body, headers=basic("x", TOKEN))
    static_client.post("/v1/states/s", data=b"not json SUPER-SECRET", headers=basic("x", TOKEN))
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "SUPER-SECRET" not in logged and TOKEN not in logged and "WRONG-PASSWORD" not in logged


def test_open_mode_needs_no_credentials(client):
    assert client.post("/v1/states/o", data=counted_state(1, 1)).status_code == 200
