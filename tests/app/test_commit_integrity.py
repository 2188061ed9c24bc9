"""Commit integrity against a hostile or careless client: parsed addresses only, root outputs under
reservations, no lost update on an output, and a refused commit writes nothing."""

from __future__ import annotations

import json

from analyzer.globs import parse_glob
from analyzer.state import OutputRow
from app.domain import commit as rules
from tests.app.test_commit import STATE, commit, open_run, result_state, snapshot, trunk
from tests.helpers import instance, resource

# --- pure rules --------------------------------------------------------------------------------------


def _out(name: str, value: object, sensitive: bool = False) -> OutputRow:
    return OutputRow(name=name, value_json=json.dumps(value), type_json='"string"', sensitive=sensitive)


def test_data_sources_are_told_by_their_parsed_mode_never_by_a_substring() -> None:
    skip = rules.unreserved_read(rules.parse_globs(["terraform_data.a"]))
    assert skip("data.terraform_remote_state.x")
    assert skip('module.m["k"].data.aws_ami.y[0]')
    assert not skip("module.data.terraform_data.q")
    assert not skip('terraform_data.n["bucket.data.eu"]')
    assert not skip("module.x.module.data.terraform_data.q")
    covered = rules.unreserved_read(rules.parse_globs(["data.aws_ami.y.*"]))
    assert not covered("data.aws_ami.y")


def test_outside_reports_managed_resources_with_data_in_their_names() -> None:
    globs = rules.parse_globs(["terraform_data.a"])
    found = rules.outside(["terraform_data.a", "module.data.terraform_data.q", 'terraform_data.n["bucket.data.eu"]'],
                          globs)
    assert found == ["module.data.terraform_data.q", 'terraform_data.n["bucket.data.eu"]']


def test_changed_outputs_are_the_added_changed_and_pruned_ones() -> None:
    base = [_out("o1", "a"), _out("o2", "b"), _out("gone", "x")]
    result = [_out("o1", "a"), _out("o2", "B"), _out("new", 1)]
    assert rules.changed_outputs(base, result) == ["gone", "new", "o2"]
    assert rules.changed_outputs(base, result, prune=False) == ["new", "o2"]
    assert rules.changed_outputs(base, [_out("o1", "a", sensitive=True)], prune=False) == ["o1"]


def test_outputs_outside_needs_output_name_output_star_or_everything() -> None:
    names = ["o1", "o2"]
    assert rules.outputs_outside(names, rules.parse_globs(["terraform_data.a", "module.o1.*"])) == ["o1", "o2"]
    assert rules.outputs_outside(names, rules.parse_globs(["output.o1"])) == ["o2"]
    assert rules.outputs_outside(names, rules.parse_globs(["output.*"])) == []
    assert rules.outputs_outside(names, rules.parse_globs(["*"])) == []


def test_stale_outputs_are_reserved_outputs_whose_trunk_value_moved() -> None:
    base = [_out("o1", "a"), _out("o2", "b"), _out("o3", "c")]
    head = [_out("o1", "A"), _out("o2", "b"), _out("o4", "d")]
    assert rules.stale_outputs(base, head, [parse_glob("output.*")]) == ["o1", "o3", "o4"]
    assert rules.stale_outputs(base, head, [parse_glob("output.o2")]) == []
    assert rules.stale_outputs(base, head, [parse_glob("output.o1"), parse_glob("terraform_data.a")]) == ["o1"]
    assert rules.stale_outputs(base, head, [parse_glob("terraform_data.a")]) == []
    assert rules.stale_outputs(base, head, [parse_glob("*")]) == ["o1", "o3", "o4"]


def test_stale_rows_match_parsed_addresses() -> None:
    changed = [("module.data.terraform_data.q", 3), ("data.x.y", 4), ("terraform_data.a[0]", 5)]
    assert rules.stale(changed, rules.parse_globs(["terraform_data.a.*"])) == [("terraform_data.a[0]", 5)]
    assert rules.stale(changed, rules.parse_globs(["module.data.*"])) == [("module.data.terraform_data.q", 3)]


