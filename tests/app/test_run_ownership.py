"""Runs belong to the credential that opened them; requests are bounded in globs and in answer size;
a wait ticket that is not presented again loses its place and is never granted."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from app.domain.principal import Principal, default_principal
from app.domain.reservations import parse_wanted
from app.errors import BadRequestError, NotRunHolderError, ReservationConflictError, TicketExpiredError
from app.store import runs
from tests.app.test_tenancy import CONTROL, make_token

LEASE = timedelta(minutes=5)


@pytest.fixture
def tokens(settings):  # type: ignore[no-untyped-def]
    """A test client of the app in database auth mode."""
    from dataclasses import replace

    from app.config import AuthMode
    from app.web import create_app

    application = create_app(replace(settings, auth_mode=AuthMode.DATABASE, control_token=CONTROL))
    yield application.test_client()
    application.extensions["kilolock"].db.close()


def _runs_url(token) -> str:  # type: ignore[no-untyped-def]
    return f"/v1/engine/states/{token.workspace_id}/{token.environment_id}/prod/runs"


def _rows(url: str) -> tuple[object, ...]:
    with psycopg.connect(url) as conn:
        return (conn.execute("SELECT id, status, counters FROM apply_runs ORDER BY id").fetchall(),
                conn.execute("SELECT run_id, glob, expires_at FROM resource_reservations ORDER BY id").fetchall(),
                conn.execute("SELECT count(*) FROM state_versions").fetchone())


# --- credential binding ------------------------------------------------------------------------------


def test_another_token_of_the_same_environment_cannot_drive_alices_run(tokens, clean_db):  # type: ignore[no-untyped-def]
    dbc = tokens
    alice = make_token(dbc, "acme", name="alice")
    mallory = make_token(dbc, "acme", name="mallory")
    opened = dbc.post(_runs_url(alice), headers=alice.bearer, json={
        "actor": "alice", "base_serial": 0, "reservations": [{"glob": "terraform_data.a", "mode": "write"}]})
    assert opened.status_code == 201, opened.get_json()
    run_id = opened.get_json()["run"]["id"]
    before = _rows(clean_db)
    state = {"version": 4, "serial": 1, "lineage": "l", "terraform_version": "1.15.5", "outputs": {},
             "resources": []}
    for action, body in (
        ("commit", {"holder": "alice", "state": state, "slice_addresses": []}),
        ("renew", {"holder": "alice"}),
        ("release", {"holder": "alice"}),
        ("running", {"holder": "alice"}),
        ("close", {"holder": "alice", "status": "failed"}),
        ("reservations", {"holder": "alice", "reservations": [{"glob": "terraform_data.b", "mode": "write"}]}),
    ):
        answer = dbc.post(f"/v1/engine/runs/{run_id}/{action}", headers=mallory.bearer, json=body)
        assert answer.status_code == 403, (action, answer.get_json())
        doc = answer.get_json()
        assert doc["ok"] is False and doc["code"] == "not_run_holder" and "another credential" in doc["error"]
        assert _rows(clean_db) == before, action
    # The run keeps alice's display name, and alice's own token still drives it.
    assert dbc.get(f"/v1/engine/runs/{run_id}", headers=alice.bearer).get_json()["run"]["actor"] == "alice"
    assert dbc.post(f"/v1/engine/runs/{run_id}/renew", headers=alice.bearer,
                    json={"holder": "alice"}).status_code == 200
    assert dbc.post(f"/v1/engine/runs/{run_id}/renew", headers=alice.bearer,
                    json={"holder": "mallory"}).status_code == 403
    # The holder name is display only: alice's credential with the right name is what counts.
    assert dbc.post(f"/v1/engine/runs/{run_id}/close", headers=alice.bearer,
                    json={"holder": "alice", "status": "aborted"}).status_code == 200


def test_the_open_and_static_modes_share_one_credential_and_check_the_holder(db):  # type: ignore[no-untyped-def]
    who = default_principal("ci")
    run = runs.open_run(db, who, "shared", actor="alice", wanted=parse_wanted([("a.b", "write")]), lease=LEASE)
    assert isinstance(run, runs.Run)
    runs.renew(db, default_principal("someone-else"), run.id, holder="alice")  # same shared credential
    with pytest.raises(NotRunHolderError, match="held by alice"):
        runs.renew(db, who, run.id, holder="bob")
    token_caller = Principal(tenant_id=who.tenant_id, actor="x", credential="token:99")
    with pytest.raises(NotRunHolderError, match="another credential"):
        runs.renew(db, token_caller, run.id, holder="alice")


# --- caps and bounded answers ------------------------------------------------------------------------


def test_more_globs_than_the_request_cap_is_400_and_writes_nothing(client, clean_db):  # type: ignore[no-untyped-def]
    before = _rows(clean_db)
    many = [{"glob": f"terraform_data.r{i}", "mode": "write"} for i in range(1001)]
    answer = client.post("/v1/engine/states/shared/runs", json={"actor": "a", "reservations": many})
    assert answer.status_code == 400 and "at most 1000" in answer.get_json()["error"]
    assert _rows(clean_db) == before
    with pytest.raises(BadRequestError, match="at most 3"):
        parse_wanted([(f"a.r{i}", "write") for i in range(4)], limit=3)


def test_a_run_cannot_grow_past_the_per_run_cap(live_server_factory, clean_db):  # type: ignore[no-untyped-def]
    import requests

    server = live_server_factory(max_globs_per_run=5, max_globs_per_request=3)
    url = server.url + "/v1/engine/states/shared/runs"
    first = requests.post(url, json={"actor": "a", "reservations": [
        {"glob": f"terraform_data.r{i}", "mode": "write"} for i in range(3)]}, timeout=30).json()["run"]["id"]
    more = server.url + f"/v1/engine/runs/{first}/reservations"
    assert requests.post(more, json={"holder": "a", "reservations": [
        {"glob": "terraform_data.x", "mode": "write"}, {"glob": "terraform_data.y", "mode": "write"}]},
        timeout=30).status_code == 200
    before = _rows(clean_db)
    refused = requests.post(more, json={"holder": "a", "reservations": [{"glob": "terraform_data.z", "mode": "write"}]},
                            timeout=30)
    assert refused.status_code == 400 and "at most 5" in refused.json()["error"]
    assert _rows(clean_db) == before
    assert requests.post(url, json={"actor": "b", "reservations": [
        {"glob": f"terraform_data.s{i}", "mode": "write"} for i in range(4)]}, timeout=30).status_code == 400


def test_a_refusal_against_many_held_globs_is_bounded_in_answer_and_audit(client, clean_db):  # type: ignore[no-untyped-def]
    held = [{"glob": f"terraform_data.r{i}", "mode": "read"} for i in range(300)]
    assert client.post("/v1/engine/states/shared/runs", json={"actor": "a", "reservations": held}).status_code == 201
    refused = client.post("/v1/engine/states/shared/runs",
                          json={"actor": "b", "reservations": [{"glob": "*", "mode": "write"}]})
    assert refused.status_code == 409
    body = refused.get_json()
    assert len(body["conflicts"]) == 20 and body["conflicts_total"] == 300
    assert "and 280 more conflicts" in body["error"]
    assert len(refused.data) < 20_000
    with psycopg.connect(clean_db) as conn:
        (detail,) = conn.execute("SELECT detail FROM events WHERE kind = 'reservation_conflict'").fetchone()
    assert len(detail["conflicts"]) == 20 and detail["conflicts_more"] == 280
    assert len(json.dumps(detail)) < 20_000


# --- wait tickets ----------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def test_a_ticket_not_presented_within_its_window_loses_its_place_and_is_never_granted(db):  # type: ignore[no-untyped-def]
    who, clock = default_principal("ci"), Clock()
    wanted = parse_wanted([("module.web.*", "write")])
    holder = runs.open_run(db, who, "shared", actor="alice", wanted=wanted, lease=LEASE, clock=clock)
    assert isinstance(holder, runs.Run)
    gone = runs.open_run(db, who, "shared", actor="gone", wanted=wanted, lease=LEASE, clock=clock,
                         wait=timedelta(minutes=4))
    assert isinstance(gone, runs.Ticket) and gone.expires_in == 10
    # While the ticket is fresh, a later request for the same addresses queues behind it.
    clock.now += timedelta(seconds=5)
    runs.release(db, who, holder.id, holder="alice", clock=clock)
    behind = parse_wanted([("module.web.x.y", "write")])
    with pytest.raises(ReservationConflictError, match="earlier waiting requests"):
        runs.open_run(db, who, "shared", actor="carol", wanted=behind, lease=LEASE, clock=clock)
    # The waiter stops asking (its client was killed): after the window, its place is gone ...
    clock.now += timedelta(seconds=11)
    granted = runs.open_run(db, who, "shared", actor="carol", wanted=behind, lease=LEASE, clock=clock)
    assert isinstance(granted, runs.Run)
    # ... and coming back with the lapsed ticket is refused, never granted, even once the addresses are free.
    runs.release(db, who, granted.id, holder="carol", clock=clock)
    with pytest.raises(TicketExpiredError, match="not a live place"):
        runs.open_run(db, who, "shared", actor="gone", wanted=wanted, lease=LEASE, clock=clock,
                      policy=runs.WaitPolicy(wait=timedelta(minutes=4), ticket=gone.id))
    assert [r.actor for r in runs.list_runs(db, who)] == ["carol", "alice"]


def test_a_ticket_belongs_to_its_credential_state_and_reservations(db):  # type: ignore[no-untyped-def]
    who, clock = default_principal("ci"), Clock()
    wanted = parse_wanted([("a.b", "write")])
    runs.open_run(db, who, "shared", actor="alice", wanted=wanted, lease=LEASE, clock=clock)
    ticket = runs.open_run(db, who, "shared", actor="bob", wanted=wanted, lease=LEASE, clock=clock,
                           wait=timedelta(seconds=60))
    assert isinstance(ticket, runs.Ticket)
    policy = runs.WaitPolicy(wait=timedelta(seconds=60), ticket=ticket.id)
    other = Principal(tenant_id=who.tenant_id, actor="x", credential="token:7")
    for caller, state, asked in ((other, "shared", wanted), (who, "other", wanted),
                                 (who, "shared", parse_wanted([("a.c", "write")]))):
        with pytest.raises(TicketExpiredError):
            runs.open_run(db, caller, state, actor="bob", wanted=asked, lease=LEASE, clock=clock, policy=policy)
    for bad in ("wt_0", "wt_x", "12", "wt_" + "9" * 30):
        with pytest.raises(TicketExpiredError):
            runs.open_run(db, who, "shared", actor="bob", wanted=wanted, lease=LEASE, clock=clock,
                          policy=runs.WaitPolicy(wait=timedelta(seconds=60), ticket=bad))
    again = runs.open_run(db, who, "shared", actor="bob", wanted=wanted, lease=LEASE, clock=clock, policy=policy)
    assert isinstance(again, runs.Ticket) and again.id == ticket.id
    # Asking again every few seconds keeps the place; past the wait it asked for, the answer is final.
    for _ in range(6):
        clock.now += timedelta(seconds=9)
        queued = runs.open_run(db, who, "shared", actor="bob", wanted=wanted, lease=LEASE, clock=clock,
                               policy=policy)
        assert isinstance(queued, runs.Ticket)
    clock.now += timedelta(seconds=9)
    with pytest.raises(ReservationConflictError):
        runs.open_run(db, who, "shared", actor="bob", wanted=wanted, lease=LEASE, clock=clock, policy=policy)
    with pytest.raises(TicketExpiredError):  # a final answer ends the ticket
        runs.open_run(db, who, "shared", actor="bob", wanted=wanted, lease=LEASE, clock=clock, policy=policy)


def test_a_malformed_ticket_or_wait_is_400(client):  # type: ignore[no-untyped-def]
    url = "/v1/engine/states/shared/runs"
    one = [{"glob": "a.b", "mode": "write"}]
    assert client.post(url, json={"actor": "a", "reservations": one, "ticket": 5}).status_code == 400
    assert client.post(url, json={"actor": "a", "reservations": one, "wait_seconds": 1e308}).status_code == 400
    assert client.post(url, json={"actor": "a", "reservations": one, "wait_seconds": True}).status_code == 400
    answer = client.post(url, json={"actor": "a", "reservations": one, "ticket": "wt_1", "wait_seconds": 5})
    assert answer.status_code == 409 and answer.get_json()["code"] == "wait_ticket_expired"
