"""Row-level commit through the engine lane, including a hostile client: the server re-checks
reservations, the write set and staleness, and a refused commit writes nothing."""

from __future__ import annotations

import json
import time

import psycopg

from analyzer.state import ParsedState, parse_state
from tests.helpers import instance, resource, state

STATE = "/v1/states/trunk"


def trunk(serial: int = 1, **values: str) -> bytes:
    vals = {"0": "a", "1": "b", "2": "c", **values}
    return state(serial, [
        resource("item", [instance(int(k), v) for k, v in sorted(vals.items())]),
        resource("x", [instance(None, "web")], module="module.web"),
    ], outputs={"greeting": {"value": "hello", "type": "string"}})


def result_state(**values: str) -> dict:  # type: ignore[type-arg]
    """What a sliced apply leaves behind: the whole slice, re-serialised with other key order."""
    doc = json.loads(trunk(1, **values))
    for res in doc["resources"]:
        res["instances"] = [dict(reversed(list(i.items()))) for i in res["instances"]]
    return doc


def open_run(client, actor: str, *globs: tuple[str, str], base: int = 1, **extra):  # type: ignore[no-untyped-def]
    response = client.post("/v1/engine/states/trunk/runs", json={
        "actor": actor, "base_serial": base, "reservations": [{"glob": g, "mode": m} for g, m in globs], **extra})
    return response


def commit(client, run_id: str, holder: str, doc: dict, slice_addresses=None):  # type: ignore[no-untyped-def]
    addresses = slice_addresses if slice_addresses is not None else [
        "terraform_data.item[0]", "terraform_data.item[1]", "terraform_data.item[2]", "module.web.terraform_data.x"]
    return client.post(f"/v1/engine/runs/{run_id}/commit",
                       json={"holder": holder, "state": doc, "slice_addresses": addresses})


def snapshot(url: str) -> tuple[object, ...]:
    with psycopg.connect(url) as conn:
        return (conn.execute("SELECT current_serial, head_version_id FROM states").fetchall(),
                conn.execute("SELECT id, address, create_serial, delete_serial FROM resources ORDER BY id").fetchall(),
                conn.execute("SELECT count(*) FROM state_versions").fetchone())


def values(client) -> dict[str, str]:  # type: ignore[no-untyped-def]
    parsed = parse_state(client.get(STATE).data)
    assert isinstance(parsed, ParsedState)
    return {i.address: json.loads(i.instance_json)["attributes"]["input"]["value"] for i in parsed.instances}


def test_a_commit_changes_only_the_write_set_and_lands_at_the_next_serial(client, clean_db):
    client.post(STATE, data=trunk())
    run = open_run(client, "alice", ("terraform_data.item[1]", "write"), ("terraform_data.item[0]", "read"))
    assert run.status_code == 201, run.get_json()
    run_id = run.get_json()["run"]["id"]
    answer = commit(client, run_id, "alice", result_state(**{"1": "B"}))
    assert answer.status_code == 200, answer.get_json()
    body = answer.get_json()
    assert body["commit"]["serial"] == 2 and body["commit"]["updated"] == 1
    assert body["commit"]["addresses"] == ["terraform_data.item[1]"]
    assert body["run"]["status"] == "committed" and body["run"]["committed_serial"] == 2
    assert body["reservations"] == []
    assert values(client)["terraform_data.item[1]"] == "B"
    with psycopg.connect(clean_db) as conn:
        changed = conn.execute("SELECT address, create_serial, delete_serial FROM resources "
                               "WHERE create_serial = 2 OR delete_serial = 2 ORDER BY 2").fetchall()
        source = conn.execute("SELECT source, actor FROM state_versions WHERE serial = 2").fetchone()
    assert changed == [("terraform_data.item[1]", 1, 2), ("terraform_data.item[1]", 2, None)]
    assert source == ("apply", "alice")
    head = json.loads(client.get(STATE).data)
    assert head["serial"] == 2 and head["lineage"] == json.loads(trunk())["lineage"]
    assert head["outputs"] == {"greeting": {"value": "hello", "type": "string"}}


