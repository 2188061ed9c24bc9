"""Database auth mode: tenants, tokens, the control API, and isolation between tenants and
environments on every lane."""

from __future__ import annotations

import base64
import logging
import string
from dataclasses import dataclass, replace

import psycopg
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from app.config import AuthMode
from tests.helpers import counted_state, lock_info

CONTROL = "control-secret-token"


@dataclass
class Token:
    secret: str
    id: str
    workspace_id: str
    environment_id: str

    def basic(self, username: str | None = None) -> dict[str, str]:
        raw = f"{self.workspace_id if username is None else username}:{self.secret}".encode()
        return {"Authorization": "Basic " + base64.b64encode(raw).decode()}

    @property
    def bearer(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secret}"}

    def path(self, name: str = "prod") -> str:
        return f"/v1/states/{self.workspace_id}/{self.environment_id}/{name}"


@pytest.fixture
def db_app(settings):  # type: ignore[no-untyped-def]
    from app.web import create_app

    # Isolation, not throttling, is under test here: the fuzz below fails many logins from one address.
    application = create_app(replace(settings, auth_mode=AuthMode.DATABASE, control_token=CONTROL,
                                     auth_failure_limit=1_000_000))
    yield application
    application.extensions["kilolock"].db.close()


@pytest.fixture
def dbc(db_app):  # type: ignore[no-untyped-def]
    return db_app.test_client()


CTL = {"Authorization": f"Bearer {CONTROL}"}


def make_token(client, tenant: str, environment: str = "production", name: str = "ci") -> Token:  # type: ignore[no-untyped-def]
    if client.get("/v1/api/tenants", headers=CTL).get_json()["tenants"].__repr__().find(f"'{tenant}'") < 0:
        created = client.post("/v1/api/tenants", json={"slug": tenant, "name": tenant.title()}, headers=CTL)
        assert created.status_code == 201
    response = client.post(f"/v1/api/tenants/{tenant}/tokens", json={"name": name, "environment": environment},
                           headers=CTL)
    assert response.status_code == 201, response.get_json()
    body = response.get_json()
    return Token(body["token_secret"], body["token"]["id"], body["workspace_id"], body["environment_id"])


def test_the_control_api_needs_the_control_token(dbc):
    assert dbc.get("/v1/api/tenants").status_code == 401
    assert dbc.get("/v1/api/tenants", headers={"Authorization": "Bearer nope"}).status_code == 403
    assert dbc.get("/v1/api/tenants", headers=CTL).status_code == 200


def test_a_created_token_works_at_once_and_stops_after_revoke(dbc, clean_db):
    token = make_token(dbc, "acme")
    assert token.secret.startswith("kl_")
    assert dbc.post(token.path(), data=counted_state(1, 1), headers=token.basic()).status_code == 200
    listed = dbc.get("/v1/api/tenants/acme/tokens", headers=CTL).get_json()["tokens"]
    assert [t["id"] for t in listed] == [token.id] and token.secret not in str(listed)
    with psycopg.connect(clean_db) as conn:
        stored = conn.execute("SELECT token_hash FROM api_tokens").fetchall()
    assert token.secret not in str(stored)
    assert dbc.post(f"/v1/api/tenants/acme/tokens/{token.id}/revoke", headers=CTL).status_code == 200
    assert dbc.get(token.path(), headers=token.basic()).status_code == 403
    assert dbc.get("/v1/states/prod", headers=token.bearer).status_code == 403


def test_the_token_answer_carries_the_backend_block_to_paste(dbc):
    body = dbc.post("/v1/api/tenants", json={"slug": "blk"}, headers=CTL)
    assert body.status_code == 201
    answer = dbc.post("/v1/api/tenants/blk/tokens", json={"name": "ci", "environment": "dev"}, headers=CTL).get_json()
    block = answer["backend_block"]
    assert f'username       = "{answer["workspace_id"]}"' in block
    assert f'/v1/states/{answer["workspace_id"]}/{answer["environment_id"]}/prod"' in block
    assert answer["token_secret"] not in block


