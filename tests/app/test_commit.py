"""Row-level commit through the engine lane, including a hostile client: the server re-checks
reservations, the write set and staleness, and a refused commit writes nothing."""

from __future__ import annotations

import json
import threading
import time

import psycopg
import requests

from analyzer.state import ParsedState, parse_state
from tests.helpers import counted_state, instance, resource, state

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


def _between_reads_and_lock(monkeypatch, action):  # type: ignore[no-untyped-def]
    """Run ``action(principal)`` once, in the commit's request, after its unlocked reads and just before it
    takes the state's row lock: what a concurrent writer landing in that gap does."""
    from app.store import commit as commit_store

    original = commit_store.read_locked
    fired: list[bool] = []

    def read_locked(conn, principal, run_id, before):  # type: ignore[no-untyped-def]
        if not fired:
            fired.append(True)
            action(principal)
        return original(conn, principal, run_id, before)

    monkeypatch.setattr(commit_store, "read_locked", read_locked)
    return fired


def test_a_commit_landing_before_the_lock_moves_the_serial_and_its_outputs_are_kept(app, client, monkeypatch):
    from app.store import commit as commit_store

    client.post(STATE, data=trunk())
    a = open_run(client, "alice", ("terraform_data.item[0]", "write")).get_json()["run"]["id"]
    b = open_run(client, "bob", ("terraform_data.item[2]", "write"),
                 ("output.greeting", "write")).get_json()["run"]["id"]
    db = app.extensions["kilolock"].db
    doc_b = result_state(**{"2": "C"})
    doc_b["outputs"] = {"greeting": {"value": "hello from bob", "type": "string"}}
    addresses = ["terraform_data.item[2]"]

    def bob_commits(principal) -> None:  # type: ignore[no-untyped-def]
        done = commit_store.commit_run(db, principal, b, holder="bob", state_body=json.dumps(doc_b).encode(),
                                       slice_addresses=addresses)
        assert done.serial == 2

    fired = _between_reads_and_lock(monkeypatch, bob_commits)
    answer = commit(client, a, "alice", result_state(**{"0": "A"}))
    assert fired and answer.status_code == 200, answer.get_json()
    assert answer.get_json()["commit"]["serial"] == 3
    assert values(client) == {"terraform_data.item[0]": "A", "terraform_data.item[1]": "b",
                              "terraform_data.item[2]": "C", "module.web.terraform_data.x": "web"}
    head = json.loads(client.get(STATE).data)
    assert head["serial"] == 3 and head["outputs"] == {"greeting": {"value": "hello from bob", "type": "string"}}


def test_a_reservation_released_before_the_lock_is_not_written(app, client, clean_db, monkeypatch):
    from app.store import runs as runs_store

    client.post(STATE, data=trunk())
    run_id = open_run(client, "alice", ("terraform_data.item[0]", "write"),
                      ("terraform_data.item[1]", "write")).get_json()["run"]["id"]
    db = app.extensions["kilolock"].db
    before = snapshot(clean_db)

    def release_item_1(principal) -> None:  # type: ignore[no-untyped-def]
        runs_store.release(db, principal, run_id, holder="alice", globs=["terraform_data.item[1]"])

    fired = _between_reads_and_lock(monkeypatch, release_item_1)
    answer = commit(client, run_id, "alice", result_state(**{"0": "A", "1": "B"}))
    assert fired and answer.status_code == 409, answer.get_json()
    assert answer.get_json()["code"] == "write_outside_reservation"
    assert answer.get_json()["addresses"] == ["terraform_data.item[1]"]
    assert snapshot(clean_db) == before


def test_a_lease_reclaimed_before_the_lock_refuses_the_commit(app, client, clean_db, monkeypatch):
    client.post(STATE, data=trunk())
    run_id = open_run(client, "alice", ("terraform_data.item[1]", "write")).get_json()["run"]["id"]
    before = snapshot(clean_db)

    def lapse(principal) -> None:  # type: ignore[no-untyped-def]
        with psycopg.connect(clean_db, autocommit=True) as conn:
            conn.execute("UPDATE resource_reservations SET expires_at = now() - interval '1 second'")

    fired = _between_reads_and_lock(monkeypatch, lapse)
    answer = commit(client, run_id, "alice", result_state(**{"1": "late"}))
    assert fired and answer.status_code == 409 and answer.get_json()["code"] == "lease_expired"
    assert snapshot(clean_db) == before
    assert client.get(f"/v1/engine/runs/{run_id}").get_json()["run"]["status"] == "expired"


def test_committers_racing_on_one_state_land_at_consecutive_serials_and_every_get_is_whole(live_server):
    count, racers = 40, 8
    http = requests.Session()
    url = live_server.state_url("race")
    assert http.post(url, data=counted_state(1, count), timeout=60).status_code == 200
    runs_url = f"{live_server.url}/v1/engine/states/race/runs"
    opened = []
    for k in range(racers):
        answer = http.post(runs_url, timeout=60, json={
            "actor": f"dev{k}", "base_serial": 1,
            "reservations": [{"glob": f"terraform_data.item[{k}]", "mode": "write"}]})
        assert answer.status_code == 201, answer.json()
        opened.append(answer.json()["run"]["id"])
    start = threading.Barrier(racers + 1)
    serials: list[int] = []
    problems: list[str] = []

    def racer(k: int) -> None:
        doc = json.loads(counted_state(1, 1))
        doc["resources"][0]["instances"][0]["index_key"] = k
        doc["resources"][0]["instances"][0]["attributes"]["input"]["value"] = f"r-{k}"
        session = requests.Session()
        start.wait()
        answer = session.post(f"{live_server.url}/v1/engine/runs/{opened[k]}/commit", timeout=60, json={
            "holder": f"dev{k}", "state": doc, "slice_addresses": [f"terraform_data.item[{k}]"]})
        if answer.status_code != 200:
            problems.append(f"racer {k}: {answer.status_code} {answer.text[:200]}")
        else:
            serials.append(int(answer.json()["commit"]["serial"]))

    def reader() -> None:
        session = requests.Session()
        start.wait()
        while len(serials) + len(problems) < racers:
            parsed = parse_state(session.get(url, timeout=60).content)
            assert isinstance(parsed, ParsedState)
            changed = sum(json.loads(i.instance_json)["attributes"]["input"]["value"].startswith("r-")
                          for i in parsed.instances)
            if changed != parsed.serial - 1 or len(parsed.instances) != count:
                problems.append(f"serial {parsed.serial} holds {changed} commits of {len(parsed.instances)} rows")

    threads = [threading.Thread(target=racer, args=(k,)) for k in range(racers)] + [threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not problems, problems[:5]
    assert sorted(serials) == list(range(2, racers + 2))
    parsed = parse_state(http.get(url, timeout=60).content)
    assert isinstance(parsed, ParsedState) and parsed.serial == racers + 1
    got = {i.address: json.loads(i.instance_json)["attributes"]["input"]["value"] for i in parsed.instances}
    assert all(got[f"terraform_data.item[{k}]"] == f"r-{k}" for k in range(racers))
