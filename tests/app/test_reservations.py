"""Reservations and apply runs on the engine lane: the conflict matrix on rows, all-or-nothing
acquisition, leases and expiry, fair waiting, bad input, and coexistence with Terraform's lock."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from app.domain.principal import default_principal
from app.domain.reservations import RunStatus, parse_wanted
from app.errors import LeaseExpiredError, NotRunHolderError, ReservationConflictError
from app.store import runs
from tests.helpers import counted_state, lock_info

RUNS = "/v1/engine/states/shared/runs"


def open_run(client, actor: str, *reservations: tuple[str, str], **extra):  # type: ignore[no-untyped-def]
    body = {"actor": actor, "reservations": [{"glob": g, "mode": m} for g, m in reservations], **extra}
    return client.post(RUNS, json=body)


def live(client) -> list[tuple[str, str, str]]:  # type: ignore[no-untyped-def]
    found = client.get("/v1/engine/reservations?state=shared").get_json()["reservations"]
    return sorted((r["glob"], r["mode"], r["holder"]) for r in found)


def table(database_url: str) -> list[tuple[object, ...]]:
    with psycopg.connect(database_url) as conn:
        return conn.execute("SELECT run_id, glob, mode, expires_at FROM resource_reservations ORDER BY id").fetchall()


@pytest.mark.parametrize("held, wanted, conflict", [
    (("module.web.*", "write"), ("module.web.*", "write"), True),
    (("module.web.*", "write"), ("module.web.aws_instance.a", "read"), True),
    (("module.web.*", "read"), ("module.web.aws_instance.a", "write"), True),
    (("module.web.*", "read"), ("module.web.*", "read"), False),
    (("module.web.*", "write"), ("module.webapp.*", "write"), False),
    (("aws_instance.web.*", "write"), ("aws_instance.web[3]", "write"), True),
    (("aws_instance.web.*", "write"), ("aws_instance.webapp", "write"), False),
    (("*", "read"), ("module.db.*", "read"), False),
    (("*", "read"), ("module.db.*", "write"), True),
])
def test_the_conflict_matrix_applies_to_live_reservations(client, held, wanted, conflict):
    assert open_run(client, "alice", held).status_code == 201
    response = open_run(client, "bob", wanted)
    assert response.status_code == (409 if conflict else 201), response.get_json()


def test_a_conflict_answer_lists_each_holding_and_says_who_since_when_until_when(client):
    first = open_run(client, "alice", ("module.web.*", "write")).get_json()["run"]
    response = open_run(client, "bob", ("module.web.*", "write"))
    body = response.get_json()
    assert response.status_code == 409 and body["code"] == "reservation_conflict"
    [conflict] = body["conflicts"]
    assert conflict["glob"] == "module.web.*" and conflict["mode"] == "write"
    assert conflict["holder"] == "alice" and conflict["run_id"] == first["id"]
    assert conflict["acquired_at"] and 14 * 60 < conflict["expires_in"] <= 15 * 60
    expected = f"reservation conflict on module.web.*: held by alice (run {first['id']}, acquired "
    assert body["error"].startswith(expected)
    assert "expires in 14m" in body["error"]


def test_acquisition_is_all_or_nothing(client, clean_db):
    open_run(client, "alice", ("module.db.*", "write"))
    before = table(clean_db)
    response = open_run(client, "bob", ("module.web.*", "write"), ("module.db.aws_rds.main", "read"))
    assert response.status_code == 409
    assert table(clean_db) == before
    assert [r["actor"] for r in client.get("/v1/engine/runs?state=shared").get_json()["runs"]] == ["alice"]


def test_a_run_never_conflicts_with_itself_when_it_acquires_more(client):
    run = open_run(client, "alice", ("module.web.*", "read")).get_json()["run"]
    more = client.post(f"/v1/engine/runs/{run['id']}/reservations",
                       json={"holder": "alice", "reservations": [{"glob": "module.web.x.y", "mode": "write"}]})
    assert more.status_code == 200, more.get_json()
    assert live(client) == [("module.web.*", "read", "alice"), ("module.web.x.y", "write", "alice")]


def test_release_close_and_abort_free_the_addresses(client):
    a = open_run(client, "alice", ("module.a.*", "write")).get_json()["run"]["id"]
    b = open_run(client, "bob", ("module.b.*", "write")).get_json()["run"]["id"]
    c = open_run(client, "carol", ("module.c.*", "write")).get_json()["run"]["id"]
    assert client.post(f"/v1/engine/runs/{a}/release", json={"holder": "alice"}).status_code == 200
    closed = client.post(f"/v1/engine/runs/{b}/close",
                         json={"holder": "bob", "status": "failed", "error_summary": "exit 1"}).get_json()
    assert closed["run"]["status"] == "failed" and closed["run"]["error_summary"] == "exit 1"
    aborted = client.post(f"/v1/engine/runs/{c}/abort", json={"reason": "operator"}).get_json()
    assert aborted["run"]["status"] == "aborted" and aborted["run"]["finished_at"]
    assert live(client) == []
    assert open_run(client, "dave", ("*", "write")).status_code == 201


@pytest.mark.parametrize("body, message", [
    ({"actor": "a", "reservations": [{"glob": "module.web*", "mode": "write"}]}, "invalid reservation glob"),
    ({"actor": "a", "reservations": [{"glob": "module.web.*", "mode": "exclusive"}]}, "unknown reservation mode"),
    ({"actor": "", "reservations": []}, "actor is required"),
    ({"actor": "a", "reservations": "module.web.*"}, "reservations must be a list"),
    ({"actor": "a", "reservations": [], "lease_seconds": 0}, "lease_seconds"),
    ({"actor": "a", "reservations": [], "wait_seconds": -1}, "wait_seconds"),
])
def test_bad_requests_are_400_and_change_nothing(client, clean_db, body, message):
    response = client.post(RUNS, json=body)
    assert response.status_code == 400
    assert message in response.get_json()["error"]
    assert table(clean_db) == []


def test_unknown_runs_and_other_holders_get_clear_errors(client, clean_db):
    run = open_run(client, "alice", ("module.web.*", "write")).get_json()["run"]["id"]
    before = table(clean_db)
    assert client.post("/v1/engine/runs/ar_nope/renew", json={"holder": "alice"}).status_code == 404
    wrong = client.post(f"/v1/engine/runs/{run}/renew", json={"holder": "mallory"})
    assert wrong.status_code == 403 and "held by alice, not mallory" in wrong.get_json()["error"]
    assert client.post(f"/v1/engine/runs/{run}/release", json={"holder": "mallory"}).status_code == 403
    assert client.post(f"/v1/engine/runs/{run}/release", json={}).status_code == 400
    assert table(clean_db) == before


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def test_a_holder_that_stops_heartbeating_loses_its_addresses_and_its_renew_fails(db, clean_db):
    who, clock = default_principal("test"), Clock()
    wanted = parse_wanted([("module.web.*", "write")])
    first = runs.open_run(db, who, "shared", actor="alice", wanted=wanted, lease=timedelta(minutes=15), clock=clock)
    clock.now += timedelta(minutes=10)
    runs.renew(db, who, first.id, holder="alice", clock=clock)  # heartbeat keeps it
    clock.now += timedelta(minutes=14)
    with pytest.raises(ReservationConflictError):
        runs.open_run(db, who, "shared", actor="bob", wanted=wanted, lease=timedelta(minutes=15), clock=clock)
    clock.now += timedelta(minutes=2)  # 16 minutes after the heartbeat: lapsed
    second = runs.open_run(db, who, "shared", actor="bob", wanted=wanted, lease=timedelta(minutes=15), clock=clock)
    assert runs.get_run(db, who, first.id).status == RunStatus.EXPIRED
    with pytest.raises(LeaseExpiredError):
        runs.renew(db, who, first.id, holder="alice", clock=clock)
    assert runs.get_run(db, who, second.id).status == RunStatus.RESERVED
    with psycopg.connect(clean_db) as conn:
        kinds = [k for (k,) in conn.execute("SELECT kind FROM events ORDER BY id")]
    assert "reservation_expired" in kinds and "reservation_renew" in kinds and "reservation_conflict" in kinds


def test_an_expired_lease_fails_renew_loudly_even_before_anyone_reclaims_it(db):
    who, clock = default_principal("test"), Clock()
    run = runs.open_run(db, who, "shared", actor="alice", wanted=parse_wanted([("a.b", "write")]),
                        lease=timedelta(seconds=30), clock=clock)
    clock.now += timedelta(seconds=31)
    with pytest.raises(LeaseExpiredError, match="stop"):
        runs.renew(db, who, run.id, holder="alice", clock=clock)
    assert runs.get_run(db, who, run.id).status == RunStatus.EXPIRED
    with pytest.raises(NotRunHolderError):
        runs.renew(db, who, run.id, holder="eve", clock=clock)


def test_an_acquire_with_a_wait_gets_the_addresses_once_they_are_released(client, live_server):
    import requests

    url = live_server.url + "/v1/engine/states/shared/runs"
    first = requests.post(url, json={"actor": "alice", "reservations": [{"glob": "module.web.*", "mode": "write"}]},
                          timeout=10).json()["run"]["id"]
    timer = threading.Timer(1.0, lambda: requests.post(
        f"{live_server.url}/v1/engine/runs/{first}/release", json={"holder": "alice"}, timeout=10))
    timer.start()
    body = {"actor": "bob", "wait_seconds": 20, "reservations": [{"glob": "module.web.x.y", "mode": "write"}]}
    queued = requests.post(url, json=body, timeout=30)
    assert queued.status_code == 202, queued.text
    ticket = queued.json()
    assert ticket["waiting"] and ticket["ticket"].startswith("wt_") and ticket["conflicts_total"] == 1
    assert queued.headers["Retry-After"] == "1" and ticket["ticket_expires_in"] == 10
    answers = []
    for _ in range(200):
        answer = requests.post(url, json={**body, "ticket": ticket["ticket"]}, timeout=30)
        answers.append(answer.status_code)
        if answer.status_code != 202:
            break
        time.sleep(0.1)
    assert answers[-1] == 201, answers
    # Once the ticket's deadline passes (here: wait_seconds 0 on the last ask) the answer is final.
    quick = requests.post(url, json={"actor": "carol", "wait_seconds": 0.5,
                                     "reservations": [{"glob": "module.web.*", "mode": "read"}]}, timeout=30)
    assert quick.status_code == 202
    final = requests.post(url, json={"actor": "carol", "wait_seconds": 0, "ticket": quick.json()["ticket"],
                                     "reservations": [{"glob": "module.web.*", "mode": "read"}]}, timeout=30)
    assert final.status_code == 409 and final.json()["code"] == "reservation_conflict"


def test_an_earlier_large_waiter_is_not_starved_by_later_small_requests(db):
    """A write on module.web.* waits behind a read; later small writes inside module.web must queue
    behind it instead of slipping in while the read is held."""
    who = default_principal("test")
    lease = timedelta(minutes=5)
    reader = runs.open_run(db, who, "shared", actor="reader", wanted=parse_wanted([("module.web.a.b", "read")]),
                           lease=lease)
    assert isinstance(reader, runs.Run)
    big = parse_wanted([("module.web.*", "write")])
    ticket = runs.open_run(db, who, "shared", actor="big", lease=lease, wait=timedelta(seconds=20), wanted=big)
    assert isinstance(ticket, runs.Ticket)  # the big request is queued now
    small = parse_wanted([("module.web.c.d", "write")])
    queued_small = runs.open_run(db, who, "shared", actor="small", lease=lease, wait=timedelta(seconds=5),
                                 wanted=small)
    assert isinstance(queued_small, runs.Ticket) and queued_small.conflicts == []
    with pytest.raises(ReservationConflictError, match="earlier waiting requests"):
        runs.open_run(db, who, "shared", actor="small", lease=lease, wanted=small,
                      policy=runs.WaitPolicy(ticket=queued_small.id))
    # Unrelated addresses never wait on the queue.
    runs.open_run(db, who, "shared", actor="other", lease=lease, wanted=parse_wanted([("module.db.*", "write")]))
    runs.release(db, who, reader.id, holder="reader")
    granted = runs.open_run(db, who, "shared", actor="big", lease=lease, wanted=big,
                            policy=runs.WaitPolicy(wait=timedelta(seconds=20), ticket=ticket.id))
    assert isinstance(granted, runs.Run)


# --- coexistence with Terraform's lock ---------------------------------------------------------

def test_a_terraform_lock_meets_live_reservations_with_a_useful_lock_info(client):
    run = open_run(client, "alice", ("module.web.*", "write")).get_json()["run"]
    response = client.open("/v1/states/shared", method="LOCK", data=lock_info("tf-1", who="bob@laptop"))
    assert response.status_code == 423
    info = json.loads(response.data)
    assert info["ID"] and info["Who"] == "alice"
    assert "module.web.*" in info["Info"] and run["id"] in info["Info"]
    assert datetime.fromisoformat(info["Created"].replace("Z", "+00:00"))


def test_a_lockless_whole_state_post_is_refused_while_reservations_are_live(client, clean_db):
    assert client.post("/v1/states/shared", data=counted_state(1, 1)).status_code == 200
    run = open_run(client, "alice", ("terraform_data.item[0]", "write")).get_json()["run"]["id"]
    response = client.post("/v1/states/shared", data=counted_state(2, 1, value="clobber"))
    assert response.status_code == 423
    assert client.delete("/v1/states/shared").status_code == 423
    client.post(f"/v1/engine/runs/{run}/release", json={"holder": "alice"})
    assert client.post("/v1/states/shared", data=counted_state(2, 1, value="fine")).status_code == 200


def test_while_terraform_holds_the_lock_every_acquire_conflicts_and_unlock_frees_only_that(client):
    assert client.open("/v1/states/shared", method="LOCK", data=lock_info("tf", who="bob@ci")).status_code == 200
    response = open_run(client, "alice", ("module.anything.*", "read"))
    assert response.status_code == 409
    body = response.get_json()
    assert body["conflicts"][0]["glob"] == "*" and body["conflicts"][0]["holder"] == "bob@ci"
    assert "Terraform state lock" in body["error"]
    assert live(client) == [("*", "write", "bob@ci")]
    client.open("/v1/states/shared", method="UNLOCK", data=lock_info("tf"))
    assert open_run(client, "alice", ("module.anything.*", "read")).status_code == 201
