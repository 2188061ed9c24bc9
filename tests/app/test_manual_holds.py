"""Manual holds over a live server and real Postgres: ``kl hold``/``kl release``, the conflicts every lane meets
(``kl``, Terraform's LOCK with real Terraform), caps, expiry, the until-released permission, scoped tokens,
the audit trail, and malformed input."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
import requests

from app.config import AuthMode
from app.domain.manual_holds import HoldPolicy
from app.domain.principal import default_principal
from app.store import manual_holds
from tests.runner.test_cli_read import kl, write_backend

REASON = "change freeze: DB migration «v2»"


def _events(url: str, state: str, kind: str) -> list[dict]:  # type: ignore[type-arg]
    found = requests.get(f"{url}/v1/engine/states/{state}/events", timeout=10).json()["events"]
    return [e for e in found if e["kind"] == kind]


def _runs(clean_db: str) -> int:
    import psycopg

    with psycopg.connect(clean_db) as conn:
        return int(conn.execute("SELECT count(*) FROM apply_runs").fetchone()[0])  # type: ignore[index]


def test_kl_hold_lists_conflicts_and_releases_with_an_audit_trail(live_server, tmp_path):
    address = live_server.state_url("shared")
    taken = kl("hold", "module.db.*", "terraform_data.x", "--reason", REASON, "--until", "2h", "--address", address,
               "--json", cwd=tmp_path)
    assert taken.returncode == 0, taken.stderr
    hold = json.loads(taken.stdout)
    assert hold["globs"] == ["module.db.*", "terraform_data.x"] and hold["reason"] == REASON
    assert hold["holder"] == "anonymous" and hold["id"].startswith("ar_")
    assert timedelta(minutes=119) < datetime.fromisoformat(hold["until"]) - datetime.now(UTC) <= timedelta(hours=2)

    # kl reservations names holder, reason, release command and expiry; kl holds lists it.
    listed = kl("reservations", "--address", live_server.url, cwd=tmp_path).stdout
    assert f'anonymous\'s manual hold "{REASON}" (release: kl release {hold["id"]})' in listed
    assert "expires in 1h59m" in listed or "expires in 2h" in listed
    holds = json.loads(kl("holds", "--json", "--address", live_server.url, cwd=tmp_path).stdout)
    assert [h["id"] for h in holds] == [hold["id"]]
    metrics = requests.get(f"{live_server.url}/metrics", timeout=10).text
    assert "\nkilolock_manual_holds 1.0\n" in metrics  # counted apart: a freeze is no stuck apply
    assert "\nkilolock_oldest_live_run_age_seconds 0.0\n" in metrics

    # Another acquisition meets it: kl's refusal names holder, reason and how to release (exit 2: conflict).
    other = kl("hold", "module.db.aws_db_instance.main", "--reason", "mine", "--address", address, cwd=tmp_path)
    assert other.returncode == 2, other.stderr
    assert REASON in other.stderr and f"kl release {hold['id']}" in other.stderr and "anonymous" in other.stderr
    opened = requests.post(f"{live_server.url}/v1/engine/states/shared/runs", timeout=10, json={
        "actor": "bob", "reservations": [{"glob": "terraform_data.x", "mode": "read"}]})
    assert opened.status_code == 409 and f"kl release {hold['id']}" in opened.json()["error"]

    # Its bounds hold: a hold is neither renewed nor widened through the run endpoints.
    for path, extra in (("renew", {}), ("reservations", {"reservations": [{"glob": "module.web.*", "mode": "write"}]})):
        widened = requests.post(f"{live_server.url}/v1/engine/runs/{hold['id']}/{path}", timeout=10,
                                json={"holder": hold["held_as"], **extra})
        assert widened.status_code == 400 and "is a manual hold" in widened.json()["error"], widened.text

    released = kl("release", hold["id"], "--address", live_server.url, cwd=tmp_path)
    assert released.returncode == 0 and f"released hold {hold['id']}" in released.stdout, released.stderr
    assert json.loads(kl("reservations", "--json", "--address", live_server.url, cwd=tmp_path).stdout) == []
    again = kl("release", hold["id"], "--address", live_server.url, cwd=tmp_path)
    assert again.returncode == 1 and "no live manual hold" in again.stderr

    for kind in ("hold_taken", "hold_released"):
        (event,) = _events(live_server.url, "shared", kind)
        assert {k: event["detail"][k] for k in ("hold_id", "globs", "reason", "holder", "until")} == {
            "hold_id": hold["id"], "globs": hold["globs"], "reason": REASON, "holder": "anonymous",
            "until": hold["until"]}


@pytest.mark.terraform
def test_terraform_lock_gets_423_naming_the_hold_and_how_to_release_it(live_server, terraform_factory, tmp_path):
    tf = terraform_factory()
    address = live_server.state_url("tf")
    write_backend(tf.workdir, address)
    tf.write("main.tf", 'resource "terraform_data" "web" {\n  input = "v1"\n}\n')
    tf("init", "-input=false")
    tf("apply", "-auto-approve", "-input=false")
    hold = json.loads(kl("hold", "terraform_data.web", "--reason", REASON, "--address", address, "--json",
                         cwd=tmp_path).stdout)
    tf.write("main.tf", 'resource "terraform_data" "web" {\n  input = "v2"\n}\n')
    refused = tf("apply", "-auto-approve", "-input=false", check=False)
    assert refused.returncode != 0 and "Error acquiring the state lock" in refused.output, refused.output
    flat = " ".join(refused.output.split())
    assert REASON in flat and f"kl release {hold['id']}" in flat and "anonymous's manual hold" in flat
    assert kl("release", hold["id"], "--address", address, cwd=tmp_path).returncode == 0
    tf("apply", "-auto-approve", "-input=false")


def test_caps_until_released_and_malformed_input_change_no_row(live_server_factory, clean_db):
    server = live_server_factory(max_holds_per_token=2, hold_max_seconds=3600)
    url = f"{server.url}/v1/engine/states/capped/holds"

    def take(glob: str, **extra: object) -> requests.Response:
        return requests.post(url, json={"globs": [glob], "reason": "freeze", **extra}, timeout=10)

    assert take("module.a.*").status_code == 201 and take("module.b.*").status_code == 201
    before = _runs(clean_db)
    refusals = [
        (take("module.c.*"), 409, "hold_limit"),
        (take("module.d.*", until_seconds=7200), 400, "bad_request"),
        (take("module.d.*", until_released=True), 403, "hold_forbidden"),
        (requests.post(url, json={"globs": ["module.e.*"]}, timeout=10), 400, "bad_request"),
        (requests.post(url, json={"globs": ["module.e.*"], "reason": "x" * 201}, timeout=10), 400, "bad_request"),
        (requests.post(url, json={"globs": ["module.e.*"], "reason": "a\x07b"}, timeout=10), 400, "bad_request"),
        (requests.post(url, json={"globs": [], "reason": "r"}, timeout=10), 400, "bad_request"),
        (requests.post(url, json={"globs": ["module["], "reason": "r"}, timeout=10), 400, "bad_request"),
        (requests.post(url, json={"globs": ["a"] * 5000, "reason": "r"}, timeout=10), 400, "bad_request"),
        (requests.post(url, json=["module.e.*"], timeout=10), 400, "bad_request"),
        (requests.post(url, data=b"{nope", timeout=10), 400, "bad_request"),
        (take("module.d.*", until_seconds="1h"), 400, "bad_request"),
        (requests.delete(f"{server.url}/v1/engine/holds/ar_missing", timeout=10), 404, "hold_not_found"),
        (requests.delete(f"{server.url}/v1/engine/holds/{'x' * 60}", timeout=10), 400, "bad_request"),
    ]
    for response, status, code in refusals:
        assert (response.status_code, response.json()["ok"], response.json()["code"]) == (status, False, code), \
            response.text
    assert _runs(clean_db) == before
    assert "KL_MAX_HOLDS_PER_TOKEN=2" in refusals[0][0].json()["error"]
    assert "KL_HOLD_UNTIL_RELEASED" in refusals[2][0].json()["error"]

    # An operator lets every caller hold until released; such a hold has no expiry.
    open_ended = live_server_factory(hold_until_released=("*",), max_holds_per_state=3)
    answer = requests.post(f"{open_ended.url}/v1/engine/states/other/holds", timeout=10,
                           json={"globs": ["module.z.*"], "reason": "until done", "until_released": True})
    assert answer.status_code == 201 and answer.json()["hold"]["until"] is None, answer.text
    listed = requests.get(f"{open_ended.url}/v1/engine/reservations", params={"state": "other"}, timeout=10).json()
    conflict = requests.post(f"{open_ended.url}/v1/engine/states/other/runs", timeout=10, json={
        "actor": "bob", "reservations": [{"glob": "module.z.terraform_data.x", "mode": "write"}]}).json()
    assert "no expiry: held until released" in conflict["error"], conflict
    assert len(listed["reservations"]) == 1
    for glob in ("module.y.*", "module.w.*"):
        assert requests.post(f"{open_ended.url}/v1/engine/states/other/holds", timeout=10,
                             json={"globs": [glob], "reason": "r"}).status_code == 201
    full = requests.post(f"{open_ended.url}/v1/engine/states/other/holds", timeout=10,
                         json={"globs": ["module.v.*"], "reason": "r"})
    assert full.status_code == 409 and "KL_MAX_HOLDS_PER_STATE=3" in full.json()["error"], full.text


def test_an_expired_hold_is_reclaimed_and_recorded(db, live_server):
    past = datetime.now(UTC) - timedelta(hours=2)
    hold = manual_holds.take(db, default_principal(), "exp", globs=["module.db.*"], reason="night work",
                             policy=HoldPolicy(), until_seconds=60, until_released=False, max_globs=100,
                             clock=lambda: past)
    opened = requests.post(f"{live_server.url}/v1/engine/states/exp/runs", timeout=10, json={
        "actor": "bob", "reservations": [{"glob": "module.db.terraform_data.x", "mode": "write"}]})
    assert opened.status_code == 201, opened.text
    (expired,) = _events(live_server.url, "exp", "hold_expired")
    assert expired["detail"]["hold_id"] == hold.id and expired["detail"]["reason"] == "night work"
    assert expired["detail"]["until"] == (past + timedelta(seconds=60)).isoformat()
    assert manual_holds.list_holds(db, default_principal()) == []
    assert [e["detail"]["hold_id"] for e in _events(live_server.url, "exp", "hold_taken")] == [hold.id]


def test_a_scoped_token_holds_only_inside_its_write_scopes(live_server_factory, clean_db):
    ctl = {"Authorization": "Bearer ctl-holds"}
    server = live_server_factory(auth_mode=AuthMode.DATABASE, control_token="ctl-holds")
    assert requests.post(f"{server.url}/v1/api/tenants", json={"slug": "acme"}, headers=ctl, timeout=10).ok
    token = requests.post(f"{server.url}/v1/api/tenants/acme/tokens", headers=ctl, timeout=10, json={
        "name": "db-team", "environment": "prod", "scopes": ["module.db.*:write", "*:read"]}).json()
    auth = {"Authorization": f"Bearer {token['token_secret']}"}
    state = f"{server.url}/v1/engine/states/{token['workspace_id']}/{token['environment_id']}/prod/holds"
    before = _runs(clean_db)
    outside = requests.post(state, headers=auth, timeout=10, json={"globs": ["module.web.*"], "reason": "r"})
    assert (outside.status_code, outside.json()["code"]) == (403, "address_scope"), outside.text
    assert _runs(clean_db) == before
    inside = requests.post(state, headers=auth, timeout=10,
                           json={"globs": ["module.db.terraform_data.main"], "reason": "r"})
    assert inside.status_code == 201, inside.text
    assert inside.json()["hold"]["holder"] == "db-team"