# --- the attacks, through the engine lane ----------------------------------------------------------


def test_a_managed_resource_named_like_a_data_source_outside_the_write_globs_is_refused_not_dropped(
    client, clean_db
):  # type: ignore[no-untyped-def]
    client.post(STATE, data=trunk())
    before = snapshot(clean_db)
    run_id = open_run(client, "alice", ("terraform_data.item[1]", "write")).get_json()["run"]["id"]
    for extra, address in (
        (resource("q", [instance(None, "orphan")], module="module.data"), "module.data.terraform_data.q"),
        (resource("n", [instance("bucket.data.eu", "orphan")]), 'terraform_data.n["bucket.data.eu"]'),
    ):
        doc = result_state(**{"1": "B"})
        doc["resources"].append(extra)
        answer = commit(client, run_id, "alice", doc)
        assert answer.status_code == 409, answer.get_json()
        body = answer.get_json()
        assert body["code"] == "write_outside_reservation"
        assert address in body["addresses"]
        assert address in body["error"]
        assert snapshot(clean_db) == before
    assert commit(client, run_id, "alice", result_state(**{"1": "B"})).status_code == 200


def test_a_run_reserving_one_resource_cannot_overwrite_or_delete_root_outputs(client, clean_db):  # type: ignore[no-untyped-def]
    doc = json.loads(trunk())
    doc["outputs"]["secret"] = {"value": "s3cr3t", "type": "string", "sensitive": True}
    client.post(STATE, data=json.dumps(doc).encode())
    before = snapshot(clean_db)
    run_id = open_run(client, "alice", ("terraform_data.item[0]", "write")).get_json()["run"]["id"]
    overwrite = result_state(**{"0": "A"})
    overwrite["outputs"] = {"greeting": {"value": "pwned", "type": "string"},
                            "secret": {"value": "s3cr3t", "type": "string", "sensitive": True}}
    answer = commit(client, run_id, "alice", overwrite)
    assert answer.status_code == 409 and answer.get_json()["addresses"] == ["output.greeting"]
    assert "output.greeting" in answer.get_json()["error"] and "output.NAME" in answer.get_json()["error"]
    delete = result_state(**{"0": "A"})  # no "secret" output: a whole-configuration apply removed it
    answer = commit(client, run_id, "alice", delete)
    assert answer.status_code == 409 and answer.get_json()["addresses"] == ["output.secret"]
    assert snapshot(clean_db) == before
    assert json.loads(client.get(STATE).data)["outputs"]["greeting"]["value"] == "hello"
    # Unchanged outputs need no reservation.
    same = result_state(**{"0": "A"})
    same["outputs"]["secret"] = doc["outputs"]["secret"]
    assert commit(client, run_id, "alice", same).status_code == 200


def test_two_disjoint_runs_changing_the_same_output_the_second_is_stale(client, clean_db):  # type: ignore[no-untyped-def]
    client.post(STATE, data=trunk())
    a = open_run(client, "alice", ("terraform_data.item[0]", "write"), ("output.greeting", "write"))
    assert a.status_code == 201, a.get_json()
    b = open_run(client, "bob", ("terraform_data.item[2]", "write"), ("output.greeting", "write"))
    assert b.status_code == 409 and b.get_json()["conflicts"][0]["glob"] == "output.greeting"
    # Two runs that reserve the output one after the other, both from serial 1:
    doc_a = result_state(**{"0": "A"})
    doc_a["outputs"]["greeting"]["value"] = "from alice"
    assert commit(client, a.get_json()["run"]["id"], "alice", doc_a).status_code == 200
    b = open_run(client, "bob", ("terraform_data.item[2]", "write"), ("output.*", "write"))
    assert b.status_code == 409 and b.get_json()["code"] == "stale_plan", b.get_json()
    assert "output.greeting" in b.get_json()["error"]
    # Opened before alice committed, bob's run only finds out at its commit:
    client.post(STATE, data=trunk(3))
    c = open_run(client, "carol", ("terraform_data.item[2]", "write"), ("output.greeting", "write"), base=3)
    d = open_run(client, "dave", ("terraform_data.item[1]", "write"), ("terraform_data.item[0]", "read"), base=3)
    doc_d = result_state(**{"1": "D"})
    doc_d["outputs"]["greeting"]["value"] = "hello"  # unchanged relative to base 3
    assert commit(client, d.get_json()["run"]["id"], "dave", doc_d).status_code == 200
    before = snapshot(clean_db)
    client_doc = json.loads(trunk(4))
    client_doc["outputs"]["greeting"]["value"] = "moved by terraform"
    assert client.post(STATE, data=json.dumps(client_doc).encode()).status_code == 423  # reservations block it
    assert snapshot(clean_db) == before
    doc_c = result_state(**{"2": "C"})
    doc_c["outputs"]["greeting"]["value"] = "from carol"
    assert commit(client, c.get_json()["run"]["id"], "carol", doc_c).status_code == 200


