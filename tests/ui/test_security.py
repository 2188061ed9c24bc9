"""Dashboard security: no page or action without a session, CSRF on every POST, cookie flags,
tenant isolation (another tenant's state is a 404), sensitive values never rendered, and inert
``<script>`` in addresses and values."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from app.config import Settings
from app.errors import ConfigError
from tests.helpers import counted_state
from tests.ui.conftest import (
    CTL,
    DB_PASSWORD,
    SCRIPT,
    SECRET_OUTPUT,
    TOKEN,
    Seeded,
    csrf_of,
    login,
    make_tenant,
    page,
    prod_state,
)

HTML = {"Accept": "text/html,application/xhtml+xml"}
JSON = {"Accept": "application/json"}


def ui_pages(seeded: Seeded) -> list[str]:
    return ["/ui/", "/ui/states/prod", "/ui/states/prod?q=web", "/ui/states/prod/runs",
            "/ui/states/prod/resource?address=module.a.terraform_data.x", "/ui/runs", f"/ui/runs/{seeded.running}",
            "/ui/reservations", "/ui/reservations?state=prod", "/ui/pulls", "/ui/states/prod/blame?glob=module.a.*"]


# Operators' pages: a session of the static mode is refused them (403), so they are not in ui_pages.
TOKEN_PAGES = ["/ui/tokens", "/ui/tokens/tok_0"]


def ui_actions(seeded: Seeded) -> list[str]:
    return [f"/ui/runs/{seeded.running}/abort", "/ui/logout", "/ui/tokens", "/ui/tokens/unlock",
            "/ui/tokens/tok_0/scopes"]


def test_every_dashboard_route_is_covered_by_the_session_checks(static_app, seeded):
    endpoints = {rule.endpoint for rule in static_app.url_map.iter_rules() if rule.endpoint.startswith("ui.")}
    covered = {"ui.states", "ui.state", "ui.state_runs", "ui.resource", "ui.all_runs", "ui.run", "ui.reservations",
               "ui.pulls", "ui.abort", "ui.logout", "ui.login", "ui.static", "ui.blame", "ui.tokens", "ui.token",
               "ui.tokens_unlock", "ui.create_token", "ui.token_scopes"}
    assert endpoints == covered, "a new dashboard route needs a case in ui_pages/ui_actions"


def test_every_page_without_a_session_redirects_browsers_to_the_login(anon, seeded):
    for path in ui_pages(seeded) + TOKEN_PAGES:
        response = anon.get(path, headers=HTML)
        assert response.status_code == 302, path
        assert response.headers["Location"].startswith("/ui/login?next="), path


def test_every_page_and_action_without_a_session_is_401_for_other_clients(anon, seeded):
    for path in ui_pages(seeded) + TOKEN_PAGES:
        response = anon.get(path, headers=JSON)
        assert response.status_code == 401 and response.get_json()["code"] == "unauthorized", path
    for path in ui_actions(seeded):
        response = anon.post(path, data={"csrf_token": "x"}, headers=JSON)
        assert response.status_code == 401, path
        assert anon.post(path, headers=HTML).status_code == 302, path


def test_an_action_without_a_session_changes_nothing(anon, seeded, clean_db):
    anon.post(f"/ui/runs/{seeded.running}/abort", data={"csrf_token": "guess"}, headers=HTML)
    with psycopg.connect(clean_db) as conn:
        status = conn.execute("SELECT status FROM apply_runs WHERE id = %s", (seeded.running,)).fetchone()
        assert status == ("reserved",)


def test_a_post_without_the_csrf_token_is_403_and_changes_nothing(ui, seeded, clean_db):
    for data in ({}, {"csrf_token": "not-the-token"}):
        response = ui.post(f"/ui/runs/{seeded.running}/abort", data=data)
        assert response.status_code == 403 and "CSRF" in response.get_data(as_text=True)
        assert ui.post("/ui/logout", data=data).status_code == 403
    with psycopg.connect(clean_db) as conn:
        status = conn.execute("SELECT status FROM apply_runs WHERE id = %s", (seeded.running,)).fetchone()
        assert status == ("reserved",)
        assert conn.execute("SELECT count(*) FROM resource_reservations").fetchone() == (1,)


def test_the_login_form_itself_needs_its_csrf_token(anon):
    anon.get("/ui/login", headers=HTML)
    response = anon.post("/ui/login", data={"token": TOKEN}, headers=HTML)
    assert response.status_code == 403
    assert anon.get("/ui/", headers=HTML).status_code == 302


def test_a_wrong_token_is_refused_and_audited_without_the_secret(anon, clean_db):
    response = login(anon, "not-the-token-at-all")
    assert response.status_code == 403 and "refused" in response.get_data(as_text=True)
    assert anon.get("/ui/", headers=HTML).status_code == 302
    with psycopg.connect(clean_db) as conn:
        rows = conn.execute("SELECT kind, detail::text FROM events WHERE kind = 'auth_failed'").fetchall()
    assert rows and "/ui/login" in rows[0][1] and "not-the-token-at-all" not in str(rows)


def test_the_session_cookie_is_httponly_samesite_scoped_and_holds_no_secret(static_app, anon):
    response = login(anon, TOKEN)
    assert response.status_code == 302 and response.headers["Location"] == "/ui/"
    cookie = [c for c in response.headers.getlist("Set-Cookie") if c.startswith("kl_session=")][-1]
    attributes = {part.strip().split("=")[0].lower() for part in cookie.split(";")}
    assert {"httponly", "path", "expires"} <= attributes and "secure" not in attributes
    assert "SameSite=Lax" in cookie and "Path=/ui" in cookie
    value = cookie.split(";")[0].split("=", 1)[1]
    content = static_app.session_interface.get_signing_serializer(static_app).loads(value)
    assert TOKEN not in json.dumps(content)
    assert set(content) == {"_permanent", "mode", "actor", "csrf", "fp"}


def test_the_session_cookie_is_secure_over_https(static_app):
    client = static_app.test_client()
    page_ = client.get("/ui/login", headers=HTML, base_url="https://kilolock.test")
    cookie = page_.headers["Set-Cookie"]
    assert "Secure" in cookie and "HttpOnly" in cookie


def test_a_public_https_url_makes_the_cookie_secure_behind_a_proxy(static_settings):
    from app.web import create_app

    application = create_app(replace(static_settings, public_url="https://kilolock.example.com"))
    try:
        cookie = application.test_client().get("/ui/login", headers=HTML).headers["Set-Cookie"]
        assert "Secure" in cookie
    finally:
        application.extensions["kilolock"].db.close()


def test_login_never_redirects_off_the_dashboard(static_app):
    for target in ("//evil.example/ui/", "https://evil.example/", "/v1/states/prod", "/ui/\\evil"):
        client = static_app.test_client()
        form = client.get("/ui/login", headers=HTML).get_data(as_text=True)
        response = client.post("/ui/login", data={"csrf_token": csrf_of(form), "token": TOKEN, "next": target},
                               headers=HTML)
        assert response.headers["Location"] == "/ui/", target
    client = static_app.test_client()
    form = client.get("/ui/login?next=/ui/pulls", headers=HTML).get_data(as_text=True)
    response = client.post("/ui/login", data={"csrf_token": csrf_of(form), "token": TOKEN, "next": "/ui/pulls"})
    assert response.headers["Location"] == "/ui/pulls"


def test_logging_out_ends_the_session(ui):
    token = csrf_of(page(ui, "/ui/"))
    assert ui.post("/ui/logout", data={"csrf_token": token}).status_code == 302
    assert ui.get("/ui/").status_code == 302


def test_pages_send_a_strict_content_security_policy(ui, seeded):
    response = ui.get("/ui/states/prod")
    policy = response.headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy and "unsafe-inline" not in policy
    assert response.headers["X-Frame-Options"] == "DENY" and response.headers["Cache-Control"] == "no-store"


def test_sensitive_values_are_never_rendered_on_any_page(ui, seeded):
    pages = ui_pages(seeded) + ["/ui/states/prod/resource?address=terraform_data.db", f"/ui/runs/{seeded.committed}",
                                f"/ui/runs/{seeded.failed}"]
    for path in pages:
        html = page(ui, path)
        assert SECRET_OUTPUT not in html and DB_PASSWORD not in html, path
    outputs = page(ui, "/ui/states/prod")
    assert "db_password" in outputs and "(sensitive)" in outputs
    history = page(ui, "/ui/states/prod/resource?address=terraform_data.db")
    assert history.count("(sensitive)") >= 2 and "input.value" in history


def test_script_tags_in_addresses_and_values_are_escaped(ui, seeded):
    address = f'terraform_data.web["{SCRIPT}"]'
    pages = ["/ui/states/prod", "/ui/states/prod?q=script", f"/ui/states/prod/resource?address={address}",
             "/ui/states/prod/resource?address=module.a.terraform_data.x", f"/ui/runs/{seeded.failed}"]
    for path in pages:
        html = page(ui, path)
        assert SCRIPT not in html, path
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html or "\\u003cscript\\u003e" in html, path
    assert page(ui, f"/ui/states/prod/resource?address={address}").count("&lt;script&gt;") >= 3


def test_a_filter_with_sql_wildcards_is_taken_literally(ui, seeded):
    html = page(ui, "/ui/states/prod?q=%25")
    assert "0 of 6 match" in html
    html = page(ui, "/ui/states/prod?q=web%5B%22b")
    assert 'terraform_data.web[&#34;blue&#34;]' in html and "green" not in html.split('id="resources"')[1]


# --- database mode: tenants ----------------------------------------------------------------------------

@pytest.fixture
def tenants(tenant_app: Any) -> dict[str, Any]:
    api = tenant_app.test_client()
    (a_secret, a_id), (b_secret, _) = make_tenant(api, "alpha"), make_tenant(api, "beta")
    bearer_b = {"Authorization": f"Bearer {b_secret}"}
    assert api.post("/v1/states/beta-only", data=prod_state(), headers=bearer_b).status_code == 200
    assert api.post("/v1/states/prod", data=counted_state(1, 2), headers=bearer_b).status_code == 200
    run = api.post("/v1/engine/states/prod/runs", headers=bearer_b,
                   json={"actor": "beta-bob", "reservations": [{"glob": "*", "mode": "write"}]})
    assert run.status_code == 201
    bearer_a = {"Authorization": f"Bearer {a_secret}"}
    assert api.post("/v1/states/prod", data=counted_state(1, 3), headers=bearer_a).status_code == 200
    return {"a": a_secret, "a_id": a_id, "b": b_secret, "b_run": run.get_json()["run"]["id"]}


def test_a_tenant_session_cannot_see_another_tenants_states_or_runs(tenant_app, tenants, clean_db):
    client = tenant_app.test_client()
    assert login(client, tenants["a"]).status_code == 302
    client.environ_base["HTTP_ACCEPT"] = "text/html"
    states = page(client, "/ui/")
    assert "prod" in states and "beta-only" not in states
    assert ">3<" in states  # alpha's prod has 3 instances, not beta's 2
    for path in ("/ui/states/beta-only", "/ui/states/beta-only/runs",
                 "/ui/states/beta-only/resource?address=module.a.terraform_data.x", f"/ui/runs/{tenants['b_run']}"):
        assert client.get(path).status_code == 404, path
    assert tenants["b_run"] not in page(client, "/ui/reservations") + page(client, "/ui/runs")
    token = csrf_of(states)
    assert client.post(f"/ui/runs/{tenants['b_run']}/abort", data={"csrf_token": token}).status_code == 404
    with psycopg.connect(clean_db) as conn:
        assert conn.execute("SELECT status FROM apply_runs WHERE id = %s", (tenants["b_run"],)).fetchone() == (
            "reserved",)


def test_a_tenant_sees_its_own_state_and_the_token_name_as_actor(tenant_app, tenants):
    client = tenant_app.test_client()
    assert login(client, tenants["b"]).status_code == 302
    client.environ_base["HTTP_ACCEPT"] = "text/html"
    html = page(client, "/ui/states/beta-only")
    assert "beta-ops" in html and SECRET_OUTPUT not in html
    token = csrf_of(html)
    assert client.post(f"/ui/runs/{tenants['b_run']}/abort", data={"csrf_token": token}).status_code == 302
    assert "run_abort" in page(client, f"/ui/runs/{tenants['b_run']}")


def test_revoking_the_token_ends_its_dashboard_sessions(tenant_app, tenants):
    client = tenant_app.test_client()
    assert login(client, tenants["a"]).status_code == 302
    assert client.get("/ui/", headers=HTML).status_code == 200
    api = tenant_app.test_client()
    assert api.post(f"/v1/api/tenants/alpha/tokens/{tenants['a_id']}/revoke", headers=CTL).status_code == 200
    assert client.get("/ui/", headers=HTML).status_code == 302
    assert login(client, tenants["a"]).status_code == 403


# --- open mode and the session secret ------------------------------------------------------------------

def test_open_mode_needs_no_login_but_still_checks_csrf(client, clean_db):
    client.post("/v1/states/prod", data=counted_state(1, 2))
    run = client.post("/v1/engine/states/prod/runs",
                      json={"actor": "a", "reservations": [{"glob": "*", "mode": "write"}]})
    run_id = run.get_json()["run"]["id"]
    html = page(client, "/ui/", 200)
    assert "open mode" in html
    assert client.get("/ui/login", headers=HTML).status_code == 302
    assert client.post(f"/ui/runs/{run_id}/abort", data={}).status_code == 403
    form = page(client, f"/ui/runs/{run_id}")
    assert client.post(f"/ui/runs/{run_id}/abort", data={"csrf_token": csrf_of(form)}).status_code == 302
    with psycopg.connect(clean_db) as conn:
        assert conn.execute("SELECT status FROM apply_runs").fetchone() == ("aborted",)


def test_database_mode_starts_without_a_session_secret_and_checks_one_given():
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"KL_AUTH_MODE": "database"})
    assert not any("KL_SESSION_SECRET" in p for p in caught.value.problems)
    assert any("KL_CONTROL_TOKEN" in p for p in caught.value.problems)
    with pytest.raises(ConfigError, match="at least 32"):
        Settings.from_env({"KL_SESSION_SECRET": "short"})
    ok = Settings.from_env({"KL_AUTH_MODE": "database", "KL_CONTROL_TOKEN": "c", "KL_SESSION_SECRET": "s" * 40})
    assert ok.session_secret == "s" * 40 and "s" * 40 not in repr(ok)
    assert Settings.from_env({"KL_AUTH_MODE": "database", "KL_CONTROL_TOKEN": "c"}).session_secret is None


def test_without_a_secret_every_process_shares_one_generated_and_kept_in_the_database(settings, clean_db):
    from app.web import create_app

    first, second = create_app(settings), create_app(settings)
    try:
        assert first.secret_key and first.secret_key == second.secret_key and len(str(first.secret_key)) >= 32
        with psycopg.connect(clean_db) as conn:
            assert conn.execute("SELECT value FROM server_secrets").fetchall() == [(first.secret_key,)]
        given = create_app(replace(settings, session_secret="o" * 40))
        assert given.secret_key == "o" * 40
        given.extensions["kilolock"].db.close()
    finally:
        first.extensions["kilolock"].db.close()
        second.extensions["kilolock"].db.close()


def test_static_mode_sessions_work_across_workers_without_a_configured_secret(static_settings):
    from app.web import create_app

    unset = replace(static_settings, session_secret=None)
    one, two = create_app(unset), create_app(unset)
    try:
        client = one.test_client()
        assert login(client, TOKEN).status_code == 302
        cookie = client.get_cookie("kl_session", path="/ui")
        assert cookie is not None
        other = two.test_client()
        other.set_cookie("kl_session", cookie.value, path="/ui")
        assert other.get("/ui/", headers=HTML).status_code == 200
        rotated = create_app(replace(unset, auth_token="a-new-token-after-rotation"))
        try:
            moved = rotated.test_client()
            moved.set_cookie("kl_session", cookie.value, path="/ui")
            assert moved.get("/ui/", headers=HTML).status_code == 302
        finally:
            rotated.extensions["kilolock"].db.close()
    finally:
        one.extensions["kilolock"].db.close()
        two.extensions["kilolock"].db.close()


@pytest.mark.parametrize("accept", [None, "*/*", "application/json, */*;q=0.5"])
def test_a_client_that_does_not_name_html_gets_401_not_a_redirect(anon, seeded, accept):
    response = anon.get("/ui/", headers={"Accept": accept} if accept else {})
    assert response.status_code == 401 and response.get_json()["code"] == "unauthorized"


def test_a_throttled_dashboard_login_says_when_to_try_again(static_settings):
    from app.web import create_app

    app = create_app(replace(static_settings, auth_failure_limit=2))
    try:
        browser = app.test_client()
        answers = [login(browser, "wrong-token") for _ in range(4)]
        assert answers[0].status_code == 403
        throttled = answers[-1]
        assert throttled.status_code == 429 and "text/html" in throttled.content_type
        assert 0 < int(throttled.headers["Retry-After"]) <= static_settings.auth_failure_window
    finally:
        app.extensions["kilolock"].db.close()
