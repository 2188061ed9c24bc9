"""Lifecycle projection: one row per instance object per lifecycle, point-in-time reads and
re-assembly, driven through the backend lane and read back through the engine lane."""

from __future__ import annotations

import json
import random

import psycopg

from analyzer.state import ParsedState, parse_state
from tests.helpers import instance, resource, state

URL = "/v1/states/life"
READ = "/v1/engine/states/life"


def rows(database_url: str) -> list[tuple[int, str, str, int, int | None]]:
    """The rows in the order they were opened, each numbered by that order (ids themselves may skip
    values: a state's first write takes one from the sequence before its rows)."""
    with psycopg.connect(database_url) as conn:
        return conn.execute(
            "SELECT dense_rank() OVER (ORDER BY id)::int, address, deposed, create_serial, delete_serial "
            "FROM resources ORDER BY id"
        ).fetchall()


def post(client, body: bytes) -> None:
    response = client.post(URL, data=body)
    assert response.status_code == 200, response.data


def test_an_unchanged_instance_keeps_its_row_across_writes(client, clean_db):
    post(client, state(1, [resource("a", [instance(None, "x")])]))
    post(client, state(2, [resource("a", [instance(None, "x")]), resource("b", [instance(None, "y")])]))
    post(client, state(3, [resource("a", [instance(None, "x")]), resource("b", [instance(None, "y")])]))
    assert rows(clean_db) == [(1, "terraform_data.a", "", 1, None), (2, "terraform_data.b", "", 2, None)]


def test_a_changed_instance_is_closed_and_reopened(client, clean_db):
    post(client, state(1, [resource("a", [instance(None, "x")])]))
    post(client, state(2, [resource("a", [instance(None, "changed")])]))
    assert rows(clean_db) == [(1, "terraform_data.a", "", 1, 2), (2, "terraform_data.a", "", 2, None)]


def test_a_removed_instance_is_closed(client, clean_db):
    post(client, state(1, [resource("a", [instance(0, "x"), instance(1, "y")])]))
    post(client, state(2, [resource("a", [instance(0, "x")])]))
    assert rows(clean_db) == [(1, "terraform_data.a[0]", "", 1, None), (2, "terraform_data.a[1]", "", 1, 2)]


def test_key_order_inside_an_instance_never_fakes_a_change(client, clean_db):
    first = state(1, [resource("a", [instance(None, "x")])])
    doc = json.loads(first)
    inst = doc["resources"][0]["instances"][0]
    doc["resources"][0]["instances"][0] = dict(reversed(list(inst.items())))
    doc["resources"][0]["instances"][0]["attributes"] = dict(reversed(list(inst["attributes"].items())))
    doc["serial"] = 2
    post(client, first)
    post(client, json.dumps(doc, indent=4).encode())
    assert rows(clean_db) == [(1, "terraform_data.a", "", 1, None)]


def test_tainted_and_deposed_objects_are_kept_as_separate_rows(client, clean_db):
    body = state(1, [resource("a", [
        instance(None, "new", status="tainted"),
        instance(None, "old", deposed="00000001"),
    ])])
    post(client, body)
    listed = client.get(READ + "/resources").get_json()["resources"]
    assert [(r["address"], r["deposed"], r["status"]) for r in listed] == [
        ("terraform_data.a", "", "tainted"), ("terraform_data.a", "00000001", "")]
    assembled = parse_state(client.get(READ + "/assembled").data)
    assert isinstance(assembled, ParsedState)
    assert assembled.instances == parse_state(body).instances  # type: ignore[union-attr]


def _random_history(seed: int, writes: int) -> list[bytes]:
    rng = random.Random(seed)
    alive: dict[str, str] = {}
    bodies = []
    for serial in range(1, writes + 1):
        for _ in range(rng.randint(1, 4)):
            op = rng.random()
            key = f"k{rng.randint(0, 12)}"
            if op < 0.5:
                alive[key] = f"v{serial}-{rng.random():.6f}"
            elif op < 0.8 and alive:
                alive.pop(rng.choice(sorted(alive)))
        resources = [resource("item", [instance(k, v) for k, v in sorted(alive.items())])] if alive else []
        resources.append(resource("child", [instance(None, f"c{serial % 3}")], module='module.m["a.b"]'))
        bodies.append(state(serial, resources, outputs={"n": {"value": len(alive), "type": "number"}}))
    return bodies


