"""The dry commit (/v1/engine/runs/RUN/dry-commit): the commit's own refusals for a plan's changes, given
before Terraform applies anything, changing no row; and an abort of an applying run that keeps its
reservations until its client closes it."""

from __future__ import annotations

import psycopg

from tests.app.test_commit import STATE, commit, open_run, result_state, trunk


def rows(url: str) -> tuple[object, ...]:
    """Every row a dry commit could touch."""
    with psycopg.connect(url) as conn:
        return tuple(conn.execute(query).fetchall() for query in (
            "SELECT current_serial, head_version_id, lock_id FROM states ORDER BY id",
            "SELECT id, address, create_serial, delete_serial FROM resources ORDER BY id",
            "SELECT id, serial FROM state_versions ORDER BY id",
            "SELECT id, status, finished_at, error_summary FROM apply_runs ORDER BY id",
            "SELECT id, glob, mode, expires_at FROM resource_reservations ORDER BY id",
            "SELECT count(*) FROM events",
        ))


def dry(client, run_id: str, holder: str = "alice", addresses=(), outputs=()):  # type: ignore[no-untyped-def]
    return client.post(f"/v1/engine/runs/{run_id}/dry-commit",
                       json={"holder": holder, "addresses": list(addresses), "outputs": list(outputs)})


def test_a_plan_inside_its_reservations_passes_and_nothing_changes(client, clean_db):
    client.post(STATE, data=trunk())
    run_id = open_run(client, "alice", ("terraform_data.item[1]", "write"), ("output.greeting", "write"),
                      ("terraform_data.item[0]", "read")).get_json()["run"]["id"]
    before = rows(clean_db)
    answer = dry(client, run_id, addresses=["terraform_data.item[1]", "data.terraform_remote_state.x"],
                 outputs=["greeting"])
    assert answer.status_code == 200, answer.get_json()
    # An unreserved data source is a read, as in the commit.
    assert answer.get_json()["dry_commit"] == {"run_id": run_id, "base_serial": 1, "head_serial": 1,
                                               "addresses": ["terraform_data.item[1]"], "outputs": ["greeting"]}
    assert rows(clean_db) == before
    assert commit(client, run_id, "alice", result_state(**{"1": "B"})).status_code == 200


def test_planned_writes_and_outputs_outside_the_reservations_are_refused_as_the_commit_refuses_them(
        client, clean_db):
    client.post(STATE, data=trunk())
    run_id = open_run(client, "alice", ("terraform_data.item[1]", "write"),
                      ("terraform_data.item[0]", "read")).get_json()["run"]["id"]
    before = rows(clean_db)
    answer = dry(client, run_id, addresses=["terraform_data.item[1]", "terraform_data.item[0]",
                                            "module.web.terraform_data.x"], outputs=["greeting"])
    assert answer.status_code == 409
    body = answer.get_json()
    assert body["code"] == "write_outside_reservation"
    assert body["addresses"] == ["module.web.terraform_data.x", "terraform_data.item[0]", "output.greeting"]
    # The same rule, the same answer: what the commit of that change says.
    doc = result_state(**{"1": "B", "0": "A"}, )
    doc["resources"] = [r for r in doc["resources"] if r.get("module") != "module.web"]
    doc["outputs"] = {"greeting": {"value": "bye", "type": "string"}}
    committed = commit(client, run_id, "alice", doc).get_json()
    assert (committed["code"], committed["addresses"]) == (body["code"], body["addresses"])
    assert rows(clean_db) == before


def test_a_stale_base_is_refused_before_apply(client, clean_db):
    client.post(STATE, data=trunk())
    a = open_run(client, "alice", ("terraform_data.item[1]", "write")).get_json()["run"]["id"]
    b = open_run(client, "bob", ("terraform_data.item[0]", "write")).get_json()["run"]["id"]
    assert commit(client, b, "bob", result_state(**{"0": "B0"})).status_code == 200
    more = client.post(f"/v1/engine/runs/{a}/reservations",
                       json={"holder": "alice", "reservations": [{"glob": "terraform_data.item[0]", "mode": "read"}]})
    assert more.status_code == 200
    before = rows(clean_db)
    answer = dry(client, a, addresses=["terraform_data.item[1]"])
    assert answer.status_code == 409 and answer.get_json()["code"] == "stale_plan"
    assert answer.get_json()["stale"] == [{"address": "terraform_data.item[0]", "serial": 2}]
    assert rows(clean_db) == before