def test_two_disjoint_runs_commit_in_either_order_without_touching_each_other(client):
    client.post(STATE, data=trunk())
    a = open_run(client, "alice", ("terraform_data.item[0]", "write")).get_json()["run"]["id"]
    b = open_run(client, "bob", ("terraform_data.item[2]", "write")).get_json()["run"]["id"]
    assert commit(client, b, "bob", result_state(**{"2": "C"})).get_json()["commit"]["serial"] == 2
    assert commit(client, a, "alice", result_state(**{"0": "A"})).get_json()["commit"]["serial"] == 3
    assert values(client) == {"terraform_data.item[0]": "A", "terraform_data.item[1]": "b",
                              "terraform_data.item[2]": "C", "module.web.terraform_data.x": "web"}


def test_a_commit_outside_the_write_globs_is_refused_naming_the_addresses(client, clean_db):
    client.post(STATE, data=trunk())
    run_id = open_run(client, "alice", ("terraform_data.item[1]", "write"),
                      ("terraform_data.item[0]", "read")).get_json()["run"]["id"]
    before = snapshot(clean_db)
    answer = commit(client, run_id, "alice", result_state(**{"1": "B", "0": "sneaky"}))
    assert answer.status_code == 409
    assert answer.get_json()["code"] == "write_outside_reservation"
    assert answer.get_json()["addresses"] == ["terraform_data.item[0]"]
    assert snapshot(clean_db) == before
    assert client.get(f"/v1/engine/runs/{run_id}").get_json()["run"]["status"] == "reserved"


def test_a_destroy_outside_the_write_globs_is_refused_too(client, clean_db):
    client.post(STATE, data=trunk())
    run_id = open_run(client, "alice", ("terraform_data.item[1]", "write")).get_json()["run"]["id"]
    doc = result_state()
    doc["resources"] = [r for r in doc["resources"] if r.get("module") != "module.web"]
    answer = commit(client, run_id, "alice", doc)
    assert answer.status_code == 409 and answer.get_json()["addresses"] == ["module.web.terraform_data.x"]


def test_a_commit_after_the_lease_expired_is_refused(client, clean_db):
    client.post(STATE, data=trunk())
    run_id = open_run(client, "alice", ("terraform_data.item[1]", "write"), lease_seconds=1).get_json()["run"]["id"]
    before = snapshot(clean_db)
    time.sleep(1.2)
    answer = commit(client, run_id, "alice", result_state(**{"1": "late"}))
    assert answer.status_code == 409 and answer.get_json()["code"] == "lease_expired"
    assert snapshot(clean_db) == before
    assert client.get(f"/v1/engine/runs/{run_id}").get_json()["run"]["status"] == "expired"


def test_a_commit_for_someone_elses_run_is_refused(client, clean_db):
    client.post(STATE, data=trunk())
    run_id = open_run(client, "alice", ("terraform_data.item[1]", "write")).get_json()["run"]["id"]
    before = snapshot(clean_db)
    answer = commit(client, run_id, "mallory", result_state(**{"1": "evil"}))
    assert answer.status_code == 403 and answer.get_json()["code"] == "not_run_holder"
    assert commit(client, "ar_0000000000000000", "alice", result_state()).status_code == 404
    assert snapshot(clean_db) == before


def test_a_plan_that_is_stale_at_open_is_refused_before_terraform_runs(client):
    client.post(STATE, data=trunk())
    client.post(STATE, data=trunk(2, **{"0": "changed by vanilla terraform"}))
    answer = open_run(client, "alice", ("terraform_data.item[1]", "write"), ("terraform_data.item[0]", "read"))
    assert answer.status_code == 409
    body = answer.get_json()
    assert body["code"] == "stale_plan" and "re-run kl plan" in body["error"]
    assert body["stale"] == [{"address": "terraform_data.item[0]", "serial": 2}]
    assert client.get("/v1/engine/runs").get_json()["runs"] == []
    assert open_run(client, "alice", ("terraform_data.item[1]", "write"), base=2).status_code == 201


