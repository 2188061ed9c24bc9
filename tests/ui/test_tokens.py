"""The dashboard's tokens pages: the control API's rule (database mode and KL_CONTROL_TOKEN), never for a token
with address scopes; listing, creating with scopes and replacing them through the same store functions, each
change audited, a bad scope a 400 page that changes no row."""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from app.config import AuthMode
from tests.ui.conftest import CONTROL, CTL, SESSION_SECRET, csrf_of, login, make_tenant, page, prod_state

HTML = {"Accept": "text/html"}


@pytest.fixture
def acme(tenant_app: Any) -> dict[str, Any]:
    """Tenant acme with its whole-state token and a state; tenant other with one token."""
    api = tenant_app.test_client()
    secret, token_id = make_tenant(api, "acme")
    assert api.post("/v1/states/prod", data=prod_state(), headers={"Authorization": f"Bearer {secret}"}
                    ).status_code == 200
    other_secret, _ = make_tenant(api, "other")
    return {"api": api, "secret": secret, "id": token_id, "other_secret": other_secret}


def session_of(app: Any, secret: str, control: str | None = None) -> Any:
    client = app.test_client()
    assert login(client, secret).status_code == 302
    client.environ_base["HTTP_ACCEPT"] = "text/html"
    if control is not None:
        unlock = page(client, "/ui/tokens", 403)
        client.post("/ui/tokens/unlock", data={"csrf_token": csrf_of(unlock), "control_token": control})
    return client


@pytest.fixture
def operator(tenant_app: Any, acme: dict[str, Any]) -> Any:
    client = session_of(tenant_app, acme["secret"], CONTROL)
    page(client, "/ui/tokens")
    return client


