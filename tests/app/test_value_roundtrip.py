"""Random values of every JSON shape round-tripped through the real store (Postgres jsonb) and through
Terraform's own state JSON: a commit that leaves a value alone is recognised as unchanged, whatever spelling
the value came back in, and a commit that changes it is seen as a change (and refused outside the run's
write reservations)."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from analyzer.state import ParsedState, parse_state
from analyzer.values import same_value
from tests.analyzer.test_values import VALUES, respell
from tests.conftest import kl_terraform_bin, terraform_env
from tests.helpers import PROVIDER

_SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def cty_type(value: Any) -> Any:
    """The cty type Terraform records beside a value of this shape."""
    if value is None:
        return "dynamic"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return ["tuple", [cty_type(v) for v in value]]
    return ["object", {k: cty_type(v) for k, v in value.items()}]


def _instance(name: str, value: Any) -> dict[str, Any]:
    typed = {"value": value, "type": cty_type(value)}
    return {"mode": "managed", "type": "terraform_data", "name": name, "provider": PROVIDER, "instances": [{
        "schema_version": 0, "sensitive_attributes": [],
        "attributes": {"id": name, "input": typed, "output": typed, "triggers_replace": None}}]}


def _state(value: Any, changed: str, *, sensitive: bool, lineage: str) -> dict[str, Any]:
    return {"version": 4, "terraform_version": "1.15.5", "serial": 1, "lineage": lineage,
            "outputs": {"kept": {"value": value, "type": cty_type(value), "sensitive": sensitive},
                        "changed": {"value": changed, "type": "string"}},
            "resources": [_instance("kept", value), _instance("changed", changed)]}


def _attributes(doc: dict[str, Any], name: str) -> dict[str, Any]:
    [found] = [r for r in doc["resources"] if r["name"] == name]
    return found["instances"][0]["attributes"]  # type: ignore[no-any-return]


def _open(client, name: str, base: int) -> str:  # type: ignore[no-untyped-def]
    run = client.post(f"/v1/engine/states/{name}/runs", json={"actor": "prop", "base_serial": base, "reservations": [
        {"glob": "terraform_data.changed", "mode": "write"}, {"glob": "output.changed", "mode": "write"}]})
    assert run.status_code == 201, run.get_json()
    return str(run.get_json()["run"]["id"])


def _commit(client, run_id: str, state_text: str):  # type: ignore[no-untyped-def]
    body = ('{"holder": "prop", "slice_addresses": ["terraform_data.kept", "terraform_data.changed"], "state": '
            + state_text + "}")
    return client.post(f"/v1/engine/runs/{run_id}/commit", data=body, content_type="application/json")


@_SETTINGS
@given(value=VALUES, sensitive=st.booleans(), rng=st.randoms(use_true_random=False))
def test_a_value_read_back_from_postgres_is_unchanged_and_a_changed_one_is_refused(client, value, sensitive, rng):
    name = f"prop-{uuid.uuid4().hex[:12]}"
    lineage = str(uuid.uuid4())
    posted = client.post(f"/v1/states/{name}", data=json.dumps(_state(value, "a", sensitive=sensitive,
                                                                       lineage=lineage), indent=2))
    assert posted.status_code == 200, posted.data
    # What a sliced apply starts from: the trunk as the store assembles it from jsonb rows, re-spelled by
    # another JSON writer (key order, escapes, 1 as 1.0), with only the reserved resource and output changed.
    trunk = json.loads(client.get(f"/v1/states/{name}").data)
    _attributes(trunk, "changed")["input"]["value"] = "b"
    trunk["outputs"]["changed"]["value"] = "b"
    header = json.dumps({k: v for k, v in trunk.items() if k not in ("outputs", "resources")})
    outputs, resources = respell(trunk["outputs"], rng), respell(trunk["resources"], rng)
    respelled = f'{header[:-1]}, "outputs": {outputs}, "resources": {resources}}}'
    answer = _commit(client, _open(client, name, 1), respelled)
    assert answer.status_code == 200, answer.get_json()
    assert answer.get_json()["commit"]["addresses"] == ["terraform_data.changed"]
    assert answer.get_json()["commit"]["outputs_changed"] == ["changed"]
    head = json.loads(client.get(f"/v1/states/{name}").data)
    kept = head["outputs"]["kept"]
    assert same_value(kept["value"], value) and kept.get("sensitive", False) is sensitive

    # A real change of the unreserved value is seen, and refused, naming both places it lives.
    _attributes(head, "kept")["input"]["value"] = [value]
    head["outputs"]["kept"]["value"] = {"v": value}
    refused = _commit(client, _open(client, name, 2), json.dumps(head))
    assert refused.status_code == 409, refused.get_json()
    assert set(refused.get_json()["addresses"]) == {"terraform_data.kept", "output.kept"}


def _hcl_string(text: str) -> str:
    """A JSON text as an HCL string literal: JSON string escapes are HCL's, except interpolation markers."""
    return json.dumps(text).replace("${", "$${").replace("%{", "%%{")