def test_point_in_time_listing_and_reassembly_match_every_version(client):
    bodies = _random_history(seed=7, writes=25)
    for body in bodies:
        post(client, body)
    for serial, body in enumerate(bodies, start=1):
        expected = parse_state(body)
        assert isinstance(expected, ParsedState)
        listed = client.get(f"{READ}/resources?serial={serial}").get_json()
        assert listed["serial"] == serial
        assert sorted(r["address"] for r in listed["resources"]) == sorted(i.address for i in expected.instances)
        assembled = parse_state(client.get(f"{READ}/assembled?serial={serial}").data)
        assert isinstance(assembled, ParsedState)
        assert sorted(assembled.instances, key=lambda i: i.address) == sorted(
            expected.instances, key=lambda i: i.address)
        assert assembled.outputs == expected.outputs
        assert (assembled.serial, assembled.lineage) == (expected.serial, expected.lineage)


def test_a_prefix_filter_is_structured_not_a_string_prefix(client):
    post(client, state(1, [
        resource("x", [instance(None, "1")], module="module.web"),
        resource("x", [instance(None, "2")], module="module.webapp"),
        resource("x", [instance(None, "3")], module='module.web["k"]'),
    ]))
    listed = client.get(READ + "/resources?prefix=module.web").get_json()["resources"]
    # module.web covers every instance of the call (module.web["k"] too), never module.webapp.
    assert [r["address"] for r in listed] == ["module.web.terraform_data.x", 'module.web["k"].terraform_data.x']
    keyed = client.get(READ + '/resources?prefix=module.web["k"]').get_json()["resources"]
    assert [r["address"] for r in keyed] == ['module.web["k"].terraform_data.x']
    assert client.get(READ + "/resources?prefix=module.").status_code == 400


def test_history_lists_every_lifecycle_of_one_address(client):
    post(client, state(1, [resource("a", [instance(None, "x")])]))
    post(client, state(2, [resource("a", [instance(None, "y")])]))
    post(client, state(3, []))
    body = client.get(READ + "/history?address=terraform_data.a").get_json()
    spans = [(r["create_serial"], r["delete_serial"]) for r in body["lifecycles"]]
    assert spans == [(1, 2), (2, 3)]
    assert body["lifecycles"][0]["instance"]["attributes"]["input"]["value"] == "x"
    assert client.get(READ + "/history?address=terraform_data.nope").status_code == 404
    assert client.get(READ + "/history").status_code == 400


def test_dependency_edges_resolve_to_live_instances(client, clean_db):
    post(client, state(1, [
        resource("base", [instance(0, "b0"), instance(1, "b1")]),
        resource("app", [instance(None, "a", deps=["terraform_data.base"])]),
    ]))
    edges = client.get(READ + "/dependencies").get_json()["edges"]
    assert [(e["address"], e["depends_on_address"]) for e in edges] == [
        ("terraform_data.app", "terraform_data.base[0]"), ("terraform_data.app", "terraform_data.base[1]")]
    with psycopg.connect(clean_db) as conn:
        count = conn.execute("SELECT count(*) FROM current_resource_dependencies").fetchone()
    assert count == (2,)


def test_outputs_are_kept_per_version(client, clean_db):
    post(client, state(1, [], outputs={"a": {"value": "one", "type": "string"}}))
    post(client, state(2, [], outputs={"a": {"value": "two", "type": "string", "sensitive": True}}))
    with psycopg.connect(clean_db) as conn:
        found = conn.execute(
            "SELECT v.serial, o.value #>> '{}', o.sensitive FROM outputs o "
            "JOIN state_versions v ON v.id = o.state_version_id ORDER BY v.serial").fetchall()
    assert found == [(1, "one", False), (2, "two", True)]


def test_reading_an_unknown_state_is_404_in_the_json_envelope(client):
    response = client.get("/v1/engine/states/nope/resources")
    assert response.status_code == 404
    assert response.get_json() == {"ok": False, "code": "state_not_found", "error": "no state named 'nope'",
                                   "status": 404}
