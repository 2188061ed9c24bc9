"""Address scopes over real HTTP (a live server in database auth mode): how they are set and replaced, the 403
``address_scope`` envelope and its audit event, commits refused for what they write, and filtered reads. A
refused request changes no row."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
import requests

from app.config import AuthMode
from tests.helpers import instance, resource, state

CONTROL = "ctl-scopes"
CTL = {"Authorization": f"Bearer {CONTROL}"}


class Api:
    def __init__(self, url: str) -> None:
        self.url = url
        assert requests.post(f"{url}/v1/api/tenants", json={"slug": "acme"}, headers=CTL, timeout=10).ok

    def token(self, name: str, **body: Any) -> dict[str, Any]:
        created = requests.post(f"{self.url}/v1/api/tenants/acme/tokens", headers=CTL, timeout=10,
                                json={"name": name, "environment": "prod", **body})
        assert created.status_code == 201, created.text
        doc: dict[str, Any] = created.json()
        doc["headers"] = {"Authorization": f"Bearer {doc['token_secret']}"}
        doc["engine"] = f"{self.url}/v1/engine/states/{doc['workspace_id']}/{doc['environment_id']}/main"
        doc["backend"] = f"{self.url}/v1/states/{doc['workspace_id']}/{doc['environment_id']}/main"
        return doc


def trunk(serial: int = 1, svc: str = "s1") -> bytes:
    return state(serial, [
        resource("svc", [instance(None, svc)], module='module.payments["eu"]'),
        resource("svc", [instance(None, svc + "-us")], module='module.payments["us"]'),
        resource("search", [instance(0, "q0"), instance(1, "q1")]),
        resource("shared", [instance(None, "shared")]),
    ], outputs={"payments_url": {"value": "https://pay", "type": "string"},
                "search_ids": {"value": "a b", "type": "string"}})


def rows(url: str) -> tuple[Any, ...]:
    with psycopg.connect(url) as conn:
        return (conn.execute("SELECT count(*), max(serial) FROM state_versions").fetchone(),
                conn.execute("SELECT id, status FROM apply_runs ORDER BY id").fetchall(),
                conn.execute("SELECT run_id, glob, mode FROM resource_reservations ORDER BY id").fetchall(),
                conn.execute("SELECT address, create_serial, delete_serial FROM resources ORDER BY id").fetchall())


@pytest.fixture
def api(live_server_factory):  # type: ignore[no-untyped-def]
    server = live_server_factory(auth_mode=AuthMode.DATABASE, control_token=CONTROL)
    return Api(server.url)


@pytest.fixture
def seeded(api):  # type: ignore[no-untyped-def]
    admin = api.token("admin")
    assert requests.post(admin["backend"], data=trunk(), headers=admin["headers"], timeout=10).status_code == 200
    return admin


def events(admin: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    found = requests.get(f"{admin['engine']}/events", params={"limit": 1000}, headers=admin["headers"], timeout=10)
    return [e for e in found.json()["events"] if e["kind"] == kind]


def test_scopes_are_validated_set_at_creation_and_replaced_with_an_audit_event(api, seeded, clean_db):  # type: ignore[no-untyped-def]
    for body, problem in (({"scopes": ["module.payments.*"]}, "GLOB:read or GLOB:write"),
                          ({"scopes": "*:read"}, "must be a list"),
                          ({"scopes": [{"glob": "*"}]}, "strings"),
                          ({"scopes": ["module.p.*:write"] * 1001}, "at most 1000"),
                          ({"scopes": ["*:read"], "plan_only": True}, "not both"),
                          ({"plan_only": "yes"}, "true or false")):
        refused = requests.post(f"{api.url}/v1/api/tenants/acme/tokens", headers=CTL, timeout=10,
                                json={"name": "bad", "environment": "prod", **body})
        assert refused.status_code == 400 and refused.json()["code"] == "bad_request", refused.text
        assert problem in refused.json()["error"]
    pay = api.token("pay", scopes=["module.payments.*:write", "module.payments.*:read"])
    assert pay["token"]["scopes"] == ["module.payments.*:write"]
    url = f"{api.url}/v1/api/tenants/acme/tokens/{pay['token']['id']}/scopes"
    replaced = requests.put(url, json={"scopes": ["aws_iam_role.*:write", "*:read"]}, headers=CTL, timeout=10)
    assert replaced.status_code == 200 and replaced.json()["token"]["scopes"] == ["*:read", "aws_iam_role.*:write"]
    assert requests.put(url, json={"scopes": ["x"]}, headers=CTL, timeout=10).status_code == 400
    # The next request is checked against the new scopes: the whole state reads now.
    assert requests.get(pay["backend"], headers=pay["headers"], timeout=10).status_code == 200
    assert requests.put(url, json={"scopes": []}, headers=CTL, timeout=10).json()["token"]["scopes"] == []
    listed = requests.get(f"{api.url}/v1/api/tenants/acme/tokens", headers=CTL, timeout=10).json()["tokens"]
    assert {t["name"]: t["scopes"] for t in listed} == {"admin": [], "pay": []}
    with psycopg.connect(clean_db) as conn:
        audited = conn.execute("SELECT detail FROM events WHERE kind = 'token_scopes' ORDER BY id").fetchall()
    assert [(d["before"], d["after"]) for (d,) in audited] == [
        (["module.payments.*:write"], ["*:read", "aws_iam_role.*:write"]),
        (["*:read", "aws_iam_role.*:write"], [])]


def _open(token: dict[str, Any], *reservations: tuple[str, str]) -> requests.Response:
    return requests.post(f"{token['engine']}/runs", headers=token["headers"], timeout=10, json={
        "actor": token["token"]["name"], "base_serial": 1,
        "reservations": [{"glob": g, "mode": m} for g, m in reservations]})


def _commit(token: dict[str, Any], run_id: str, body: bytes, addresses: list[str]) -> requests.Response:
    return requests.post(f"{token['engine'].rsplit('/states/', 1)[0]}/runs/{run_id}/commit", headers=token["headers"],
                         timeout=10, json={"holder": token["token"]["name"], "state": json.loads(body),
                                           "slice_addresses": addresses, "prune_outputs": False})


def test_a_reservation_outside_the_scopes_is_refused_with_the_envelope_audited_and_nothing_written(
        api, seeded, clean_db):  # type: ignore[no-untyped-def]
    pay = api.token("pay", scopes=["module.payments.*:write", "output.payments_url:write",
                                   "terraform_data.shared:read"])
    before = rows(clean_db)
    refused = _open(pay, ('module.payments["eu"].*', "write"), ("terraform_data.shared", "write"))
    assert refused.status_code == 403
    assert refused.json() == {
        "ok": False, "code": "address_scope", "status": 403, "glob": "terraform_data.shared", "mode": "write",
        "nearest_scope": "terraform_data.shared:read", "state": "main", "error": refused.json()["error"]}
    assert "kl tokens scopes" in refused.json()["error"]
    assert rows(clean_db) == before
    audited = events(seeded, "address_scope_refused")
    assert [(e["actor"], e["detail"]["glob"], e["detail"]["mode"]) for e in audited] == [
        ("pay", "terraform_data.shared", "write")]
    # Acquiring more is checked the same way.
    opened = _open(pay, ('module.payments["eu"].*', "write"), ("terraform_data.shared", "read"))
    assert opened.status_code == 201, opened.text
    run_id = opened.json()["run"]["id"]
    more = requests.post(f"{api.url}/v1/engine/runs/{run_id}/reservations", headers=pay["headers"], timeout=10,
                         json={"holder": "pay", "reservations": [{"glob": "terraform_data.search.*", "mode": "read"}]})
    assert more.status_code == 403 and more.json()["glob"] == "terraform_data.search.*"
    # Another team's token cannot end this run: its write scopes do not cover the run's globs.
    search = api.token("search", scopes=["terraform_data.search.*:write"])
    ended = requests.post(f"{api.url}/v1/engine/runs/{run_id}/abort", headers=search["headers"], timeout=10, json={})
    assert ended.status_code == 403 and ended.json()["code"] == "address_scope"
    assert requests.get(f"{api.url}/v1/engine/runs/{run_id}", headers=pay["headers"],
                        timeout=10).json()["run"]["status"] == "reserved"


def test_a_commit_writing_an_output_or_address_it_does_not_own_is_refused(api, seeded, clean_db):  # type: ignore[no-untyped-def]
    pay = api.token("pay", scopes=["module.payments.*:write", "output.payments_url:write", "*:read"])
    opened = _open(pay, ("module.payments.*", "write"), ("output.payments_url", "write"))
    run_id = opened.json()["run"]["id"]
    before = rows(clean_db)
    # search_ids is no output of this token: refused for its scopes before the reservation check says more.
    changed = json.loads(trunk(2, svc="s2"))
    changed["outputs"]["search_ids"]["value"] = "b c"
    refused = _commit(pay, run_id, json.dumps(changed).encode(), [])
    assert refused.status_code == 403 and refused.json()["glob"] == "output.search_ids", refused.text
    assert rows(clean_db) == before
    # Even a reservation that covers more does not let the token write outside its scopes: narrow the scopes
    # after the grant, and the commit of a payments instance is refused too.
    url = f"{api.url}/v1/api/tenants/acme/tokens/{pay['token']['id']}/scopes"
    requests.put(url, json={"scopes": ['module.payments["us"].*:write', "*:read"]}, headers=CTL, timeout=10)
    refused = _commit(pay, run_id, trunk(2, svc="s2"), [])
    assert refused.status_code == 403, refused.text
    assert refused.json()["glob"] == 'module.payments["eu"].terraform_data.svc'
    assert refused.json()["nearest_scope"] == "*:read"  # it covers the address, in a lower mode
    assert rows(clean_db) == before
    requests.put(url, json={"scopes": ["module.payments.*:write", "output.payments_url:write", "*:read"]},
                 headers=CTL, timeout=10)
    done = _commit(pay, run_id, trunk(2, svc="s2"), [])
    assert done.status_code == 200 and done.json()["commit"]["serial"] == 2, done.text


def test_reads_show_only_covered_addresses_and_whole_state_calls_need_everything(api, seeded):  # type: ignore[no-untyped-def]
    search = api.token("search", scopes=["terraform_data.search.*:write", "output.search_ids:read"])
    h = search["headers"]
    listed = requests.get(f"{search['engine']}/resources", headers=h, timeout=10).json()["resources"]
    assert [r["address"] for r in listed] == ["terraform_data.search[0]", "terraform_data.search[1]"]
    sliced = requests.post(f"{search['engine']}/slice", json={"globs": ["*"]}, headers=h, timeout=10).json()
    assert list(sliced["outputs"]) == ["search_ids"] and [r["name"] for r in sliced["resources"]] == ["search"]
    for method, url in (("GET", search["backend"]), ("LOCK", search["backend"]), ("POST", search["backend"]),
                        ("DELETE", search["backend"]), ("GET", f"{search['engine']}/assembled")):
        answer = requests.request(method, url, headers=h, data=trunk(5) if method == "POST" else b"", timeout=10)
        assert answer.status_code == 403, (method, url, answer.text)
    history = requests.get(f"{search['engine']}/history", params={"address": "terraform_data.shared"}, headers=h,
                           timeout=10)
    assert history.status_code == 403 and history.json()["code"] == "address_scope"
    assert requests.get(f"{search['engine']}/history", params={"address": "terraform_data.search[0]"}, headers=h,
                        timeout=10).status_code == 200
    # Blame over everything names only the covered addresses, and the token that wrote them.
    blamed = requests.get(f"{search['engine']}/history", params={"glob": "*"}, headers=h, timeout=10).json()
    assert [i["address"] for i in blamed["instances"]] == ["terraform_data.search[0]", "terraform_data.search[1]"]
    assert {c["by"]["token"] for i in blamed["instances"] for c in i["changes"]} == {"admin"}
    outside = requests.get(f"{search['engine']}/history", params={"glob": "terraform_data.shared"}, headers=h,
                           timeout=10)
    assert outside.status_code == 403 and outside.json()["code"] == "address_scope"
    # The drift report shows only the drifted addresses the token may read, and it may record only its own.
    admin_drift = {"source": "drift", "globs": ["*"], "checked": 5, "serial": 1, "drifted": [
        {"address": "terraform_data.shared", "attributes": ["input"], "gone": False},
        {"address": "terraform_data.search[1]", "attributes": ["input"], "gone": False}]}
    assert requests.post(f"{seeded['engine']}/drift", json=admin_drift, headers=seeded["headers"],
                         timeout=10).status_code == 201
    report = requests.get(f"{search['engine']}/drift", headers=h, timeout=10).json()
    assert [d["address"] for d in report["drifted"]] == ["terraform_data.search[1]"] and report["globs"] == []
    assert requests.post(f"{search['engine']}/drift", json=admin_drift, headers=h, timeout=10).status_code == 403
    seen = requests.get(f"{search['engine']}/events", params={"limit": 1000}, headers=h, timeout=10).json()["events"]
    assert seen and not any("terraform_data.shared" in json.dumps(e["detail"]) for e in seen)
    # Reservations: a scoped token sees those whose globs meet its read scopes (what can block it), no others.
    other = _open(seeded, ("terraform_data.shared", "write"), ("module.payments.*", "read"))
    near = _open(seeded, ("terraform_data.search[0]", "read"))
    assert (other.status_code, near.status_code) == (201, 201), other.text + near.text
    listing = requests.get(f"{api.url}/v1/engine/reservations", headers=h, timeout=10).json()["reservations"]
    assert [r["glob"] for r in listing] == ["terraform_data.search[0]"]
    assert len(requests.get(f"{api.url}/v1/engine/reservations", headers=seeded["headers"],
                            timeout=10).json()["reservations"]) == 3
    run = requests.get(f"{api.url}/v1/engine/runs/{other.json()['run']['id']}", headers=h, timeout=10).json()
    assert run["reservations"] == []
