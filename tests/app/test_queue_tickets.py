"""Queue tickets end with their waiter: a cancelled place stops blocking at once and only its own credential
and holder can cancel it; a refusal because earlier waiters go first names them (holders, runs), bounded."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest

from app.domain.principal import default_principal
from app.domain.reservations import parse_wanted
from app.errors import ReservationConflictError
from app.store import runs

RUNS = "/v1/engine/states/shared/runs"
LEASE = timedelta(minutes=5)
WAIT = timedelta(seconds=60)


def waiters(database_url: str) -> list[tuple[str, str | None]]:
    with psycopg.connect(database_url) as conn:
        return [(h, r) for h, r in conn.execute("SELECT holder, run_id FROM reservation_waiters ORDER BY id")]


def test_a_refusal_behind_the_queue_names_the_first_waiters_their_runs_and_how_many_there_are(db, clean_db):
    who = default_principal("test")
    reader = runs.open_run(db, who, "shared", actor="reader", wanted=parse_wanted([("module.web.r.r", "read")]),
                           lease=LEASE)
    assert isinstance(reader, runs.Run)
    # One waiter asks for more reservations for its own run: the refusal names that run.
    owner = runs.open_run(db, who, "shared", actor="owner", wanted=parse_wanted([("module.db.*", "write")]),
                          lease=LEASE)
    assert isinstance(owner, runs.Run)
    more = runs.acquire_more(db, who, owner.id, holder="owner", wanted=parse_wanted([("module.web.*", "write")]),
                             wait=WAIT)
    assert isinstance(more, runs.Ticket)
    for n in range(6):
        queued = runs.open_run(db, who, "shared", actor=f"waiter-{n}", lease=LEASE, wait=WAIT,
                               wanted=parse_wanted([(f"module.web.t.x{n}", "write"), ("module.web.s.s", "write")]))
        assert isinstance(queued, runs.Ticket)
    # A waiter for unrelated addresses is never named: it does not go first.
    assert isinstance(runs.open_run(db, who, "shared", actor="elsewhere", lease=LEASE, wait=WAIT,
                                    wanted=parse_wanted([("module.dns.*", "write")])), runs.Run)
    assert waiters(clean_db)[0] == ("owner", owner.id)

    with pytest.raises(ReservationConflictError) as refused:
        runs.open_run(db, who, "shared", actor="late", lease=LEASE, wanted=parse_wanted([("module.web.s.s", "write")]))
    message = refused.value.message
    assert message.startswith("reservation conflict: earlier waiting requests for the same addresses go first: ")
    assert f"owner (run {owner.id}, waiting " in message and "for module.web.*)" in message
    assert "waiter-0 (a new run, waiting " in message and "waiter-3 (a new run" in message
    assert "waiter-4" not in message and "; and 2 more;" in message and "elsewhere" not in message
    data = refused.value.data
    assert data["waiting_total"] == 7 and data["conflicts"] == [] and data["conflicts_total"] == 0
    assert [w["holder"] for w in data["waiting"]] == ["owner", "waiter-0", "waiter-1", "waiter-2", "waiter-3"]
    assert data["waiting"][0]["run_id"] == owner.id and data["waiting"][1]["run_id"] is None
    assert data["waiting"][1]["wanted"] == [{"glob": "module.web.t.x0", "mode": "write"},
                                            {"glob": "module.web.s.s", "mode": "write"}]
    assert data["waiting"][1]["wanted_total"] == 2 and data["waiting"][1]["waiting_seconds"] >= 0


def test_the_refusal_json_on_the_engine_lane_carries_the_waiters(client, clean_db):
    body = {"actor": "reader", "reservations": [{"glob": "module.web.a.b", "mode": "read"}]}
    assert client.post(RUNS, json=body).status_code == 201
    queued = client.post(RUNS, json={"actor": "big", "wait_seconds": 60,
                                     "reservations": [{"glob": "module.web.*", "mode": "write"}]})
    assert queued.status_code == 202
    refused = client.post(RUNS, json={"actor": "small", "reservations": [{"glob": "module.web.t.c", "mode": "write"}]})
    assert refused.status_code == 409
    doc = refused.get_json()
    assert doc["ok"] is False and doc["code"] == "reservation_conflict" and doc["waiting_total"] == 1
    assert doc["waiting"][0]["holder"] == "big" and "big (a new run, waiting" in doc["error"]


def test_a_cancelled_ticket_stops_blocking_at_once_and_only_its_holder_can_cancel_it(client, clean_db):
    assert client.post(RUNS, json={"actor": "reader", "reservations": [
        {"glob": "module.web.a.b", "mode": "read"}]}).status_code == 201
    queued = client.post(RUNS, json={"actor": "big", "wait_seconds": 60,
                                     "reservations": [{"glob": "module.web.*", "mode": "write"}]})
    ticket = queued.get_json()["ticket"]
    small = {"actor": "small", "reservations": [{"glob": "module.web.t.c", "mode": "write"}]}
    assert client.post(RUNS, json=small).status_code == 409  # the big waiter goes first

    other = client.post(f"/v1/engine/tickets/{ticket}/cancel", json={"holder": "mallory"})
    assert other.status_code == 200 and other.get_json()["cancelled"] is False
    assert waiters(clean_db) == [("big", None)]
    for bad in ("wt_0", "nope", "wt_99999999999"):
        answer = client.post(f"/v1/engine/tickets/{bad}/cancel", json={"holder": "big"})
        assert answer.status_code == 200 and answer.get_json()["cancelled"] is False
    assert client.post(f"/v1/engine/tickets/{ticket}/cancel", json={}).status_code == 400

    mine = client.post(f"/v1/engine/tickets/{ticket}/cancel", json={"holder": "big"})
    assert mine.status_code == 200 and mine.get_json() == {"ok": True, "ticket": ticket, "cancelled": True}
    assert waiters(clean_db) == []
    assert client.post(f"/v1/engine/tickets/{ticket}/cancel", json={"holder": "big"}).get_json()["cancelled"] is False
    assert client.post(RUNS, json=small).status_code == 201  # nobody waits ahead any more
    again = client.post(RUNS, json={"actor": "big", "wait_seconds": 0, "ticket": ticket,
                                    "reservations": [{"glob": "module.web.*", "mode": "write"}]})
    assert again.status_code == 409 and again.get_json()["code"] == "wait_ticket_expired"
    events = client.get("/v1/engine/states/shared/events").get_json()["events"]
    assert any(e["kind"] == "reservation_wait_cancelled" and e["detail"]["ticket"] == ticket for e in events)
    # Queueing is audited once per queue place (it is the run.waiting event), not on every poll.
    waits = [e for e in events if e["kind"] == "reservation_wait"]
    assert [(e["detail"]["holder"], e["detail"]["globs"]) for e in waits] == [("big", [["module.web.*", "write"]])]
