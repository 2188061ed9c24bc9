"""``kl apply -f --confirm-scope`` applies the plan it just made when the trunk has not moved since, and
re-plans over a fresh slice when it has: with real Terraform, a real server, and a second checkout
committing between the plan and the reservations."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import requests

from app.domain.reservations import RunStatus
from runner.cli.entry import main
from runner.core.apply import saved_plan_refusal
from runner.core.engine_client import EngineClient, OpenedRun, Run
from runner.core.session import TerraformContext
from runner.core.spec import PlanSpec
from runner.core.terraform import BinaryKind, TerraformBinary
from runner.core.workbuild import Prepared, SavedPlan
from runner.core.workspace import Workspace
from tests.conftest import Workdir
from tests.runner.test_file_scoped import make_repo, untrap

pytestmark = pytest.mark.terraform

REUSED = "the trunk has not moved since the plan"
MOVED = "the trunk moved since the plan"


@pytest.fixture
def repo(live_server, workdir_factory):  # type: ignore[no-untyped-def]
    return make_repo(live_server, workdir_factory)


def head_serial(repo: Workdir) -> int:
    return int(requests.get(repo.url, timeout=10).json()["serial"])


def other_checkout(repo: Workdir, name: str) -> Workdir:
    """A second checkout of the same configuration and state (what another engineer works in)."""
    dest = repo.dir.parent / name
    shutil.copytree(repo.dir, dest, ignore=shutil.ignore_patterns(".terraform", "*.igplan"))
    return Workdir(dest, repo.url, repo.env)


def alice_applies_db_after_bob(repo: Workdir, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                               bob_file: str, bob_edit: tuple[str, str]) -> tuple[int, str]:
    """alice runs ``kl apply -f db.tf --confirm-scope`` in this process; between its plan and its reservations
    bob, in a second checkout, applies ``bob_edit`` to ``bob_file``. Returns alice's exit code and output."""
    other = other_checkout(repo, "other")
    other.edit(bob_file, *bob_edit)
    original = EngineClient.open_run

    def open_run(self: EngineClient, *args: Any, **kwargs: Any) -> dict[str, Any]:
        done = other.kl("apply", "-f", bob_file, "--confirm-scope", "--actor", "bob")
        assert done.returncode == 0 and REUSED in done.stdout, done.stdout + done.stderr
        return original(self, *args, **kwargs)

    monkeypatch.setattr(EngineClient, "open_run", open_run)
    monkeypatch.chdir(repo.dir)
    monkeypatch.setattr("runner.core.config.process_env", lambda: dict(repo.env))
    code = main(["apply", "-f", "db.tf", "--confirm-scope", "--actor", "alice"])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_an_unmoved_trunk_applies_the_saved_plan_without_re_planning(repo):
    repo.edit("db.tf", "db-v1", "db-v2")
    before = head_serial(repo)
    done = repo.kl("apply", "-f", "db.tf", "--confirm-scope", "--actor", "alice")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{REUSED} (serial {before}): applying the saved plan" in done.stdout
    assert MOVED not in done.stdout
    assert f"committed at serial {before + 1}" in done.stdout and head_serial(repo) == before + 1
    untrap(repo)
    repo.converged()


def test_the_open_answer_says_the_head_serial_at_the_grant(repo):
    engine = repo.url.replace("/v1/states/files", "/v1/engine/states/files/runs")
    serial = head_serial(repo)
    answer = requests.post(engine, json={"actor": "eve", "base_serial": serial - 1,
                                         "reservations": [{"glob": "terraform_data.nothing", "mode": "write"}]},
                           timeout=10)
    assert answer.status_code == 201, answer.text
    doc = answer.json()
    assert doc["granted_at_serial"] == serial and doc["run"]["base_serial"] == serial - 1
    assert doc["granted_at_lineage"] == requests.get(repo.url, timeout=10).json()["lineage"]
    requests.post(repo.url.replace("/v1/states/files", f"/v1/engine/runs/{doc['run']['id']}/close"),
                  json={"holder": "eve", "status": "aborted"}, timeout=10).raise_for_status()


