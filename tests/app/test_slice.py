"""Slicing the trunk by glob: exactly the head's instances a set of globs covers."""

from __future__ import annotations

import json

from tests.helpers import instance, resource, state


def seed(client) -> None:  # type: ignore[no-untyped-def]
    body = state(3, [
        resource("vpc", [instance(None, "v")], module="module.net"),
        resource("x", [instance(0, "a"), instance(1, "b")], module='module.web["a"]'),
        resource("x", [instance(None, "c")], module="module.webapp"),
        resource("item", [instance("k_1", "d"), instance("k%2", "e")]),
        resource("item2", [instance(None, "f")]),
    ], outputs={"o": {"value": 1, "type": "number"}})
    assert client.post("/v1/states/big", data=body).status_code == 200


def addresses(client, *globs: str) -> list[str]:  # type: ignore[no-untyped-def]
    response = client.post("/v1/engine/states/big/slice", json={"globs": list(globs)})
    assert response.status_code == 200, response.get_json()
    doc = json.loads(response.data)
    assert doc["serial"] == 3 and doc["outputs"] == {"o": {"value": 1, "type": "number"}}
    found = []
    for res in doc["resources"]:
        prefix = (res["module"] + ".") if "module" in res else ""
        for inst in res["instances"]:
            key = inst.get("index_key")
            suffix = "" if key is None else (f"[{key}]" if isinstance(key, int) else f'["{key}"]')
            found.append(f"{prefix}{res['type']}.{res['name']}{suffix}")
    return sorted(found)


def test_a_slice_holds_exactly_what_the_globs_cover(client):
    seed(client)
    assert addresses(client, "module.web.*") == ['module.web["a"].terraform_data.x[0]',
                                                 'module.web["a"].terraform_data.x[1]']
    assert addresses(client, "terraform_data.item.*") == ['terraform_data.item["k%2"]', 'terraform_data.item["k_1"]']
    assert addresses(client, 'terraform_data.item["k_1"]', "module.net.*") == [
        "module.net.terraform_data.vpc", 'terraform_data.item["k_1"]']
    assert len(addresses(client, "*")) == 7
    assert addresses(client) == []


def test_a_bad_glob_is_a_400(client):
    seed(client)
    assert client.post("/v1/engine/states/big/slice", json={"globs": ["module.web*"]}).status_code == 400
    assert client.post("/v1/engine/states/big/slice", json={"globz": []}).status_code == 400
    assert client.post("/v1/engine/states/nope/slice", json={"globs": ["*"]}).status_code == 404


def test_edges_touching_globs_come_from_both_ends(client):
    body = state(1, [
        resource("net", [instance(None, "n")]),
        resource("web", [instance(0, "w", deps=["terraform_data.net"])]),
        resource("db", [instance(None, "d", deps=["terraform_data.net"])]),
        resource("other", [instance(None, "o")]),
    ])
    assert client.post("/v1/states/g", data=body).status_code == 200

    def edges(*globs: str) -> list[tuple[str, str]]:
        found = client.post("/v1/engine/states/g/edges", json={"globs": list(globs)}).get_json()["edges"]
        return [(e["address"], e["depends_on"]) for e in found]

    assert edges("terraform_data.web.*") == [("terraform_data.web[0]", "terraform_data.net")]
    assert edges("terraform_data.net.*") == [("terraform_data.db", "terraform_data.net"),
                                             ("terraform_data.web[0]", "terraform_data.net")]
    assert edges("terraform_data.other") == []
