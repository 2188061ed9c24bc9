"""Per-address history and blame through the engine lane: who wrote each change (Terraform POST, kl run),
the attribute names it changed (never values, sensitive ones only counted), globs and pagination."""

from __future__ import annotations

import json

from tests.app.test_commit import STATE, commit, open_run, result_state, trunk
from tests.helpers import instance, resource, state

READ = "/v1/engine/states/trunk/history"


def _secret_state(serial: int, password: str, size: str) -> bytes:
    inst = instance(None, "db", sensitive_attributes=[[{"type": "get_attr", "value": "input"}]])
    inst["attributes"]["input"] = {"value": password, "type": "string"}
    inst["attributes"]["output"] = {"value": size, "type": "string"}
    doc = json.loads(trunk(serial))
    doc["resources"].append(resource("db", [inst]))
    return json.dumps(doc).encode()


def test_blame_names_each_lane_and_the_changed_attribute_names(client, clean_db):
    assert client.post(STATE, data=_secret_state(1, "hunter2", "small")).status_code == 200
    assert client.post(STATE, data=_secret_state(2, "s3cret-π", "large")).status_code == 200
    run = open_run(client, "alice", ("terraform_data.item[1]", "write"), base=2,
                   info={"bot": {"repository": "acme/infra", "pull_request": 12, "merge_commit": "ab" * 20}})
    assert run.status_code == 201, run.get_json()
    run_id = run.get_json()["run"]["id"]
    doc = result_state(**{"1": "B"})
    doc["serial"] = 2
    assert commit(client, run_id, "alice", doc).status_code == 200

    body = client.get(READ + "?glob=terraform_data.*").get_json()
    assert body["ok"] and body["next_after"] is None
    by_address = {i["address"]: i for i in body["instances"]}
    assert sorted(by_address) == ["terraform_data.db", "terraform_data.item[0]", "terraform_data.item[1]",
                                  "terraform_data.item[2]"]
    db = by_address["terraform_data.db"]["changes"]
    assert [(c["kind"], c["serial"]) for c in db] == [("changed", 2), ("created", 1)]
    # output changed and is named; input is sensitive: counted, never named, and no value anywhere
    assert db[0]["attributes"] == ["output"] and db[0]["sensitive"] == 1
    assert db[0]["by"]["lane"] == "terraform" and db[0]["by"]["run_id"] is None
    raw = json.dumps(body)
    assert "hunter2" not in raw and "s3cret" not in raw and "large" not in raw

    item = by_address["terraform_data.item[1]"]["changes"]
    assert [(c["kind"], c["serial"]) for c in item] == [("changed", 3), ("created", 1)]
    top = item[0]
    assert sorted(top["attributes"]) == ["id", "input", "output"] and top["sensitive"] == 0
    assert top["by"]["run_id"] == run_id and top["by"]["actor"] == "alice" and top["by"]["lane"] == "bot apply"
    assert (top["by"]["repository"], top["by"]["pull_request"]) == ("acme/infra", 12)
    assert top["by"]["merge_commit"] == "ab" * 20
    unchanged = by_address["terraform_data.item[0]"]["changes"]
    assert [(c["kind"], c["serial"]) for c in unchanged] == [("created", 1)]

    # the module instance is not under terraform_data.*, and a parsed glob never matches by substring
    assert "module.web.terraform_data.x" not in by_address
    module = client.get(READ + "?glob=module.web.*").get_json()["instances"]
    assert [i["address"] for i in module] == ["module.web.terraform_data.x"]


def test_blame_pages_addresses_and_reports_destroyed_instances(client, clean_db):
    many = [resource("n", [instance(k, f"v{k}") for k in range(5)])]
    assert client.post(STATE, data=state(1, many)).status_code == 200
    fewer = [resource("n", [instance(k, f"v{k}") for k in range(4)])]
    assert client.post(STATE, data=state(2, fewer)).status_code == 200
    seen: list[str] = []
    after = ""
    for _ in range(5):
        page = client.get(READ, query_string={"glob": "terraform_data.n.*", "limit": 2, "after": after}).get_json()
        seen += [i["address"] for i in page["instances"]]
        assert len(page["instances"]) <= 2
        if page["next_after"] is None:
            break
        after = page["next_after"]
    assert seen == [f"terraform_data.n[{k}]" for k in range(5)]
    last = client.get(READ, query_string={"glob": "terraform_data.n[4]"}).get_json()["instances"][0]
    assert [(c["kind"], c["serial"]) for c in last["changes"]] == [("destroyed", 2), ("created", 1)]


def test_blame_refuses_bad_globs_and_bounds_with_the_error_envelope(client, clean_db):
    assert client.post(STATE, data=trunk()).status_code == 200
    for query in ({"glob": "terraform_data.["}, {"glob": "x" * 3000}, {"glob": "terraform_data.*", "limit": 0},
                  {"glob": "terraform_data.*", "limit": 1001}, {"glob": "terraform_data.*", "changes": 201}):
        answer = client.get(READ, query_string=query)
        assert answer.status_code == 400, (query, answer.data)
        assert answer.get_json()["ok"] is False
    assert client.get(READ, query_string={"glob": "terraform_data.never"}).status_code == 404


def test_blame_names_added_removed_and_changed_keys_and_counts_secret_ones(client, clean_db):
    """Every top-level name whose value differs is reported once, sorted: a changed value, a key only the old
    object has, a key only the new one has, a JSON null against a missing key; equal values (nested objects
    in another key order) are not. Secret-looking names, and names only the old row lists as sensitive, are
    counted, never named. A lifecycle whose attributes are not an object compares as an empty object."""
    def body(serial: int, attributes: object, *, sensitive: list[object]) -> bytes:
        inst = instance(None, "x", sensitive_attributes=sensitive)
        inst["attributes"] = attributes
        return state(serial, [resource("t", [inst]), resource("u", [instance(None, f"u{serial}")])])

    old = {"changed": 1, "gone": "g", "same": {"a": 1, "b": [1, 2]}, "nulled": 1, "db_password": "p1",
           "listed": "l1", "api_token": "t"}
    new = {"changed": 2, "added": "a", "same": {"b": [1, 2], "a": 1}, "nulled": None, "db_password": "p2",
           "listed": "l2", "was_null": None}
    listed = [[{"type": "get_attr", "value": "listed"}]]
    assert client.post(STATE, data=body(1, old, sensitive=listed)).status_code == 200
    assert client.post(STATE, data=body(2, new, sensitive=[])).status_code == 200
    assert client.post(STATE, data=body(3, "not an object", sensitive=[])).status_code == 200

    changes = client.get(READ, query_string={"glob": "terraform_data.t"}).get_json()["instances"][0]["changes"]
    assert [(c["kind"], c["serial"]) for c in changes] == [("changed", 3), ("changed", 2), ("created", 1)]
    assert changes[1]["attributes"] == ["added", "changed", "gone", "nulled", "was_null"]
    assert changes[1]["sensitive"] == 3  # db_password, listed (sensitive in the old row), api_token (removed)
    # every key of the old object is gone; db_password is counted, the rest named
    assert changes[0]["attributes"] == ["added", "changed", "listed", "nulled", "same", "was_null"]
    assert changes[0]["sensitive"] == 1