def test_two_tenants_with_the_same_state_name_never_see_each_other(dbc):
    a, b = make_token(dbc, "alpha"), make_token(dbc, "beta")
    body_a = counted_state(1, 2, value="alpha")
    assert dbc.post(a.path(), data=body_a, headers=a.basic()).status_code == 200
    assert dbc.get(a.path(), headers=a.basic()).data == body_a
    assert dbc.get("/v1/states/prod", headers=a.bearer).data == body_a
    # b's own prod does not exist; a's path with b's token is refused on every verb
    assert dbc.get(b.path(), headers=b.basic()).status_code == 404
    for method, data in (("GET", None), ("POST", counted_state(2, 1)), ("DELETE", None), ("LOCK", lock_info("x")),
                         ("UNLOCK", b"")):
        for headers in (b.basic(), b.bearer, b.basic(a.workspace_id)):
            response = dbc.open(a.path(), method=method, data=data, headers=headers)
            assert response.status_code in (401, 403, 404), (method, headers, response.status_code)
    assert dbc.post(a.path().replace("/v1/states/", "/v1/state-unlock/"), headers=b.bearer).status_code == 403
    assert dbc.get(a.path(), headers=a.basic()).data == body_a


def test_basic_auth_needs_the_tokens_own_workspace_as_username(dbc):
    a, b = make_token(dbc, "alpha"), make_token(dbc, "beta")
    assert dbc.get(a.path(), headers=a.basic(b.workspace_id)).status_code == 403
    assert dbc.get(a.path(), headers=a.basic("")).status_code == 403
    assert dbc.get(a.path(), headers=a.basic("anything")).status_code == 403


def test_a_token_from_another_environment_cannot_reach_this_one(dbc):
    prod = make_token(dbc, "alpha", environment="production")
    dev = make_token(dbc, "alpha", environment="development", name="dev-ci")
    assert prod.workspace_id == dev.workspace_id and prod.environment_id != dev.environment_id
    assert dbc.post(prod.path(), data=counted_state(1, 1), headers=prod.basic()).status_code == 200
    assert dbc.get(prod.path(), headers=dev.basic()).status_code == 403
    assert dbc.get("/v1/states/prod", headers=dev.bearer).status_code == 404


def test_the_engine_lane_is_scoped_too(dbc):
    a, b = make_token(dbc, "alpha"), make_token(dbc, "beta")
    dbc.post(a.path(), data=counted_state(1, 3), headers=a.basic())
    run = dbc.post("/v1/engine/states/prod/runs", headers=a.bearer,
                   json={"actor": "alice", "reservations": [{"glob": "module.web.*", "mode": "write"}]})
    assert run.status_code == 201
    run_id = run.get_json()["run"]["id"]
    assert dbc.get("/v1/engine/states/prod/resources", headers=b.bearer).status_code == 404
    assert dbc.get("/v1/engine/states", headers=b.bearer).get_json()["states"] == []
    assert dbc.get("/v1/engine/runs", headers=b.bearer).get_json()["runs"] == []
    assert dbc.get("/v1/engine/reservations", headers=b.bearer).get_json()["reservations"] == []
    assert dbc.get(f"/v1/engine/runs/{run_id}", headers=b.bearer).status_code == 404
    assert dbc.post(f"/v1/engine/runs/{run_id}/abort", headers=b.bearer).status_code == 404
    # b can reserve the same globs on its own prod: nothing is shared
    other = dbc.post("/v1/engine/states/prod/runs", headers=b.bearer,
                     json={"actor": "bob", "reservations": [{"glob": "module.web.*", "mode": "write"}]})
    assert other.status_code == 201
    assert len(dbc.get("/v1/engine/states/prod/resources", headers=a.bearer).get_json()["resources"]) == 3


def test_token_lifecycle_and_failed_logins_are_audited_without_secrets(dbc, clean_db, caplog):
    caplog.set_level(logging.DEBUG)
    token = make_token(dbc, "alpha")
    dbc.post(token.path(), data=counted_state(1, 1), headers=token.basic())
    dbc.get(token.path(), headers={"Authorization": "Bearer kl_wrong-secret-value"})
    dbc.post(f"/v1/api/tenants/alpha/tokens/{token.id}/revoke", headers=CTL)
    with psycopg.connect(clean_db) as conn:
        rows = conn.execute("SELECT kind, tenant_id, actor, detail::text FROM events ORDER BY id").fetchall()
    kinds = [r[0] for r in rows]
    assert kinds[:1] == ["tenant_create"] and "token_create" in kinds and "auth_failed" in kinds
    assert kinds[-1] == "token_revoke"
    write = next(r for r in rows if r[0] == "state_write")
    assert write[1] is not None and write[2] == "ci" and '"token": "ci"' in write[3]
    everything = str(rows) + "\n".join(r.getMessage() for r in caplog.records)
    assert token.secret not in everything and "kl_wrong-secret-value" not in everything