def rows(db: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(db) as conn:
        return conn.execute(sql, args).fetchall()


def reserve(api: Any, secret: str, glob: str) -> Any:
    return api.post("/v1/engine/states/prod/runs", headers={"Authorization": f"Bearer {secret}"},
                    json={"actor": "ci", "reservations": [{"glob": glob, "mode": "write"}]})


def test_the_list_shows_each_token_of_the_tenant_with_its_scopes_and_never_a_secret(operator, acme):
    made = acme["api"].post("/v1/api/tenants/acme/tokens", headers=CTL, json={
        "name": "pay-ci", "environment": "staging", "scopes": ["module.a.*:write", "output.endpoint:write"]}).get_json()
    viewer = acme["api"].post("/v1/api/tenants/acme/tokens", headers=CTL,
                              json={"name": "viewer", "environment": "staging", "plan_only": True}).get_json()
    html = page(operator, "/ui/tokens")
    line = r'<tr>\s*<td><a href="/ui/tokens/[^"]+">([^<]+)</a>(.*?)</tr>'
    listed = {m[0]: m[1] for m in re.findall(line, html, re.S)}
    assert set(listed) == {"acme-ops", "pay-ci", "viewer"}  # not other's token
    assert "module.a.*:write" in listed["pay-ci"] and "output.endpoint:write" in listed["pay-ci"]
    assert made["token"]["id"] in listed["pay-ci"] and "staging" in listed["pay-ci"]
    assert "<td>yes</td>" in listed["viewer"] and "*:read" in listed["viewer"] and "<td>no</td>" in listed["pay-ci"]
    assert "the whole state" in listed["acme-ops"]
    for secret in (acme["secret"], made["token_secret"], viewer["token_secret"], acme["other_secret"]):
        assert secret not in html


def test_a_token_created_with_scopes_works_with_exactly_those_and_is_audited(operator, acme, clean_db, caplog):
    form = {"csrf_token": csrf_of(page(operator, "/ui/tokens")), "name": "team-a", "environment": "production",
            "scopes": "module.a.*:write\r\n\r\n  *:read  \r\n"}
    with caplog.at_level(logging.DEBUG):
        created = operator.post("/ui/tokens", data=form)
    html = created.get_data(as_text=True)
    assert created.status_code == 200 and created.headers["Cache-Control"] == "no-store"
    found = re.search(r'<pre id="token-secret">(kl_[^<]+)</pre>', html)
    assert found and "*:read" in html and "module.a.*:write" in html
    secret = found.group(1)
    assert secret not in caplog.text and secret not in page(operator, "/ui/tokens")
    refused = reserve(acme["api"], secret, "module.b.*")
    assert refused.status_code == 403 and refused.get_json()["code"] == "address_scope"
    assert reserve(acme["api"], secret, "module.a.*").status_code == 201
    audited = rows(clean_db, "SELECT actor, detail->>'token_name', detail->'scopes' FROM events "
                             "WHERE kind = 'token_create' AND detail->>'token_name' = 'team-a'")
    assert audited == [("dashboard:acme-ops", "team-a", ["*:read", "module.a.*:write"])]


def test_replacing_scopes_is_audited_with_both_lists_and_applies_to_the_next_request(operator, acme, clean_db):
    made = acme["api"].post("/v1/api/tenants/acme/tokens", headers=CTL, json={
        "name": "team", "environment": "production", "scopes": ["module.a.*:write"]}).get_json()
    token_id, secret = made["token"]["id"], made["token_secret"]
    detail = page(operator, f"/ui/tokens/{token_id}")
    assert ">module.a.*:write</textarea>" in detail
    assert reserve(acme["api"], secret, "module.b.*").status_code == 403
    done = operator.post(f"/ui/tokens/{token_id}/scopes", data={"csrf_token": csrf_of(detail),
                                                                "scopes": "module.b.*:write\n*:read"})
    assert done.status_code == 302
    assert "now has 2 scope(s)" in page(operator, f"/ui/tokens/{token_id}")
    audited = rows(clean_db, "SELECT actor, detail->'before', detail->'after' FROM events WHERE kind = 'token_scopes'")
    assert audited == [("dashboard:acme-ops", ["module.a.*:write"], ["*:read", "module.b.*:write"])]
    assert reserve(acme["api"], secret, "module.b.*").status_code == 201
    cleared = operator.post(f"/ui/tokens/{token_id}/scopes", data={"csrf_token": csrf_of(detail), "scopes": " \n"})
    assert cleared.status_code == 302
    assert rows(clean_db, "SELECT scopes FROM api_tokens WHERE public_id = %s", token_id) == [([],)]


def test_an_invalid_scope_is_a_400_page_with_the_message_and_changes_no_row(operator, acme, clean_db):
    detail = page(operator, f"/ui/tokens/{acme['id']}")
    bad = operator.post(f"/ui/tokens/{acme['id']}/scopes",
                        data={"csrf_token": csrf_of(detail), "scopes": "module.a.*:write\nmodule.b.*"})
    html = bad.get_data(as_text=True)
    assert bad.status_code == 400 and "write GLOB:read or GLOB:write" in html
    assert "module.a.*:write\nmodule.b.*</textarea>" in html  # what was typed, to correct it
    created = operator.post("/ui/tokens", data={"csrf_token": csrf_of(detail), "name": "x", "environment": "production",
                                                "scopes": "aws_instance.web_*:write"})
    assert created.status_code == 400 and 'value="x"' in created.get_data(as_text=True)
    assert "aws_instance.web_*" in created.get_data(as_text=True)
    both = operator.post("/ui/tokens", data={"csrf_token": csrf_of(detail), "name": "y", "environment": "production",
                                             "scopes": "*:write", "plan_only": "on"})
    assert both.status_code == 400 and "not both" in both.get_data(as_text=True)
    assert rows(clean_db, "SELECT name, scopes FROM api_tokens WHERE tenant_id = "
                          "(SELECT id FROM tenants WHERE slug = 'acme')") == [("acme-ops", [])]
    assert rows(clean_db, "SELECT kind FROM events WHERE kind = 'token_scopes' "
                          "OR (kind = 'token_create' AND detail->>'token_name' IN ('x', 'y'))") == []


def test_a_change_without_the_csrf_token_is_refused_and_changes_nothing(operator, acme, clean_db):
    for data in ({}, {"csrf_token": "forged"}):
        created = operator.post("/ui/tokens", data={**data, "name": "sneaky", "environment": "production"})
        replaced = operator.post(f"/ui/tokens/{acme['id']}/scopes", data={**data, "scopes": "*:read"})
        assert created.status_code == replaced.status_code == 403 and "CSRF" in created.get_data(as_text=True)
    assert rows(clean_db, "SELECT name, scopes FROM api_tokens WHERE name IN ('acme-ops', 'sneaky')") == [
        ("acme-ops", [])]


def test_only_the_control_tokens_holder_with_a_whole_state_session_manages_tokens(tenant_app, acme, ui, clean_db):
    tenant = session_of(tenant_app, acme["secret"])
    assert "Tokens</a>" in page(tenant, "/ui/")
    unlock = page(tenant, "/ui/tokens", 403)
    assert "KL_CONTROL_TOKEN" in unlock and 'id="tokens"' not in unlock
    form = {"csrf_token": csrf_of(unlock), "name": "mine", "environment": "production"}
    assert tenant.post("/ui/tokens", data=form).status_code == 403
    assert tenant.get(f"/ui/tokens/{acme['id']}").status_code == 403
    assert tenant.post(f"/ui/tokens/{acme['id']}/scopes", data={**form, "scopes": "*:read"}).status_code == 403
    wrong = tenant.post("/ui/tokens/unlock", data={**form, "control_token": acme["secret"]})
    assert wrong.status_code == 403 and "invalid credentials" in wrong.get_data(as_text=True)
    assert rows(clean_db, "SELECT detail->>'path' FROM events WHERE kind = 'auth_failed'") == [("/ui/tokens/unlock",)]
    assert tenant.get("/ui/tokens").status_code == 403
    # A token with address scopes never manages tokens, even with the control token.
    scoped = acme["api"].post("/v1/api/tenants/acme/tokens", headers=CTL, json={
        "name": "scoped", "environment": "production", "scopes": ["*:write"]}).get_json()
    narrow = session_of(tenant_app, scoped["token_secret"])
    assert "Tokens</a>" not in page(narrow, "/ui/")
    refused = narrow.get("/ui/tokens")
    assert refused.status_code == 403 and "address scopes" in refused.get_data(as_text=True)
    assert narrow.post("/ui/tokens/unlock", data={**form, "csrf_token": csrf_of(page(narrow, "/ui/")),
                                                  "control_token": CONTROL}).status_code == 403
    assert narrow.get("/ui/tokens").status_code == 403
    # The static mode has no tokens to manage, as the control API says.
    static = ui.get("/ui/tokens")
    assert static.status_code == 403 and "KL_AUTH_MODE=database" in static.get_data(as_text=True)
    assert rows(clean_db, "SELECT count(*) FROM api_tokens") == [(3,)]


def test_where_the_control_api_has_its_own_listener_the_dashboard_manages_no_tokens(tenant_app, acme, settings):
    from app.web import create_app

    public = create_app(replace(settings, auth_mode=AuthMode.DATABASE, control_token=CONTROL,
                                session_secret=SESSION_SECRET), lanes="public")
    try:
        client = session_of(public, acme["secret"])
        assert "Tokens</a>" not in page(client, "/ui/")
        refused = client.get("/ui/tokens")
        assert refused.status_code == 403 and "--control-port" in refused.get_data(as_text=True)
        unlock = client.post("/ui/tokens/unlock", data={"csrf_token": csrf_of(page(client, "/ui/")),
                                                         "control_token": CONTROL})
        assert unlock.status_code == 403 and client.get("/ui/tokens").status_code == 403
    finally:
        public.extensions["kilolock"].db.close()