@pytest.mark.terraform
# Each example runs Terraform three times: a few generated examples, no shrinking (a failure prints its values).
@settings(max_examples=3, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(VALUES.filter(lambda v: v is not None), min_size=6, max_size=6))
@example(values=[
    [1.0, 2.5, -0.0, 12345678901234567890, 1e300, 5e-324, 1.5e-7, -(2**70), 0.1],
    {"é ☃": "\u00e9\n\t\"\\ ${x} %{y}", "": None, "a.b": [None, {}, []], "nested": {"n": None, "m": {}}},
    [[], {}, "", False, True, None],
    {"k": 1e20, "kk": -1.25e-5, "z": [{"deep": [[[None]]]}]},
    "plain",
    12345678901234567.5,
])
def test_values_terraform_wrote_come_back_from_the_store_unchanged(client, tmp_path_factory, values):
    work = tmp_path_factory.mktemp("tf")
    env = terraform_env(work)
    config = "".join(
        f'resource "terraform_data" "v{i}" {{\n  input = jsondecode({_hcl_string(json.dumps(v))})\n}}\n'
        f'output "v{i}" {{\n  value = terraform_data.v{i}.output\n}}\n' for i, v in enumerate(values))
    (work / "main.tf").write_text(config)

    def terraform(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([kl_terraform_bin(), *args], cwd=work, env=env, capture_output=True, text=True,
                              timeout=300)

    for args in (("init", "-input=false"), ("apply", "-auto-approve", "-input=false")):
        done = terraform(*args)
        assert done.returncode == 0, done.stdout + done.stderr
    written = (work / "terraform.tfstate").read_bytes()
    name = f"tf-{uuid.uuid4().hex[:12]}"
    assert client.post(f"/v1/states/{name}", data=written).status_code == 200
    # Terraform plans over the state the store assembles from its rows: nothing to change. Then it applies one
    # new resource over it, re-writing every other instance and output in its own JSON: those are unchanged.
    stored = client.get(f"/v1/states/{name}").data
    Path(work / "terraform.tfstate").write_bytes(stored)
    planned = terraform("plan", "-detailed-exitcode", "-input=false")
    assert planned.returncode == 0, planned.stdout[-3000:] + planned.stderr
    (work / "extra.tf").write_text('resource "terraform_data" "extra" {\n  input = "x"\n}\n')
    extended = terraform("apply", "-auto-approve", "-input=false")
    assert extended.returncode == 0, extended.stdout + extended.stderr
    again = (work / "terraform.tfstate").read_bytes()
    base = json.loads(stored)["serial"]
    run = client.post(f"/v1/engine/states/{name}/runs", json={"actor": "prop", "base_serial": base, "reservations": [
        {"glob": "terraform_data.extra", "mode": "write"}]})
    run_id = run.get_json()["run"]["id"]
    addresses = [f"terraform_data.v{i}" for i in range(len(values))] + ["terraform_data.extra"]
    answer = client.post(f"/v1/engine/runs/{run_id}/commit", json={
        "holder": "prop", "state": json.loads(again), "slice_addresses": addresses})
    assert answer.status_code == 200, answer.get_json()
    assert answer.get_json()["commit"]["addresses"] == ["terraform_data.extra"]
    assert answer.get_json()["commit"]["outputs_changed"] == []
    first, second = parse_state(written), parse_state(again)
    assert isinstance(first, ParsedState) and isinstance(second, ParsedState)
    hashes = {r.address: r.attributes_hash for r in second.instances if r.address != "terraform_data.extra"}
    assert hashes == {r.address: r.attributes_hash for r in first.instances}
