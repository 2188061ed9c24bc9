"""The runner core's single owners: -var flags and the trunk's described part."""

from __future__ import annotations

import json
from pathlib import Path

from analyzer.state import parse_state
from runner.core.plan import given_var_flags
from runner.core.trunk import Snapshot, described_part

PROVIDER = 'provider["terraform.io/builtin/terraform"]'


def test_var_flags_are_passed_as_given_and_undeclared_ones_dropped_only_when_asked(tmp_path: Path) -> None:
    values = tmp_path / "x.tfvars"
    args = [("var", "region=eu"), ("var-file", str(values)), ("var", "other = 1")]
    assert given_var_flags(args) == ["-var=region=eu", f"-var-file={values.resolve()}", "-var=other = 1"]
    assert given_var_flags(args, frozenset({"region"})) == ["-var=region=eu", f"-var-file={values.resolve()}"]


def test_the_described_part_keeps_the_described_instances_and_every_output() -> None:
    raw = json.dumps({
        "version": 4, "terraform_version": "1.15.0", "serial": 7, "lineage": "l",
        "outputs": {"o": {"value": 1, "type": "number"}},
        "resources": [
            {"mode": "managed", "type": "terraform_data", "name": n, "provider": PROVIDER,
             "instances": [{"schema_version": 0, "attributes": {"id": n}}]} for n in ("a", "b")
        ],
    }).encode()
    parsed = parse_state(raw)
    part = described_part(Snapshot(raw, parsed), frozenset({"terraform_data.a"}))  # type: ignore[arg-type]
    assert (part.serial, part.lineage, part.addresses) == (7, "l", ["terraform_data.a"])
    assert part.raw is not None and json.loads(part.raw)["outputs"] == {"o": {"value": 1, "type": "number"}}
    assert described_part(Snapshot(None, None), frozenset({"terraform_data.a"})).addresses == []