def test_closed_runs_other_holders_and_malformed_bodies_are_refused(client, clean_db):
    client.post(STATE, data=trunk())
    run_id = open_run(client, "alice", ("terraform_data.item[1]", "write")).get_json()["run"]["id"]
    assert dry(client, run_id, holder="mallory").status_code == 403
    for bad in ({"holder": "alice", "addresses": "all"}, {"holder": "alice", "addresses": [1]},
                {"holder": "alice", "addresses": ["not an address!"]},
                {"holder": "alice", "outputs": ["no such-name!"]}, {"addresses": []}):
        answer = client.post(f"/v1/engine/runs/{run_id}/dry-commit", json=bad)
        assert answer.status_code == 400, (bad, answer.get_json())
        assert answer.get_json()["ok"] is False
    assert client.post("/v1/engine/runs/ar_nope/dry-commit", json={"holder": "alice"}).status_code == 404
    client.post(f"/v1/engine/runs/{run_id}/abort", json={"reason": "test"})
    before = rows(clean_db)
    answer = dry(client, run_id, addresses=["terraform_data.item[1]"])
    assert answer.status_code == 409 and answer.get_json()["code"] == "run_closed"
    assert rows(clean_db) == before


def test_aborting_an_applying_run_keeps_its_reservations_until_its_client_closes_it(client, clean_db):
    client.post(STATE, data=trunk())
    run_id = open_run(client, "alice", ("terraform_data.item[1]", "write")).get_json()["run"]["id"]
    assert client.post(f"/v1/engine/runs/{run_id}/running", json={"holder": "alice"}).status_code == 200
    answer = client.post(f"/v1/engine/runs/{run_id}/abort", json={"reason": "stop it"})
    assert answer.status_code == 200
    assert answer.get_json()["run"]["status"] == "aborting"
    assert [r["glob"] for r in answer.get_json()["reservations"]] == ["terraform_data.item[1]"]
    # Another run cannot take the addresses while Terraform may still be changing them.
    assert open_run(client, "bob", ("terraform_data.item[1]", "write")).status_code == 409
    # The client may renew and sees the status; it may not start applying again.
    renewed = client.post(f"/v1/engine/runs/{run_id}/renew", json={"holder": "alice"})
    assert renewed.status_code == 200 and renewed.get_json()["run"]["status"] == "aborting"
    assert client.post(f"/v1/engine/runs/{run_id}/running", json={"holder": "alice"}).status_code == 409
    closed = client.post(f"/v1/engine/runs/{run_id}/close", json={"holder": "alice", "status": "aborted"})
    assert closed.status_code == 200 and closed.get_json()["run"]["status"] == "aborted"
    assert closed.get_json()["reservations"] == []
    assert open_run(client, "bob", ("terraform_data.item[1]", "write")).status_code == 201


def test_a_forced_abort_and_an_abort_before_applying_release_at_once(client):
    client.post(STATE, data=trunk())
    waiting = open_run(client, "alice", ("terraform_data.item[1]", "write")).get_json()["run"]["id"]
    answer = client.post(f"/v1/engine/runs/{waiting}/abort", json={})
    assert answer.get_json()["run"]["status"] == "aborted" and answer.get_json()["reservations"] == []
    applying = open_run(client, "alice", ("terraform_data.item[1]", "write")).get_json()["run"]["id"]
    client.post(f"/v1/engine/runs/{applying}/running", json={"holder": "alice"})
    assert client.post(f"/v1/engine/runs/{applying}/abort", json={"force": "yes"}).status_code == 400
    forced = client.post(f"/v1/engine/runs/{applying}/abort", json={"force": True})
    assert forced.get_json()["run"]["status"] == "aborted" and forced.get_json()["reservations"] == []