def test_a_commit_between_the_plan_and_the_reservations_re_plans_over_a_fresh_slice(repo, monkeypatch, capsys):
    repo.edit("db.tf", "db-v1", "db-v3")
    before = head_serial(repo)
    code, out = alice_applies_db_after_bob(repo, monkeypatch, capsys, "app.tf", ("app-v1", "app-v2"))
    assert code == 0, out
    assert f"{MOVED} (serial {before}, now {before + 1}): re-planning over a fresh slice" in out
    assert REUSED not in out and f"committed at serial {before + 2}" in out
    repo.edit("app.tf", "app-v1", "app-v2")  # both changes are on the trunk now
    untrap(repo)
    repo.converged()


def test_a_commit_to_the_planned_addresses_still_refuses_the_plan_as_stale(repo, monkeypatch, capsys):
    repo.edit("db.tf", "db-v1", "db-alice")
    before = head_serial(repo)
    code, out = alice_applies_db_after_bob(repo, monkeypatch, capsys, "db.tf", ("db-alice", "db-bob"))
    assert code == 2 and "stale" in out.lower(), out
    assert REUSED not in out and head_serial(repo) == before + 1
    repo.edit("db.tf", "db-alice", "db-bob")  # the trunk holds bob's value
    untrap(repo)
    repo.converged()


def test_the_plan_file_path_keeps_re_planning(repo):
    repo.edit("db.tf", "db-v1", "db-v7")
    assert repo.kl("plan", "-f", "db.tf").returncode == 0
    done = repo.kl("apply", ".kilolock/kl-plan.igplan", "--actor", "alice")
    assert done.returncode == 0 and "committed at serial" in done.stdout, done.stdout + done.stderr
    assert REUSED not in done.stdout and MOVED not in done.stdout
    untrap(repo)
    repo.converged()


def test_the_saved_plan_is_applied_only_at_the_plans_serial_and_lineage():
    spec = PlanSpec(state="files", address="http://kl", lineage="L1", base_serial=3, terraform_version="1.15.0",
                    config_dir="/c", config_hash="", created_at="", write_set=("terraform_data.db",), read_set=(),
                    write_globs=("terraform_data.db",), read_globs=(), actions={}, described_resources=(),
                    orphans=(), warnings=())
    binary = TerraformBinary(Path("/bin/terraform"), BinaryKind.TERRAFORM)
    saved = SavedPlan(Prepared(Workspace(Path("/ws")), None, []), spec, binary)
    ctx = TerraformContext(binary=binary, env={}, plugin_cache=Path("/cache"), echo=print)

    def answer(serial: int | None = 3, lineage: str | None = "L1", base: int = 3) -> OpenedRun:
        return OpenedRun(run(base), granted_at_serial=serial, granted_at_lineage=lineage)

    def run(base: int) -> Run:
        return Run("ar_1", "files", RunStatus.RESERVED, "alice", base_serial=base)

    assert saved_plan_refusal(saved, spec, ctx, answer()) is None
    assert "moved since the plan (serial 3, now 4)" in str(saved_plan_refusal(saved, spec, ctx, answer(4)))
    assert "replaced" in str(saved_plan_refusal(saved, spec, ctx, answer(lineage="L2")))
    assert "did not say" in str(saved_plan_refusal(saved, spec, ctx, OpenedRun(run(3))))
    assert saved_plan_refusal(saved, replace(spec, refresh=True), ctx, answer()) is not None
    other = TerraformContext(binary=TerraformBinary(Path("/bin/tofu"), BinaryKind.TOFU), env={},
                             plugin_cache=Path("/cache"), echo=print)
    assert saved_plan_refusal(saved, spec, other, answer()) is not None
