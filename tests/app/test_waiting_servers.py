"""Waiting requests never occupy the server: with 50 clients queued on a conflict, /healthz, renew,
unrelated requests and the holder's close are answered, on gunicorn and on the werkzeug dev server.
The waiters are real ``kl`` engine clients re-polling with their tickets; once they stop asking,
their places lapse and none of them is ever granted. No timing asserts: generous timeouts only."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import requests

from analyzer.globs import Mode, Reservation
from runner.core.config import ClientConfig
from runner.core.engine_client import EngineClient, EngineError
from tests.conftest import wait_for

WAITERS = 50
WINDOW = 5  # KL_WAIT_TICKET_SECONDS for these servers
REPO = Path(__file__).resolve().parents[2]


class _Stopped(Exception):
    pass


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def gunicorn_url(clean_db: str, tmp_path: Path) -> Iterator[str]:
    port = _free_port()
    env = {**os.environ, "KL_DATABASE_URL": clean_db, "KL_AUTH_MODE": "open", "KL_WAIT_TICKET_SECONDS": str(WINDOW),
           "KL_DATA_DIR": str(tmp_path), "KL_DB_POOL_SIZE": "4"}
    env.pop("KL_REDIS_URL", None)
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "gunicorn"), "--worker-class", "gthread", "--workers", "1",
         "--threads", "4", "--timeout", "300", "--bind", f"127.0.0.1:{port}", "app.web:create_app()"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return requests.get(url + "/healthz", timeout=30).status_code == 200
        except requests.RequestException:  # not listening yet, or a worker still booting on a busy machine
            assert proc.poll() is None, (proc.stderr.read() if proc.stderr else b"").decode()[-2000:]
            return False

    wait_for(up, "gunicorn to start", timeout=180)
    yield url
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def _fresh_waiters(db_url: str) -> int:
    with psycopg.connect(db_url) as conn:
        (count,) = conn.execute("SELECT count(*) FROM reservation_waiters "
                                "WHERE seen_at > now() - make_interval(secs => %s)", (WINDOW,)).fetchone() or (0,)
    return int(count)


def _exercise(url: str, db_url: str) -> None:
    runs_url = url + "/v1/engine/states/shared/runs"
    holder = requests.post(runs_url, json={"actor": "alice", "lease_seconds": 600,
                                           "reservations": [{"glob": "module.web.*", "mode": "write"}]}, timeout=60)
    assert holder.status_code == 201, holder.text
    run_id = holder.json()["run"]["id"]
    stop = threading.Event()
    outcomes: dict[int, object] = {}

    def sleep(seconds: float) -> None:
        if stop.wait(seconds):
            raise _Stopped

    def waiter(i: int) -> None:
        client = EngineClient(ClientConfig(base_url=url, state="shared", username=None, token=None),
                              timeout=120, sleep=sleep)
        try:
            outcomes[i] = client.open_run("shared", actor=f"waiter-{i}", wait_seconds=600,
                                          reservations=[Reservation(f"module.web.w{i}.x", Mode.WRITE)])
        except _Stopped:
            outcomes[i] = "stopped"
        except EngineError as exc:
            outcomes[i] = exc.code

    threads = [threading.Thread(target=waiter, args=(i,), daemon=True) for i in range(WAITERS)]
    for t in threads:
        t.start()
    wait_for(lambda: _fresh_waiters(db_url) >= WAITERS, f"{WAITERS} queued tickets")

    # While all of them wait, the server answers everyone else.
    for _ in range(5):
        assert requests.get(url + "/healthz", timeout=30).status_code == 200
        renewed = requests.post(f"{url}/v1/engine/runs/{run_id}/renew", json={"holder": "alice"}, timeout=30)
        assert renewed.status_code == 200, renewed.text
    other = requests.post(runs_url, json={"actor": "bob", "reservations": [{"glob": "module.db.*", "mode": "write"}]},
                          timeout=30)
    assert other.status_code == 201, other.text
    assert _fresh_waiters(db_url) >= WAITERS, "every waiter still holds its place"

    # The waiters' clients go away (Ctrl-C, a cancelled job): they stop asking.
    stop.set()
    for t in threads:
        t.join(timeout=120)
    assert set(outcomes.values()) == {"stopped"}, outcomes
    closed = requests.post(f"{url}/v1/engine/runs/{run_id}/close", json={"holder": "alice", "status": "aborted"},
                           timeout=30)
    assert closed.status_code == 200
    wait_for(lambda: _fresh_waiters(db_url) == 0, "the tickets to lapse", timeout=60)
    # Nobody is granted on a lapsed ticket: the addresses are free for a newcomer at once.
    whole = [{"glob": "module.web.*", "mode": "write"}]
    fresh = requests.post(runs_url, json={"actor": "carol", "reservations": whole}, timeout=30)
    assert fresh.status_code == 201, fresh.text
    listed = requests.get(url + "/v1/engine/runs", timeout=30).json()["runs"]
    assert not [r for r in listed if r["actor"].startswith("waiter-")]


def test_fifty_waiters_do_not_exhaust_gunicorn(gunicorn_url: str, clean_db: str) -> None:
    _exercise(gunicorn_url, clean_db)


def test_fifty_waiters_do_not_exhaust_the_werkzeug_dev_server(  # type: ignore[no-untyped-def]
    live_server_factory, clean_db: str
) -> None:
    server = live_server_factory(wait_ticket_seconds=WINDOW)
    _exercise(server.url, clean_db)


def test_a_waiting_client_is_granted_once_the_holder_closes(live_server_factory) -> None:  # type: ignore[no-untyped-def]
    server = live_server_factory(wait_ticket_seconds=WINDOW)
    runs_url = server.url + "/v1/engine/states/shared/runs"
    held = requests.post(runs_url, json={"actor": "alice", "reservations": [{"glob": "a.b", "mode": "write"}]},
                         timeout=30).json()["run"]["id"]
    client = EngineClient(ClientConfig(base_url=server.url, state="shared", username=None, token=None), timeout=60)
    timer = threading.Timer(1.5, lambda: requests.post(f"{server.url}/v1/engine/runs/{held}/close",
                                                       json={"holder": "alice", "status": "aborted"}, timeout=30))
    timer.start()
    answer = client.open_run("shared", actor="bob", wait_seconds=120, reservations=[Reservation("a.b", Mode.WRITE)])
    timer.join()
    assert answer.run.actor == "bob" and answer.run.status == "reserved"
    # A wait that runs out ends with the server's final refusal.
    with pytest.raises(EngineError) as refused:
        client.open_run("shared", actor="carol", wait_seconds=1.5, reservations=[Reservation("a.b", Mode.WRITE)])
    assert refused.value.status == 409 and refused.value.code == "reservation_conflict"
