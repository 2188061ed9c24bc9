"""/metrics in Prometheus text format: it parses with prometheus_client's own parser, counters move
as requests are made, gauges are read from the database, no label names a tenant or a state, and
structured JSON logs carry request ids but never bodies or secrets."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.config import AuthMode
from app.web.logs import JsonFormatter, RequestIdFilter
from tests.helpers import counted_state, lock_info

REPO = Path(__file__).resolve().parents[2]
STATE = "/v1/states/metrics-secret-state-name"
RUNS = "/v1/engine/states/metrics-secret-state-name/runs"


def scrape(client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:  # type: ignore[no-untyped-def]
    response = client.get("/metrics")
    assert response.status_code == 200, response.data[:300]
    assert response.headers["Content-Type"].startswith("text/plain; version=")
    found = {}
    for family in text_string_to_metric_families(response.get_data(as_text=True)):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(samples, name: str, **labels: str) -> float:  # type: ignore[no-untyped-def]
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def open_run(client, actor: str, glob: str, **extra):  # type: ignore[no-untyped-def]
    return client.post(RUNS, json={"actor": actor, "reservations": [{"glob": glob, "mode": "write"}], **extra})


def test_metrics_parse_and_http_requests_are_counted_by_lane_route_and_status(client):
    before = scrape(client)
    client.get("/v1/engine/states")
    client.get("/v1/engine/states")
    client.get("/v1/states/nope")
    client.get("/no/such/route")
    after = scrape(client)
    engine = {"lane": "engine", "route": "/v1/engine/states", "method": "GET", "status": "200"}
    assert value(after, "kilolock_http_requests_total", **engine) - value(before, "kilolock_http_requests_total",
                                                                            **engine) == 2
    backend = {"lane": "backend", "route": "/v1/states/<path:name>", "method": "GET", "status": "404"}
    assert value(after, "kilolock_http_requests_total", **backend) >= 1
    unmatched = {"lane": "other", "route": "unmatched", "method": "GET", "status": "404"}
    assert value(after, "kilolock_http_requests_total", **unmatched) >= 1
    latency = {"lane": "engine", "route": "/v1/engine/states", "method": "GET"}
    assert value(after, "kilolock_http_request_duration_seconds_count", **latency) - value(
        before, "kilolock_http_request_duration_seconds_count", **latency) == 2
    assert value(after, "kilolock_database_up") == 1


def test_state_lock_and_write_metrics_move_with_the_backend_lane(client):
    before = scrape(client)
    body = counted_state(1, 3)
    assert client.post(STATE, data=body).status_code == 200
    assert client.open(STATE, method="LOCK", data=lock_info("one")).status_code == 200
    assert client.open(STATE, method="LOCK", data=lock_info("two")).status_code == 423
    mid = scrape(client)
    assert value(mid, "kilolock_state_locks_held") == 1
    assert client.open(STATE + "?ID=one", method="UNLOCK", data=lock_info("one")).status_code == 200
    after = scrape(client)
    for name, moved in (("kilolock_state_lock_acquisitions_total", 1), ("kilolock_state_lock_conflicts_total", 1),
                        ("kilolock_state_lock_releases_total", 1), ("kilolock_state_write_bytes_count", 0)):
        labels = {}
        assert value(after, name, **labels) - value(before, name, **labels) == moved, name
    sizes = {"source": "http"}
    assert value(after, "kilolock_state_write_bytes_count", **sizes) - value(
        before, "kilolock_state_write_bytes_count", **sizes) == 1
    assert value(after, "kilolock_state_write_bytes_sum", **sizes) - value(
        before, "kilolock_state_write_bytes_sum", **sizes) == len(body)
    assert value(after, "kilolock_state_locks_held") == 0


def test_reservation_acquisitions_conflicts_and_waits_are_counted(client):
    client.post(STATE, data=counted_state(1, 3))
    before = scrape(client)
    first = open_run(client, "alice", "terraform_data.item[0]")
    assert first.status_code == 201
    assert open_run(client, "bob", "terraform_data.item[0]").status_code == 409
    queued = open_run(client, "bob", "terraform_data.item[0]", wait_seconds=0.3)
    assert queued.status_code == 202
    assert open_run(client, "bob", "terraform_data.item[0]", ticket=queued.get_json()["ticket"]).status_code == 409
    more = client.post(f"/v1/engine/runs/{first.get_json()['run']['id']}/reservations",
                       json={"holder": "alice", "reservations": [{"glob": "terraform_data.item[1]", "mode": "write"}]})
    assert more.status_code == 200
    after = scrape(client)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("kilolock_reservation_acquisitions_total", operation="open") == 1
    assert moved("kilolock_reservation_acquisitions_total", operation="more") == 1
    assert moved("kilolock_reservation_conflicts_total", operation="open") == 2
    assert moved("kilolock_reservation_wait_seconds_count", outcome="conflict") == 1
    assert moved("kilolock_reservation_wait_seconds_sum", outcome="conflict") > 0
    assert moved("kilolock_apply_runs_opened_total") == 1
    assert value(after, "kilolock_live_reservations") == 2
    assert value(after, "kilolock_apply_runs", status="reserved") == 1


def test_lease_expiries_are_counted_and_lapsed_reservations_show_until_reclaimed(client):
    client.post(STATE, data=counted_state(1, 2))
    run = open_run(client, "alice", "terraform_data.item[0]", lease_seconds=1).get_json()["run"]
    time.sleep(1.2)
    before = scrape(client)
    assert value(before, "kilolock_lapsed_reservations") == 1 and value(before, "kilolock_live_reservations") == 0
    answer = client.post(f"/v1/engine/runs/{run['id']}/renew", json={"holder": "alice"})
    assert answer.status_code == 409 and answer.get_json()["code"] == "lease_expired"
    after = scrape(client)
    assert value(after, "kilolock_reservation_expiries_total", operation="renew") - value(
        before, "kilolock_reservation_expiries_total", operation="renew") == 1
    assert value(after, "kilolock_lapsed_reservations") == 0
    assert value(after, "kilolock_apply_runs", status="expired") == 1


def test_apply_run_outcomes_durations_and_commit_latency_are_recorded(client):
    from tests.app.test_commit import result_state, trunk

    client.post("/v1/states/trunk", data=trunk())
    before = scrape(client)
    runs_url = "/v1/engine/states/trunk/runs"
    opened = [client.post(runs_url, json={"actor": "a", "base_serial": 1,
                                          "reservations": [{"glob": f"terraform_data.item[{i}]", "mode": "write"}]})
              for i in range(4)]
    ids = [o.get_json()["run"]["id"] for o in opened[:3]]
    assert client.post(f"/v1/engine/runs/{ids[0]}/close", json={"holder": "a", "status": "failed"}).status_code == 200
    assert client.post(f"/v1/engine/runs/{ids[1]}/abort", json={"reason": "test"}).status_code == 200
    commit = client.post(f"/v1/engine/runs/{ids[2]}/commit", json={
        "holder": "a", "state": result_state(**{"2": "C"}), "slice_addresses": ["terraform_data.item[2]"]})
    assert commit.status_code == 200 and commit.get_json()["commit"]["serial"] == 2
    outside = client.post(f"/v1/engine/runs/{opened[3].get_json()['run']['id']}/commit", json={
        "holder": "a", "state": result_state(**{"0": "X"}), "slice_addresses": ["terraform_data.item[0]"]})
    assert outside.status_code == 409
    after = scrape(client)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    for outcome in ("failed", "aborted", "committed"):
        assert moved("kilolock_apply_runs_finished_total", outcome=outcome) == 1, outcome
        assert moved("kilolock_apply_run_duration_seconds_count", outcome=outcome) == 1, outcome
    assert moved("kilolock_commit_duration_seconds_count", outcome="committed") == 1
    assert moved("kilolock_commit_duration_seconds_count", outcome=outside.get_json()["code"]) == 1
    assert moved("kilolock_state_write_bytes_count", source="commit") == 1
    assert value(after, "kilolock_apply_runs", status="committed") >= 1


def test_no_metric_label_names_a_state_or_a_holder(client):
    client.post(STATE, data=counted_state(1, 1))
    open_run(client, "holder-name-zz", "*")
    text = client.get("/metrics").get_data(as_text=True)
    assert "metrics-secret-state-name" not in text and "holder-name-zz" not in text


def test_a_metrics_token_guards_the_endpoint(settings):
    from app.web import create_app

    application = create_app(replace(settings, metrics_token="scrape-me-please"))
    try:
        client = application.test_client()
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.get("/metrics", headers={"Authorization": "Bearer scrape-me-please"}).status_code == 200
    finally:
        application.extensions["kilolock"].db.close()


def test_dashboard_logins_are_counted(settings, client):
    from app.web import create_app
    from tests.ui.conftest import login

    application = create_app(replace(settings, auth_mode=AuthMode.STATIC, auth_token="t" * 20))
    try:
        ui = application.test_client()
        before = scrape(client)
        assert login(ui, "wrong-token").status_code == 403
        assert login(ui, "t" * 20).status_code == 302
        after = scrape(client)
        for outcome in ("ok", "refused"):
            assert value(after, "kilolock_dashboard_logins_total", outcome=outcome) - value(
                before, "kilolock_dashboard_logins_total", outcome=outcome) == 1
    finally:
        application.extensions["kilolock"].db.close()


def test_every_documented_metric_is_exposed_and_every_exposed_one_documented(client):
    docs = (REPO / "docs" / "operations.md").read_text()
    table = docs.split("## Metrics reference", 1)[1].split("\n## ", 1)[0]
    documented = {re.sub(r"_total$", "", n) for n in re.findall(r"^\| `(kilolock_\w+)`", table, re.M)}
    text = client.get("/metrics").get_data(as_text=True)
    exposed = {f.name for f in text_string_to_metric_families(text) if f.name.startswith("kilolock_")}
    assert documented == exposed, (documented ^ exposed)


# --- structured logs -----------------------------------------------------------------------------------

def test_json_logs_carry_the_request_id_and_never_bodies_or_secrets(settings):
    from app.web import create_app

    token = "static-token-that-must-not-be-logged"
    application = create_app(replace(settings, auth_mode=AuthMode.STATIC, auth_token=token))
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RequestIdFilter())
    logger = logging.getLogger("kilolock")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        client = application.test_client()
        body = counted_state(1, 2, value="body-value-that-must-not-be-logged")
        auth = {"Authorization": f"Bearer {token}"}
        answer = client.post("/v1/states/prod", data=body, headers={**auth, "X-Request-Id": "req-abc.123"})
        forged = client.get("/v1/states/prod", headers={**auth, "X-Request-Id": "bad id \" level=forged"})
        client.get("/v1/states/prod", headers={"Authorization": "Bearer wrong-secret-that-must-not-be-logged"})
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        application.extensions["kilolock"].db.close()
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    requests = [line for line in lines if line["logger"] == "kilolock.web" and "method" in line]
    assert answer.headers["X-Request-Id"] == "req-abc.123"
    first = requests[0]
    assert first["request_id"] == "req-abc.123" and first["method"] == "POST" and first["status"] == 200
    assert first["path"] == "/v1/states/prod" and isinstance(first["duration_ms"], float)
    assert re.fullmatch(r"[0-9a-f]{16}", forged.headers["X-Request-Id"])
    assert requests[1]["request_id"] == forged.headers["X-Request-Id"]
    text = stream.getvalue()
    for secret in (token, "body-value-that-must-not-be-logged", "wrong-secret-that-must-not-be-logged"):
        assert secret not in text


def test_kl_log_format_json_makes_the_service_log_json_lines(clean_db):
    code = ("from app.web import create_app\n"
            "app = create_app()\n"
            "app.test_client().get('/healthz', headers={'X-Request-Id': 'json-probe-1'})\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KL_")}
    env.update(KL_DATABASE_URL=clean_db, KL_LOG_FORMAT="json", KL_AUTO_MIGRATE="false")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.strip()]
    assert any(line.get("request_id") == "json-probe-1" and line.get("path") == "/healthz" for line in lines)
    assert any(line["level"] == "WARNING" and "KL_AUTH_MODE=open" in line["message"] for line in lines)


@pytest.mark.parametrize("raw", ["xml", "JSONL"])
def test_unknown_log_formats_are_refused(raw):
    from app.config import Settings
    from app.errors import ConfigError

    with pytest.raises(ConfigError, match="KL_LOG_FORMAT"):
        Settings.from_env({"KL_LOG_FORMAT": raw})


def test_bot_job_durations_recorded_by_workers_are_exported_from_the_database(client):
    from app.domain.jobs import PullRequestArgs
    from app.store import bot

    db = client.application.extensions["kilolock"].db
    before = scrape(client)
    bot.claim(db, "metrics-job-1", PullRequestArgs("acme/metrics", 1, "a" * 40))
    bot.finish_job(db, "metrics-job-1", bot.JobStatus.SUCCEEDED, {})
    bot.claim(db, "metrics-job-2", PullRequestArgs("acme/metrics", 2, "b" * 40))
    bot.finish_job(db, "metrics-job-2", bot.JobStatus.FAILED, {})
    bot.claim(db, "metrics-job-3", PullRequestArgs("acme/metrics", 3, "c" * 40))  # still running: not counted
    after = scrape(client)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    job = {"job": "pull_request"}
    assert moved("kilolock_job_duration_seconds_count", **job, outcome="succeeded") == 1
    assert moved("kilolock_job_duration_seconds_count", **job, outcome="failed") == 1
    assert moved("kilolock_job_duration_seconds_bucket", **job, outcome="succeeded", le="+Inf") == 1
    assert moved("kilolock_job_duration_seconds_bucket", **job, outcome="succeeded", le="5.0") == 1
    assert 0 <= moved("kilolock_job_duration_seconds_sum", **job, outcome="succeeded") < 5
