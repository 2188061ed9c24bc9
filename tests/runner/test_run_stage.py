"""The run stage against a live server: every command's opening maps the same refusal by the same rule,
close_failed ends a run (and says when it could not), and no other module of the client opens or closes a
run itself."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import requests

from analyzer.globs import Mode, Reservation
from app.domain.reservations import RunStatus
from runner.core.config import ClientConfig
from runner.core.engine_client import EngineBadRequest, EngineClient
from runner.core.errors import Failed, KlExit, ReservationRefused, StalePlan
from runner.core.recovery import kept_dir, recover
from runner.core.run import APPLY_REFUSED, ApplyRun, Refused, check_refused, recovery_refused
from tests.helpers import instance, resource, state

REPO = Path(__file__).resolve().parents[2]
STATE = "shared"


def client_of(url: str) -> EngineClient:
    return EngineClient(ClientConfig(base_url=url, state=STATE, username=None, token=None), timeout=30)


def push(url: str, serial: int) -> None:
    body = state(serial, [resource("a", [instance(None, f"v{serial}")])])
    response = requests.post(f"{url}/v1/states/{STATE}", data=body, timeout=30)
    assert response.status_code == 200, response.text


def hold(url: str, actor: str, glob: str) -> str:
    response = requests.post(f"{url}/v1/engine/states/{STATE}/runs", timeout=30,
                             json={"actor": actor, "reservations": [{"glob": glob, "mode": "write"}]})
    assert response.status_code == 201, response.text
    return str(response.json()["run"]["id"])


OPENERS: dict[str, Refused] = {
    "apply": APPLY_REFUSED,
    "refresh": check_refused("refresh", write=True),
    "drift": check_refused("drift", write=False),
    "recover": recovery_refused("ar_old"),
}


def refused_as(client: EngineClient, refused: Refused, *, base_serial: int | None, glob: str = "terraform_data.a",
               ) -> BaseException:
    with pytest.raises(Exception) as caught:
        ApplyRun.open(client, STATE, holder="bob", reservations=[Reservation(glob, Mode.WRITE)],
                      base_serial=base_serial, info={"kind": "test"}, refused=refused)
    return caught.value


def test_every_opener_maps_a_refusal_by_the_same_rule(live_server) -> None:  # type: ignore[no-untyped-def]
    push(live_server.url, 1)
    client = client_of(live_server.url)
    held = hold(live_server.url, "alice", "terraform_data.a")
    conflicts = {name: refused_as(client, refused, base_serial=1) for name, refused in OPENERS.items()}
    # A conflict is a refusal to retry (exit 2), except for kl drift, whose exit 2 means drift was found.
    assert {name: type(exc) for name, exc in conflicts.items()} == {
        "apply": ReservationRefused, "refresh": ReservationRefused, "drift": Failed, "recover": ReservationRefused}
    server_said = str(conflicts["apply"])
    assert "alice" in server_said
    assert str(conflicts["refresh"]) == f"cannot reserve the slice for kl refresh:\n{server_said}"
    assert str(conflicts["drift"]) == f"cannot reserve the slice for kl drift:\n{server_said}"
    assert str(conflicts["recover"]) == f"cannot recover ar_old: {server_said}; nothing was opened or committed"
    assert all(isinstance(exc.__cause__, Exception) for exc in conflicts.values())
    assert ApplyRun(client, held, "alice").close(RunStatus.ABORTED, "released") is None
    # A base serial the trunk has moved past is a stale plan, for every opener.
    push(live_server.url, 2)
    stale = {name: refused_as(client, refused, base_serial=1) for name, refused in OPENERS.items()}
    assert {name: type(exc) for name, exc in stale.items()} == dict.fromkeys(OPENERS, StalePlan)
    # Any other error stays the engine's own (kl recover says nothing was opened).
    wrong = {name: refused_as(client, refused, base_serial=2, glob="a[") for name, refused in OPENERS.items()}
    assert all(isinstance(wrong[name], EngineBadRequest) for name in ("apply", "refresh", "drift"))
    assert type(wrong["recover"]) is Failed and str(wrong["recover"]).startswith("cannot recover ar_old: ")


def test_close_failed_ends_the_run_with_the_summarys_tail_and_says_when_it_could_not(  # type: ignore[no-untyped-def]
        live_server) -> None:
    push(live_server.url, 1)
    client = client_of(live_server.url)
    run = ApplyRun.open(client, STATE, holder="alice", reservations=[Reservation("terraform_data.a", Mode.WRITE)],
                        base_serial=1, info={})
    assert run.opened is not None and run.opened.id == run.id
    assert run.close_failed("x" * 3000 + "the end") is None
    closed = client.run(run.id)
    assert closed.status == RunStatus.FAILED
    assert closed.error_summary is not None and len(closed.error_summary) == 2000
    assert closed.error_summary.endswith("the end")
    again = run.close_failed("twice")
    assert again is not None and again.code == "run_closed"


def test_a_refused_recovery_opens_nothing_and_keeps_the_state(live_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    push(live_server.url, 1)
    client = client_of(live_server.url)
    ended = ApplyRun.open(client, STATE, holder="carol", reservations=[Reservation("terraform_data.a", Mode.WRITE)],
                          base_serial=1, info={})
    assert ended.close_failed("kl ended") is None
    where = kept_dir(tmp_path, ended.id)
    where.mkdir(parents=True)
    (where / "recovery.json").write_text(json.dumps({
        "run_id": ended.id, "state": STATE, "holder": "carol", "base_serial": 1, "slice_addresses": [],
        "reservations": [{"glob": "terraform_data.a", "mode": "write"}], "prune_outputs": True}))
    (where / "terraform.tfstate").write_bytes(state(2, [resource("a", [instance(None, "new")])]))
    hold(live_server.url, "alice", "terraform_data.a")
    with pytest.raises(ReservationRefused) as refused:
        recover(client, tmp_path, ended.id, "carol", lambda _: None)
    assert str(refused.value).startswith(f"cannot recover {ended.id}: ")
    assert str(refused.value).endswith("; nothing was opened or committed")
    assert [r["actor"] for r in client.list_runs(STATE) if r["status"] in ("reserved", "running")] == ["alice"]
    assert (where / "terraform.tfstate").is_file()


def _run_calls(path: Path) -> list[str]:
    """The engine calls in ``path`` that open or close a run."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        if node.func.attr == "open_run":
            found.append(f"{path.relative_to(REPO)}:{node.lineno}: open_run")
        elif node.func.attr == "run_action" and any(isinstance(a, ast.Constant) and a.value == "close"
                                                    for a in node.args):
            found.append(f"{path.relative_to(REPO)}:{node.lineno}: close")
    return found


def test_only_the_run_stage_opens_and_closes_runs() -> None:
    """kl apply, refresh, drift and recover, and the bot's end of a timed-out job, open and close their runs
    through ApplyRun: one refusal mapping and one close."""
    elsewhere = [call for path in sorted((REPO / "runner").rglob("*.py")) if path.name != "run.py"
                 for call in _run_calls(path) if "runner/core/engine_client.py" not in call]
    assert elsewhere == []
    assert {c.rsplit(": ", 1)[1] for c in _run_calls(REPO / "runner" / "core" / "run.py")} == {"open_run", "close"}


def test_an_outcome_is_a_kl_exit_or_the_engine_error_itself() -> None:
    from runner.core.engine_client import EngineError

    conflict = EngineError("held by alice", status=409, code="reservation_conflict")
    assert isinstance(APPLY_REFUSED.outcome(conflict), KlExit)
    other = EngineError("boom", status=500, code="http_error")
    assert APPLY_REFUSED.outcome(other) is other
    assert type(recovery_refused("ar_1").outcome(other)) is Failed
