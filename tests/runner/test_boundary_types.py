"""The typed boundaries of the core: the plan file's one serialiser reads what earlier versions wrote and
writes the same bytes; the engine's answers are parsed once, and a malformed one is refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analyzer.globs import Mode, Reservation, footprint_reservations
from app.domain.reservations import RunStatus
from runner.bot.outcomes import ApplyResult, ApplyStatus, apply_from_json, to_json
from runner.core.engine_client import Commit, CommitAnswer, MalformedAnswer, OpenedRun, parse_answer
from runner.core.errors import EngineCode
from runner.core.spec import PinKind, PinnedVar, PlanMode, PlanSpec, SpecError

# A plan file as kl plan wrote it before the plan file had a typed serialiser (keys sorted, two-space indent).
OLD_PLAN = """{
  "actions": {
    "terraform_data.db": "update"
  },
  "address": "http://127.0.0.1:8080",
  "base_serial": 3,
  "config_dir": "/work/infra",
  "config_hash": "abc",
  "created_at": "2026-01-01T00:00:00+00:00",
  "deleted_files": {},
  "deleted_globs": [],
  "described_resources": [
    "terraform_data.db"
  ],
  "diagnostics": [],
  "files": {
    "db.tf": "f00"
  },
  "kilolock_plan": 1,
  "lineage": "L1",
  "mode": "files",
  "orphans": [],
  "output_changes": {},
  "read_globs": [
    "terraform_data.net"
  ],
  "read_set": [
    "terraform_data.net"
  ],
  "refresh": false,
  "removed_outputs": [],
  "reservations": [
    {
      "glob": "terraform_data.db",
      "mode": "write"
    },
    {
      "glob": "terraform_data.net",
      "mode": "read"
    }
  ],
  "seed_variables": [],
  "selected_files": [
    "db.tf"
  ],
  "slice_globs": [],
  "state": "prod",
  "targets": [],
  "terraform_version": "1.15.0",
  "validation_globs": [],
  "variables": [
    {
      "kind": "var",
      "name": "size",
      "sha256": "e3b0",
      "value": "small"
    },
    {
      "kind": "auto-var-file",
      "name": "/work/infra/terraform.tfvars",
      "sha256": "c0ff",
      "value": null
    }
  ],
  "warnings": [],
  "write_globs": [
    "terraform_data.db"
  ],
  "write_set": [
    "terraform_data.db"
  ]
}
"""


def test_an_old_plan_file_reads_into_enums_and_writes_back_byte_for_byte(tmp_path: Path) -> None:
    path = tmp_path / "kl-plan.json"
    path.write_text(OLD_PLAN)
    spec = PlanSpec.load(path)
    assert spec.mode is PlanMode.FILES
    assert [v.kind for v in spec.variables] == [PinKind.VAR, PinKind.AUTO_VAR_FILE]
    assert spec.variables[0] == PinnedVar(PinKind.VAR, "size", "e3b0", "small")
    assert spec.write_set == ("terraform_data.db",) and spec.selected_files == ("db.tf",)
    assert spec.reservations == (Reservation("terraform_data.db", Mode.WRITE),
                                 Reservation("terraform_data.net", Mode.READ))
    assert spec.to_json() == OLD_PLAN


def test_a_file_missing_fields_or_with_unknown_ones_is_refused_by_name(tmp_path: Path) -> None:
    doc = json.loads(OLD_PLAN)
    del doc["state"]
    doc["mode"] = "everything"
    doc["from_the_future"] = 1
    path = tmp_path / "kl-plan.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(SpecError) as refused:
        PlanSpec.load(path)
    message = str(refused.value)
    assert "state: Field required" in message and "mode:" in message and "from_the_future" in message
    assert "re-run kl plan" in message


def test_reservations_are_typed_pairs_whose_mode_is_its_text() -> None:
    found = footprint_reservations(["a.b"], ["c.*"])
    assert found == (Reservation("a.b", Mode.WRITE), Reservation("c.*", Mode.READ))
    assert [r.to_json() for r in found] == [{"glob": "a.b", "mode": "write"}, {"glob": "c.*", "mode": "read"}]
    assert Reservation.of("x.y", "read") == Reservation("x.y", Mode.READ) and Mode.READ == "read"
    with pytest.raises(ValueError, match="unknown reservation mode 'all'"):
        Reservation.of("x.y", "all")


def test_an_opened_run_is_parsed_once() -> None:
    body = {"ok": True, "run": {"id": "ar_1", "state": "prod", "status": "reserved", "actor": "alice",
                                "base_serial": 3, "lease_seconds": 900, "info": {}},
            "reservations": [{"state": "prod", "glob": "a.b", "mode": "write", "holder": "alice",
                              "run_id": "ar_1", "acquired_at": "2026-01-01T00:00:00Z", "expires_at": None}],
            "granted_at_serial": 3, "granted_at_lineage": "L1"}
    opened = parse_answer(OpenedRun, body, "opening a run")
    assert (opened.id, opened.holder, opened.run.status, opened.run.base_serial) == ("ar_1", "alice",
                                                                                    RunStatus.RESERVED, 3)
    assert opened.reservations == (Reservation("a.b", Mode.WRITE),)
    assert (opened.granted_at_serial, opened.granted_at_lineage) == (3, "L1")


def test_a_malformed_answer_is_refused_naming_what_is_missing() -> None:
    with pytest.raises(MalformedAnswer) as refused:
        parse_answer(OpenedRun, {"ok": True, "run": {"state": "prod", "status": "reserved", "actor": "a"}},
                     "opening a run")
    assert refused.value.code == EngineCode.MALFORMED_ANSWER
    assert "run.id: Field required" in str(refused.value) and "opening a run" in str(refused.value)
    commit = parse_answer(CommitAnswer, {"run": {"id": "ar_1", "state": "s", "status": "committed", "actor": "a"},
                                         "commit": {"serial": 4, "addresses": ["a.b"], "created": 1,
                                                    "updated": 0, "deleted": 0, "outputs_changed": []}},
                          "a commit").commit
    assert commit == Commit(4, ("a.b",), created=1) and commit.rows == {"created": 1, "updated": 0, "deleted": 0}


def test_an_apply_status_is_stored_as_its_text() -> None:
    result = ApplyResult("web", "prod", "abc", ApplyStatus.NO_CHANGES)
    stored = to_json(result)
    assert stored["status"] == "no_changes" and json.loads(json.dumps(stored))["status"] == "no_changes"
    assert apply_from_json(stored).status is ApplyStatus.NO_CHANGES and not result.failed
    assert ApplyResult("web", "prod", "abc", ApplyStatus.FAILED).failed