def test_an_output_changed_after_the_base_serial_makes_the_commit_stale(client, clean_db):  # type: ignore[no-untyped-def]
    client.post(STATE, data=trunk())
    a = open_run(client, "alice", ("terraform_data.item[0]", "write"), ("output.greeting", "write"))
    a_id = a.get_json()["run"]["id"]
    # A run holding output.greeting excludes everyone else; so the trunk moves through its own
    # earlier commit of a second run from the same base that held the output first.
    assert client.post(f"/v1/engine/runs/{a_id}/release", json={"holder": "alice", "globs": ["output.greeting"]}
                       ).status_code == 200
    b = open_run(client, "bob", ("terraform_data.item[2]", "write"), ("output.greeting", "write"))
    doc_b = result_state(**{"2": "C"})
    doc_b["outputs"]["greeting"]["value"] = "from bob"
    assert commit(client, b.get_json()["run"]["id"], "bob", doc_b).status_code == 200
    more = client.post(f"/v1/engine/runs/{a_id}/reservations",
                       json={"holder": "alice", "reservations": [{"glob": "output.greeting", "mode": "write"}]})
    assert more.status_code == 200, more.get_json()
    before = snapshot(clean_db)
    doc_a = result_state(**{"0": "A"})
    doc_a["outputs"]["greeting"]["value"] = "from alice"
    answer = commit(client, a_id, "alice", doc_a)
    assert answer.status_code == 409 and answer.get_json()["code"] == "stale_plan", answer.get_json()
    assert {"address": "output.greeting", "serial": None} in answer.get_json()["stale"]
    assert snapshot(clean_db) == before
    assert json.loads(client.get(STATE).data)["outputs"]["greeting"]["value"] == "from bob"


def test_terraforms_lock_covers_outputs(client):  # type: ignore[no-untyped-def]
    from tests.helpers import lock_info

    client.post(STATE, data=trunk())
    run = open_run(client, "alice", ("output.greeting", "write"))
    assert run.status_code == 201
    assert client.open(STATE, method="LOCK", data=lock_info("tf-1")).status_code == 423
    client.post(f"/v1/engine/runs/{run.get_json()['run']['id']}/close", json={"holder": "alice", "status": "aborted"})
    assert client.open(STATE, method="LOCK", data=lock_info("tf-1")).status_code == 200
    blocked = open_run(client, "bob", ("output.*", "read"))
    assert blocked.status_code == 409 and blocked.get_json()["conflicts"][0]["glob"] == "*"


def test_a_slice_address_that_is_not_an_address_is_400(client, clean_db):  # type: ignore[no-untyped-def]
    client.post(STATE, data=trunk())
    run_id = open_run(client, "alice", ("terraform_data.item[1]", "write")).get_json()["run"]["id"]
    before = snapshot(clean_db)
    answer = commit(client, run_id, "alice", result_state(), slice_addresses=["module.web"])
    assert answer.status_code == 400 and "slice_addresses" in answer.get_json()["error"]
    assert snapshot(clean_db) == before
