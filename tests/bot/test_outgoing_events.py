"""Outgoing events end to end: real Postgres, real Redis, real RQ workers (separate processes) and a real
HTTP receiver. The events come from the store's own audit records (runs opened, granted, refused, failed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from app.domain import outgoing
from app.domain.outgoing import AuditRow, EndpointFilter
from app.domain.principal import Principal
from app.domain.reservations import RunStatus, parse_wanted
from app.errors import BadRequestError, ReservationConflictError
from app.store import outbox, runs
from app.store.db import Database
from runner.bot.outgoing import redrive
from tests.conftest import wait_for

REPO = Path(__file__).resolve().parents[2]

TOKEN_NAME = "ci-deploy-token-0123456789abcdef"  # must never leave in an event
SECRET_VALUE = "hunter2-very-secret-password"


class Receiver:
    """A local HTTP server recording each POST per path; ``fail[path]`` answers that many 500s first
    (-1: always)."""

    def __init__(self) -> None:
        self.got: dict[str, list[tuple[dict[str, str], bytes]]] = {}
        self.fail: dict[str, int] = {}
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                left = receiver.fail.get(self.path, 0)
                if left:
                    receiver.fail[self.path] = left - 1 if left > 0 else -1
                    receiver.got.setdefault(self.path + ":refused", []).append((dict(self.headers), body))
                    self.send_response(500)
                else:
                    receiver.got.setdefault(self.path, []).append((dict(self.headers), body))
                    self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def events(self, path: str) -> list[dict[str, object]]:
        return [json.loads(body) for _, body in self.got.get(path, [])]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()


def _worker(tmp_path: Path, database_url: str, redis_url: str, name: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "KL_DATABASE_URL": database_url, "KL_REDIS_URL": redis_url, "KL_DATA_DIR": str(tmp_path),
           "KL_EVENT_RETRY_SECONDS": "1,1", "KL_EVENT_POLL_SECONDS": "1", "KL_EVENT_TIMEOUT_SECONDS": "2"}
    code = ("from app.config import Settings; from runner.bot.jobs import work; "
            f"work(Settings.from_env(), name={name!r})")
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def _stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=60)


def _run(db: Database, state: str, glob: str, principal: Principal) -> str:
    """A run opened (run.opened, run.granted), then failed (run.failed); returns its id."""
    run = runs.open_run(db, principal, state, actor="alice", wanted=parse_wanted([(glob, "write")]),
                        lease=timedelta(minutes=5))
    assert not isinstance(run, runs.Ticket)
    runs.close_run(db, principal, run.id, holder="alice", status=RunStatus.FAILED)
    return run.id


def test_events_delivered_signed_in_order_retried_dead_lettered_and_survive_a_worker_restart(
        db: Database, clean_db: str, redis_url: str, receiver: Receiver, tmp_path: Path) -> None:
    who = Principal(tenant_id=1, actor="alice", token_name=TOKEN_NAME)
    ok, secret = outbox.add_endpoint(db, name="ok", url=receiver.url + "/ok")
    outbox.add_endpoint(db, name="dead", url=receiver.url + "/dead")
    outbox.add_endpoint(db, name="db-only", url=receiver.url + "/db", globs=["module.db.*"], states=["a"])
    outbox.add_endpoint(db, name="slack", url=receiver.url + "/slack", fmt="slack", states=["b"])
    receiver.fail["/ok"] = 1      # a receiver error first: retried, then delivered
    receiver.fail["/dead"] = -1   # never accepts: dead after the last retry
    worker = _worker(tmp_path, clean_db, redis_url, "events-1")
    try:
        first = [_run(db, "a", "module.db.aws_db_instance.main", who), _run(db, "b", "aws_s3_bucket.logs", who)]
        with pytest.raises(ReservationConflictError):
            held = runs.open_run(db, who, "a", actor="bob", wanted=parse_wanted([("module.db.*", "write")]),
                                 lease=timedelta(minutes=5))
            assert not isinstance(held, runs.Ticket)
            runs.open_run(db, who, "a", actor="carol", wanted=parse_wanted([("module.db.aws_db_instance.main",
                                                                              "write")]), lease=timedelta(minutes=5))
        wait_for(lambda: len(receiver.events("/ok")) >= 7, "the first events at /ok")
        _stop(worker, signal.SIGKILL)  # mid-stream: nothing acknowledged later is lost
        second = [_run(db, "a", "module.dbx.aws_db_instance.main", who), _run(db, "b", "aws_s3_bucket.logs", who)]
        worker = _worker(tmp_path, clean_db, redis_url, "events-2")
        wait_for(lambda: {e["run"] for e in receiver.events("/ok") if e["type"] == "run.failed"}
                 >= set(first + second), "every run's failure at /ok", timeout=180)
        wait_for(lambda: outbox.deliveries(db, status="dead"), "a dead letter for /dead", timeout=180)
    finally:
        _stop(worker)

    got = receiver.events("/ok")
    assert len(receiver.got["/ok:refused"]) >= 1
    unique = {e["id"]: e for e in got}  # at-least-once: de-duplicated by id
    assert {e["schema"] for e in got} == {outgoing.SCHEMA}
    types = [e["type"] for e in unique.values()]
    assert types.count("run.opened") == 5 and types.count("run.granted") == 5 and "conflict.refused" in types
    for state in ("a", "b"):
        seq = [e["sequence"] for e in got if e["state"] == state]
        firsts = list(dict.fromkeys(seq))
        assert firsts == sorted(firsts), f"events of state {state} out of order"
    # Signed over the exact body, with a timestamp.
    for headers, body in receiver.got["/ok"]:
        stamp = int(headers["X-Kilolock-Timestamp"])
        assert outgoing.verify(secret, stamp, body, headers["X-Kilolock-Signature"], now=stamp)
        assert not outgoing.verify(secret, stamp, body + b" ", headers["X-Kilolock-Signature"], now=stamp)
        assert not outgoing.verify("wrong", stamp, body, headers["X-Kilolock-Signature"], now=stamp)
        assert headers["X-Kilolock-Event-Id"] == json.loads(body)["id"]
    # Filters: state and parsed glob (module.db covers module.db.*, never module.dbx.*).
    filtered = receiver.events("/db")
    assert filtered and all(e["state"] == "a" for e in filtered)
    assert all(any(a.startswith("module.db.") for a in e["globs"]) for e in filtered)
    assert not any("module.dbx" in g for e in filtered for g in e["globs"])
    slack = receiver.events("/slack")
    assert slack and all(set(m) == {"text"} and "`b`" in m["text"] for m in slack)
    # Dead letters: recorded, and the stream went on past them.
    dead = outbox.deliveries(db, status="dead")
    assert all(d.endpoint == "dead" and d.attempts == 3 for d in dead)
    receiver.fail["/dead"] = 0  # the receiver is fixed: an operator re-drives one dead letter
    assert redrive(db, "dead", dead[-1].event_id, timeout=5)
    assert receiver.events("/dead")[0]["id"] == f"evt_{dead[-1].event_id}"
    everything = b"".join(b for path in receiver.got.values() for _, b in path)
    assert TOKEN_NAME.encode() not in everything and secret.encode() not in everything
    assert ok.secret not in repr(ok) and "secret" not in ok.to_json()


def test_event_allow_list_keeps_values_and_tokens_home() -> None:
    row = AuditRow(7, 1, "", "net", "run_commit", "alice", 4,
                   {"token": TOKEN_NAME, "run_id": "run_1", "addresses": ["aws_db_instance.main"],
                    "value": SECRET_VALUE, "attributes": {"password": SECRET_VALUE}, "created": 1},
                   datetime(2026, 1, 1, tzinfo=UTC))
    event = outgoing.to_event(row)
    assert event is not None and event["type"] == "run.committed" and event["addresses"] == ["aws_db_instance.main"]
    body = outgoing.body_of(event, "webhook") + outgoing.body_of(event, "slack")
    assert TOKEN_NAME.encode() not in body and SECRET_VALUE.encode() not in body
    drift = AuditRow(8, 1, "", "net", "drift_check", "bot", 4, {"drifted": 0, "outstanding": 0,
                                                               "outstanding_before": 2}, row.created_at)
    assert outgoing.event_type(drift) == "drift.cleared"
    assert outgoing.event_type(AuditRow(9, 1, "", "net", "state_write", "x", 1, {}, row.created_at)) is None


def test_filters_and_endpoint_checks() -> None:
    only_db = EndpointFilter(globs=("module.db.*",))
    assert only_db.wants({"state": "s", "addresses": ["module.db.aws_x.y"], "globs": []})
    assert not only_db.wants({"state": "s", "addresses": ["module.dbx.aws_x.y"], "globs": ["module.dbx.*"]})
    assert only_db.wants({"state": "s", "addresses": [], "globs": ["module.db.aws_x.y"]})
    assert not only_db.wants({"state": "s", "addresses": [], "globs": []})
    for url in ("ftp://example.com/x", "http://user:pw@example.com/", "example.com", "http:///x"):
        with pytest.raises(BadRequestError):
            outgoing.check_endpoint(url, "webhook", ())
    with pytest.raises(BadRequestError):
        outgoing.check_endpoint("https://example.com/x", "webhook", ("module..x",))
    assert outgoing.backoff(1, (5, 30)) == 5 and outgoing.backoff(3, (5, 30)) is None


def test_kl_events_commands(clean_db: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from runner.cli import main

    monkeypatch.setenv("KL_DATABASE_URL", clean_db)
    assert main(["events", "endpoints", "add", "bad", "ftp://example.com/x"]) == 3
    assert main(["events", "endpoints", "add", "bad", "https://example.com/x", "--glob", "module.db"]) == 3
    capsys.readouterr()
    assert main(["events", "endpoints", "add", "chat", "https://hooks.example.com/x", "--format", "slack",
                 "--state", "prod", "--glob", "module.db.*", "--json"]) == 0
    secret = json.loads(capsys.readouterr().out)["secret"]
    assert main(["events", "endpoints", "list", "--json"]) == 0
    listed = capsys.readouterr().out
    assert json.loads(listed)[0]["globs"] == ["module.db.*"] and secret not in listed
    assert main(["events", "deliveries", "--dead", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(["events", "redrive", "chat", "nope"]) == 3
    assert main(["events", "endpoints", "remove", "chat"]) == 0
    assert main(["events", "endpoints", "remove", "chat"]) == 3