def test_a_read_address_written_by_another_run_after_planning_makes_the_commit_stale(client, clean_db):
    client.post(STATE, data=trunk())
    a = open_run(client, "alice", ("terraform_data.item[1]", "write")).get_json()["run"]["id"]
    b = open_run(client, "bob", ("terraform_data.item[0]", "write")).get_json()["run"]["id"]
    assert commit(client, b, "bob", result_state(**{"0": "B0"})).status_code == 200
    more = client.post(f"/v1/engine/runs/{a}/reservations",
                       json={"holder": "alice", "reservations": [{"glob": "terraform_data.item[0]", "mode": "read"}]})
    assert more.status_code == 200
    before = snapshot(clean_db)
    answer = commit(client, a, "alice", result_state(**{"1": "A1"}))
    assert answer.status_code == 409 and answer.get_json()["code"] == "stale_plan"
    assert snapshot(clean_db) == before


def test_a_commit_with_no_changes_closes_the_run_without_a_new_version(client, clean_db):
    client.post(STATE, data=trunk())
    run_id = open_run(client, "alice", ("terraform_data.item[1]", "write")).get_json()["run"]["id"]
    answer = commit(client, run_id, "alice", result_state())
    assert answer.status_code == 200 and answer.get_json()["commit"]["serial"] is None
    assert answer.get_json()["run"]["status"] == "committed"
    assert snapshot(clean_db)[2] == (1,)


def test_outputs_the_apply_did_not_change_keep_the_trunks_value(client):
    client.post(STATE, data=trunk())
    a = open_run(client, "alice", ("terraform_data.item[0]", "write"),
                 ("output.count", "write")).get_json()["run"]["id"]
    b = open_run(client, "bob", ("terraform_data.item[2]", "write"),
                 ("output.greeting", "write")).get_json()["run"]["id"]
    doc_b = result_state(**{"2": "C"})
    doc_b["outputs"] = {"greeting": {"value": "hello from bob", "type": "string"}}
    assert commit(client, b, "bob", doc_b).get_json()["commit"]["outputs_changed"] == ["greeting"]
    doc_a = result_state(**{"0": "A"})
    doc_a["outputs"]["count"] = {"value": 3, "type": "number"}
    assert commit(client, a, "alice", doc_a).get_json()["commit"]["outputs_changed"] == ["count"]
    head = json.loads(client.get(STATE).data)
    assert head["outputs"] == {"count": {"value": 3, "type": "number"},
                               "greeting": {"value": "hello from bob", "type": "string"}}


def test_malformed_commits_are_400(client):
    client.post(STATE, data=trunk())
    run_id = open_run(client, "alice", ("terraform_data.item[1]", "write")).get_json()["run"]["id"]
    assert client.post(f"/v1/engine/runs/{run_id}/commit", json={"holder": "alice", "state": "x"}).status_code == 400
    bad = {"holder": "alice", "state": {"version": 3}, "slice_addresses": []}
    assert client.post(f"/v1/engine/runs/{run_id}/commit", json=bad).status_code == 400
    assert client.post(f"/v1/engine/runs/{run_id}/commit",
                       json={"holder": "alice", "state": result_state(), "slice_addresses": "all"}).status_code == 400


def test_a_re_read_data_source_is_kept_from_the_trunk_not_refused(client):
    body = json.loads(trunk())
    body["resources"].append({"mode": "data", "type": "terraform_remote_state", "name": "other",
                              "provider": 'provider["terraform.io/builtin/terraform"]',
                              "instances": [{"schema_version": 0, "attributes": {"outputs": {"v": 1}}}]})
    client.post(STATE, data=json.dumps(body).encode())
    run_id = open_run(client, "alice", ("terraform_data.item[1]", "write")).get_json()["run"]["id"]
    doc = result_state(**{"1": "B"})
    doc["resources"].append({**body["resources"][-1], "instances": [
        {"schema_version": 0, "attributes": {"outputs": {"v": 2}}}]})
    answer = commit(client, run_id, "alice", doc, slice_addresses=None)
    assert answer.status_code == 200, answer.get_json()
    assert answer.get_json()["commit"]["addresses"] == ["terraform_data.item[1]"]
    data = next(r for r in json.loads(client.get(STATE).data)["resources"] if r["mode"] == "data")
    assert data["instances"][0]["attributes"]["outputs"] == {"v": 1}