def test_database_mode_refuses_to_start_without_a_control_token():
    from app.config import Settings
    from app.errors import ConfigError

    with pytest.raises(ConfigError, match="KL_CONTROL_TOKEN"):
        Settings.from_env({"KL_AUTH_MODE": "database"})


# --- fuzz ----------------------------------------------------------------------------------------

@pytest.fixture
def world(dbc):  # type: ignore[no-untyped-def]
    a, b = make_token(dbc, "alpha"), make_token(dbc, "beta")
    revoked = make_token(dbc, "alpha", name="old")
    dbc.post(f"/v1/api/tenants/alpha/tokens/{revoked.id}/revoke", headers=CTL)
    other_env = make_token(dbc, "alpha", environment="staging", name="stg")
    assert dbc.post(a.path(), data=counted_state(1, 1, value="TOP-SECRET-STATE"), headers=a.basic()).status_code == 200
    return {"a": a, "b": b, "revoked": revoked, "other_env": other_env}


_text = st.text(alphabet=string.ascii_letters + string.digits + "_-:/.%", max_size=30)


@hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_no_request_without_a_valid_token_for_the_scope_reaches_the_state(dbc, world, data):
    a = world["a"]
    holder = data.draw(st.sampled_from(["a", "b", "revoked", "other_env", "none", "junk"]))
    path = data.draw(st.sampled_from([
        a.path(), a.path() + "/", "/v1/states/prod", f"/v1/states/{a.workspace_id}/prod",
        f"/v1/states/{a.workspace_id}/{world['b'].environment_id}/prod", "/v1/engine/states/prod/resources",
        f"/v1/engine/states/{a.workspace_id}/{a.environment_id}/prod/history?address=terraform_data.item[0]",
    ]))
    scheme = data.draw(st.sampled_from(["basic", "bearer", "basic-user"]))
    if holder in ("none",):
        headers: dict[str, str] = {}
    elif holder == "junk":
        junk = data.draw(_text)
        headers = {"Authorization": data.draw(st.sampled_from(["Bearer ", "Basic ", "Token ", ""])) + junk}
    else:
        token = world[holder]
        if scheme == "basic":
            headers = token.basic()
        elif scheme == "bearer":
            headers = token.bearer
        else:
            headers = token.basic(data.draw(st.sampled_from([a.workspace_id, "", data.draw(_text)])))
    method = data.draw(st.sampled_from(["GET", "LOCK", "DELETE"]))
    body = lock_info("fuzz") if method == "LOCK" else None
    response = dbc.open(path, method=method, data=body, headers=headers)
    legitimate = holder == "a" and (scheme != "basic-user" or headers == a.basic())
    names_a = a.workspace_id in path
    if names_a and not legitimate:
        assert response.status_code in (400, 401, 403, 404, 405), (holder, scheme, path, response.status_code)
    assert b"TOP-SECRET-STATE" not in response.data or legitimate
    assert world["a"].secret.encode() not in response.data
    if response.status_code == 200 and method == "LOCK":
        dbc.open(path, method="UNLOCK", data=b"", headers=headers)
    if legitimate and method == "DELETE" and response.status_code == 200:
        dbc.post(a.path(), data=counted_state(1, 1, value="TOP-SECRET-STATE"), headers=a.basic())
    # Whatever was asked, a's state is intact and unlocked.
    assert b"TOP-SECRET-STATE" in dbc.get(a.path(), headers=a.basic()).data
    assert dbc.open(a.path(), method="LOCK", data=lock_info("probe"), headers=a.basic()).status_code == 200
    dbc.open(a.path(), method="UNLOCK", data=lock_info("probe"), headers=a.basic())


def test_tokens_are_compared_by_hash_and_static_secrets_in_constant_time():
    import inspect

    from app.store import tenancy
    from app.web import auth

    source = inspect.getsource(auth)
    assert "hmac.compare_digest" in source and "== settings.auth_token" not in source
    assert "token_hash = %s" in inspect.getsource(tenancy)
