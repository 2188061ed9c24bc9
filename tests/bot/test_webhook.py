"""POST /webhooks/github against the real app, Postgres and Redis, with GitHub's published payloads.

Every request runs inside a ``responses`` mock with nothing registered: the webhook must not call
GitHub's API (nor anything else over HTTP), and each test asserts that no call was made.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import redis
import responses
from rq import Queue

from app.domain.jobs import (
    ClosedArgs,
    CommentArgs,
    JobKind,
    MergeArgs,
    PullRequestArgs,
    PushArgs,
    RerunArgs,
    job_id,
)
from app.domain.webhooks import route
from app.queue import JOBS, QUEUE_NAME
from app.store import bot as store
from app.web.metrics import REGISTRY
from bench.webhooks import (
    HEAD_SHA,
    MERGE_SHA,
    REPO,
    SECRET,
    check_run_payload,
    encode,
    headers,
    issue_comment_payload,
    merged_payload,
    payload,
    raw,
    sign,
)

URL = "/webhooks/github"
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def no_http() -> Iterator[responses.RequestsMock]:
    """Any HTTP call from the webhook (GitHub's API or anything else) would show up here."""
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        yield mock
        assert len(mock.calls) == 0, [c.request.url for c in mock.calls]


def queued(redis_url: str) -> list[Any]:
    """The jobs waiting on the kilolock queue, oldest first."""
    connection = redis.Redis.from_url(redis_url)
    try:
        return Queue(QUEUE_NAME, connection=connection, serializer="rq.serializers.JSONSerializer").jobs
    finally:
        connection.close()


def redis_keys(redis_url: str) -> list[bytes]:
    with redis.Redis.from_url(redis_url) as connection:
        return list(connection.keys("*"))


def post(client, event: str, body: bytes, **kwargs: Any):  # type: ignore[no-untyped-def]
    return client.post(URL, data=body, headers=headers(event, body, **kwargs))


def delivered(client, event: str, doc: dict[str, Any], delivery: str | None = None):  # type: ignore[no-untyped-def]
    return post(client, event, encode(doc), delivery=delivery)


def deliveries_count(bot_db) -> int:  # type: ignore[no-untyped-def]
    with bot_db.transaction() as conn:
        row = conn.execute("SELECT count(*) FROM webhook_deliveries").fetchone()
    return int(row[0])


def metric(event: str, outcome: str) -> float:
    return REGISTRY.get_sample_value("kilolock_webhook_deliveries_total", {"event": event, "outcome": outcome}) or 0.0


# --- signatures, size, secret -------------------------------------------------------------------


def test_githubs_test_vector_signs_as_documented():
    assert sign(b"Hello, World!", "It's a Secret to Everybody") == (
        "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17")


def test_a_signed_pull_request_opened_is_queued_as_a_footprint_job(bot_client, bot_db, redis_url):
    delivery = str(uuid.uuid4())
    response = post(bot_client, "pull_request", raw("pull_request/opened"), delivery=delivery)

    expected_id = job_id("pull_request", REPO, 2, HEAD_SHA)
    assert response.status_code == 202
    assert response.get_json() == {"ok": True, "status": "queued", "delivery": delivery, "job_ids": [expected_id]}
    [job] = queued(redis_url)
    assert (job.id, job.func_name, job.kwargs) == (expected_id, JOBS[JobKind.PULL_REQUEST],
                                                   PullRequestArgs(REPO, 2, HEAD_SHA).to_kwargs())
    assert job.func_name == "runner.bot.jobs.pull_request_footprint"
    assert job.timeout == bot_client.application.extensions["kilolock"].settings.job_timeout
    recorded = store.get_delivery(bot_db, delivery)
    assert recorded is not None
    assert (recorded.event, recorded.action, recorded.repo, recorded.status, recorded.job_ids) == (
        "pull_request", "opened", REPO, "queued", [expected_id])


@pytest.mark.parametrize("allowed", [(), ("Codertocat/Other",), ("Octocat/*",), ("codertocat/hello-world2",)])
def test_a_delivery_for_a_repository_outside_the_allowlist_is_acknowledged_recorded_and_not_queued(
        bot_settings, bot_db, redis_url, allowed, caplog):
    from app.web import create_app

    application = create_app(replace(bot_settings, github_repositories=allowed))
    delivery = str(uuid.uuid4())
    try:
        with caplog.at_level("WARNING", logger="kilolock.webhook"):
            response = post(application.test_client(), "pull_request", raw("pull_request/opened"), delivery=delivery)
    finally:
        application.extensions["kilolock"].db.close()

    assert response.status_code == 200  # a 2xx: GitHub does not retry it
    body = response.get_json()
    assert body["status"] == "ignored" and "KL_GITHUB_REPOSITORIES" in body["reason"]
    assert queued(redis_url) == []
    recorded = store.get_delivery(bot_db, delivery)
    assert recorded is not None and (recorded.repo, recorded.status) == (REPO, "ignored")
    assert "not in KL_GITHUB_REPOSITORIES" in recorded.detail["reason"]
    assert any(REPO in r.getMessage() and "not an allowed repository" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("allowed", [("Codertocat/Hello-World",), ("codertocat/*",), ("*",)])
def test_an_allowed_repository_by_name_owner_or_star_is_queued(bot_settings, redis_url, allowed):
    from app.web import create_app

    application = create_app(replace(bot_settings, github_repositories=allowed))
    try:
        response = post(application.test_client(), "pull_request", raw("pull_request/opened"))
    finally:
        application.extensions["kilolock"].db.close()
    assert response.status_code == 202 and len(queued(redis_url)) == 1


def test_repository_patterns_are_validated_when_the_settings_are_read():
    from app.config import Settings
    from app.errors import ConfigError

    settings = Settings.from_env({"KL_GITHUB_REPOSITORIES": "acme/infra, Acme-2/*"})
    assert settings.github_repositories == ("acme/infra", "Acme-2/*")
    with pytest.raises(ConfigError, match="KL_GITHUB_REPOSITORIES"):
        Settings.from_env({"KL_GITHUB_REPOSITORIES": "acme, */infra"})


def test_an_unsigned_delivery_is_refused_with_401_and_nothing_recorded_or_queued(bot_client, bot_db, redis_url):
    response = post(bot_client, "pull_request", raw("pull_request/opened"), secret=None)

    assert response.status_code == 401
    assert response.get_json()["code"] == "signature_missing"
    assert "X-Hub-Signature-256" in response.get_json()["error"]
    assert deliveries_count(bot_db) == 0
    assert queued(redis_url) == [] and redis_keys(redis_url) == []


@pytest.mark.parametrize("how", ["wrong secret", "tampered body", "sha1 form", "garbage"])
def test_a_badly_signed_delivery_is_refused_with_403_and_nothing_recorded_or_queued(bot_client, bot_db, redis_url,
                                                                                     how):
    body = raw("pull_request/opened")
    sent = headers("pull_request", body)
    if how == "wrong secret":
        sent["X-Hub-Signature-256"] = sign(body, "not the secret")
    elif how == "tampered body":
        body = body.replace(b'"opened"', b'"closed"', 1)
    elif how == "sha1 form":
        sent["X-Hub-Signature-256"] = sent["X-Hub-Signature-256"].replace("sha256=", "sha1=")
    else:
        sent["X-Hub-Signature-256"] = "sha256=é"

    response = bot_client.post(URL, data=body, headers=sent)

    assert response.status_code == 403
    assert response.get_json()["code"] == "signature_invalid"
    assert deliveries_count(bot_db) == 0
    assert queued(redis_url) == [] and redis_keys(redis_url) == []


def test_every_delivery_is_refused_when_no_secret_is_configured(settings, redis_url, bot_db):
    from app.web import create_app

    before = metric("pull_request", "rejected")
    application = create_app(replace(settings, github_webhook_secret=None, redis_url=redis_url))
    try:
        client = application.test_client()
        for event, body, secret in [("pull_request", raw("pull_request/opened"), SECRET),
                                    ("pull_request", raw("pull_request/opened"), None),
                                    ("ping", raw("ping"), ""),
                                    ("push", raw("push/with-new-branch"), "anything")]:
            response = post(client, event, body, secret=secret)
            assert response.status_code == 403, event
            assert response.get_json()["code"] == "webhook_secret_unset"
            assert "KL_GITHUB_WEBHOOK_SECRET" in response.get_json()["error"]
    finally:
        application.extensions["kilolock"].db.close()
    assert deliveries_count(bot_db) == 0
    assert queued(redis_url) == [] and redis_keys(redis_url) == []
    assert metric("pull_request", "rejected") == before + 2


def test_a_body_over_the_limit_is_refused_with_413(settings, redis_url, bot_db):
    from app.web import create_app

    body = raw("pull_request/opened")
    application = create_app(replace(settings, github_webhook_secret=SECRET, redis_url=redis_url,
                                      webhook_max_bytes=len(body) - 1))
    try:
        client = application.test_client()
        response = post(client, "pull_request", body)
        at_limit = post(client, "ping", raw("ping"))
    finally:
        application.extensions["kilolock"].db.close()

    assert response.status_code == 413
    assert "KL_WEBHOOK_MAX_BYTES" in response.get_json()["error"]
    assert at_limit.status_code == 200
    assert deliveries_count(bot_db) == 1  # the ping only
    assert queued(redis_url) == []


def test_a_body_without_content_length_over_the_limit_is_refused_with_413(settings, redis_url, bot_db):
    from app.web import create_app

    body = raw("pull_request/opened")
    application = create_app(replace(settings, github_webhook_secret=SECRET, redis_url=redis_url,
                                      webhook_max_bytes=1000))
    try:
        sent = {**headers("pull_request", body), "Transfer-Encoding": "chunked"}
        # What a server passes on for a chunked body: no length, an input stream that ends by itself.
        environ = {"wsgi.input_terminated": True, "CONTENT_LENGTH": ""}
        response = application.test_client().post(URL, input_stream=io.BytesIO(body), headers=sent,
                                                  environ_overrides=environ)
    finally:
        application.extensions["kilolock"].db.close()
    assert response.status_code == 413
    assert deliveries_count(bot_db) == 0


# --- deduplication ------------------------------------------------------------------------------


def test_a_redelivery_is_acknowledged_and_not_run_again(bot_client, bot_db, redis_url):
    delivery = str(uuid.uuid4())
    first = post(bot_client, "pull_request", raw("pull_request/opened"), delivery=delivery)
    again = post(bot_client, "pull_request", raw("pull_request/opened"), delivery=delivery)

    assert first.status_code == 202
    assert again.status_code == 200
    assert again.get_json() == {"ok": True, "status": "already processed", "delivery": delivery}
    assert len(queued(redis_url)) == 1
    assert deliveries_count(bot_db) == 1


def test_a_redelivery_after_the_queue_was_down_is_processed(bot_settings, redis_url, bot_db):
    from app.web import create_app

    delivery = str(uuid.uuid4())
    down = create_app(replace(bot_settings, redis_url="redis://127.0.0.1:1/0"))
    try:
        failed = post(down.test_client(), "pull_request", raw("pull_request/opened"), delivery=delivery)
    finally:
        down.extensions["kilolock"].db.close()
    recorded = store.get_delivery(bot_db, delivery)
    assert failed.status_code == 503
    assert recorded is not None and recorded.status == "failed"
    assert "enqueue failed" in recorded.detail["error"]

    up = create_app(bot_settings)
    try:
        retried = post(up.test_client(), "pull_request", raw("pull_request/opened"), delivery=delivery)
    finally:
        up.extensions["kilolock"].db.close()
    assert retried.status_code == 202
    assert [j.id for j in queued(redis_url)] == [job_id("pull_request", REPO, 2, HEAD_SHA)]


def test_concurrent_copies_of_one_delivery_queue_it_once(bot_app, redis_url):
    delivery = str(uuid.uuid4())
    body = raw("pull_request/opened")
    barrier = threading.Barrier(6)
    statuses: list[int] = []

    def deliver() -> None:
        client = bot_app.test_client()
        barrier.wait()
        statuses.append(client.post(URL, data=body, headers=headers("pull_request", body, delivery=delivery))
                        .status_code)

    threads = [threading.Thread(target=deliver) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(statuses) == [200] * 5 + [202]
    assert len(queued(redis_url)) == 1


def test_the_same_change_through_two_deliveries_queues_one_job(bot_client, redis_url):
    first = post(bot_client, "pull_request", raw("pull_request/synchronize"))
    second = post(bot_client, "pull_request", raw("pull_request/synchronize"))

    assert first.status_code == second.status_code == 202
    assert first.get_json()["job_ids"] == second.get_json()["job_ids"]
    assert len(queued(redis_url)) == 1


# --- routing ------------------------------------------------------------------------------------


def test_ping_is_answered_200_and_recorded_as_ignored(bot_client, bot_db, redis_url):
    delivery = str(uuid.uuid4())
    response = post(bot_client, "ping", raw("ping"), delivery=delivery)

    assert response.status_code == 200
    assert response.get_json()["status"] == "ignored"
    recorded = store.get_delivery(bot_db, delivery)
    assert recorded is not None and (recorded.event, recorded.status) == ("ping", "ignored")
    assert queued(redis_url) == []


def test_synchronize_queues_a_footprint_job_for_the_new_head(bot_client, redis_url):
    doc = payload("pull_request/synchronize")
    response = delivered(bot_client, "pull_request", doc)

    [job] = queued(redis_url)
    assert response.status_code == 202
    assert (job.func_name, job.kwargs) == ("runner.bot.jobs.pull_request_footprint",
                                            PullRequestArgs(REPO, 2, doc["after"]).to_kwargs())
    assert job.id == job_id("pull_request", REPO, 2, doc["pull_request"]["head"]["sha"])


def test_reopened_queues_a_footprint_job_of_its_own(bot_client, redis_url):
    post(bot_client, "pull_request", raw("pull_request/opened"))
    doc = payload("pull_request/opened")
    doc["action"] = "reopened"
    delivery = str(uuid.uuid4())
    delivered(bot_client, "pull_request", doc, delivery=delivery)

    opened, reopened = queued(redis_url)
    assert opened.kwargs == reopened.kwargs == PullRequestArgs(REPO, 2, HEAD_SHA).to_kwargs()
    assert reopened.id == job_id("pull_request", REPO, 2, HEAD_SHA, delivery) != opened.id


def test_closed_without_merge_drops_the_footprint_even_though_merge_commit_sha_is_set(bot_client, redis_url):
    doc = payload("pull_request/closed")
    assert doc["pull_request"]["merged"] is False and doc["pull_request"]["merge_commit_sha"]
    delivery = str(uuid.uuid4())
    response = delivered(bot_client, "pull_request", doc, delivery=delivery)

    [job] = queued(redis_url)
    assert response.status_code == 202
    assert (job.func_name, job.kwargs) == ("runner.bot.jobs.pull_request_closed", ClosedArgs(REPO, 2).to_kwargs())
    assert job.id == job_id("pull_request_closed", REPO, 2, delivery)


def test_closed_with_merged_true_queues_a_merge_on_the_merge_commit(bot_client, redis_url):
    response = delivered(bot_client, "pull_request", merged_payload())

    [job] = queued(redis_url)
    assert response.status_code == 202
    assert (job.func_name, job.kwargs) == ("runner.bot.jobs.merge", MergeArgs(REPO, 2, MERGE_SHA).to_kwargs())
    assert job.id == job_id(JobKind.MERGE, REPO, 2, MERGE_SHA)


def test_a_merge_without_a_merge_commit_is_a_bad_payload_recorded_as_failed(bot_client, bot_db, redis_url):
    doc = merged_payload()
    doc["pull_request"]["merge_commit_sha"] = None
    delivery = str(uuid.uuid4())
    response = delivered(bot_client, "pull_request", doc, delivery=delivery)

    assert response.status_code == 400
    assert response.get_json()["code"] == "bad_payload"
    recorded = store.get_delivery(bot_db, delivery)
    assert recorded is not None and recorded.status == "failed"
    assert queued(redis_url) == []


def test_a_push_to_the_default_branch_queues_a_push_job(bot_client, redis_url):
    doc = payload("push/with-new-branch")
    assert doc["ref"] == f"refs/heads/{doc['repository']['default_branch']}"
    response = delivered(bot_client, "push", doc)

    [job] = queued(redis_url)
    assert response.status_code == 202
    assert (job.func_name, job.kwargs) == ("runner.bot.jobs.push_to_default_branch",
                                            PushArgs(REPO, doc["after"], doc["before"]).to_kwargs())
    assert job.id == job_id("push", REPO, doc["after"])


@pytest.mark.parametrize("change", ["other branch", "tag", "deleted"])
def test_other_pushes_are_ignored(bot_client, redis_url, change):
    doc = payload("push/with-new-branch")
    if change == "other branch":
        doc["ref"] = "refs/heads/feature"
    elif change == "tag":
        doc["ref"] = "refs/tags/master"
    else:
        doc["deleted"] = True
    response = delivered(bot_client, "push", doc)

    assert response.status_code == 200 and response.get_json()["status"] == "ignored"
    assert queued(redis_url) == []


def test_check_run_rerequested_queues_a_rerun_from_the_external_id(bot_settings, redis_url):
    from app.web import create_app

    application = create_app(replace(bot_settings, github_app_id="12345", github_private_key="unused-here"))
    try:
        doc = check_run_payload(external_id="pull_request-x-2-abc-1234")
        assert doc["check_run"]["pull_requests"] == []
        delivery = str(uuid.uuid4())
        response = delivered(application.test_client(), "check_run", doc, delivery=delivery)
        other_app = delivered(application.test_client(), "check_run", check_run_payload(app_id=999))
    finally:
        application.extensions["kilolock"].db.close()

    [job] = queued(redis_url)
    assert response.status_code == 202
    assert (job.func_name, job.kwargs) == ("runner.bot.jobs.rerun_check",
                                            RerunArgs(REPO, "pull_request-x-2-abc-1234", HEAD_SHA).to_kwargs())
    assert job.id == job_id("rerun", REPO, 4242, delivery)
    assert other_app.status_code == 200 and "another GitHub App" in other_app.get_json()["reason"]


@pytest.mark.parametrize("doc, reason", [
    (check_run_payload(external_id=""), "no external_id"),
    (check_run_payload(action="created"), "not handled"),
])
def test_other_check_run_deliveries_are_ignored(bot_client, redis_url, doc, reason):
    response = delivered(bot_client, "check_run", doc)

    assert response.status_code == 200 and reason in response.get_json()["reason"]
    assert queued(redis_url) == []


def test_a_kilolock_comment_on_a_pull_request_queues_a_comment_command(bot_client, redis_url):
    body = "kilolock plan\nplease"
    response = delivered(bot_client, "issue_comment", issue_comment_payload(body, login="octocat", comment_id=77))

    [job] = queued(redis_url)
    assert response.status_code == 202
    assert (job.func_name, job.kwargs) == ("runner.bot.jobs.comment_command",
                                            CommentArgs(REPO, 2, 77, "octocat", body).to_kwargs())
    assert job.id == job_id("comment", REPO, 2, 77)


@pytest.mark.parametrize("doc, reason", [
    (issue_comment_payload("kilolock plan", on_pull_request=False), "not on a pull request"),
    (issue_comment_payload("looks good, kilolock plan later"), "does not start with"),
    (issue_comment_payload("kilolockplan"), "does not start with"),
    (issue_comment_payload("kilolock help", user_type="Bot", login="kilolock[bot]"), "written by a bot"),
    (issue_comment_payload("kilolock plan", action="edited"), "not handled"),
])
def test_other_comments_are_ignored(bot_client, redis_url, doc, reason):
    response = delivered(bot_client, "issue_comment", doc)

    assert response.status_code == 200 and reason in response.get_json()["reason"]
    assert queued(redis_url) == []


def test_a_command_word_in_any_case_and_after_blank_lines_counts(bot_client, redis_url):
    response = delivered(bot_client, "issue_comment", issue_comment_payload("\n  KiloLock help"))

    assert response.status_code == 202
    assert queued(redis_url)[0].func_name == "runner.bot.jobs.comment_command"


@pytest.mark.parametrize("event, doc", [
    ("star", {"action": "created", "repository": payload("ping")["repository"]}),
    ("installation", {"action": "created", "installation": {"id": 1}, "repositories": []}),
    ("pull_request", {**payload("pull_request/opened"), "action": "labeled"}),
])
def test_unknown_events_and_actions_get_2xx_ignored_and_are_recorded(bot_client, bot_db, redis_url, event, doc):
    delivery = str(uuid.uuid4())
    response = delivered(bot_client, event, doc, delivery=delivery)

    assert response.status_code == 200
    assert response.get_json()["status"] == "ignored"
    recorded = store.get_delivery(bot_db, delivery)
    assert recorded is not None and (recorded.event, recorded.status) == (event, "ignored")
    assert recorded.detail["reason"]
    assert queued(redis_url) == []


def test_a_form_encoded_delivery_is_read_from_its_payload_field(bot_client, redis_url):
    body = urlencode({"payload": raw("pull_request/opened").decode()}).encode()
    sent = headers("pull_request", body)
    sent["Content-Type"] = "application/x-www-form-urlencoded"
    response = bot_client.post(URL, data=body, headers=sent)

    assert response.status_code == 202
    assert queued(redis_url)[0].kwargs == PullRequestArgs(REPO, 2, HEAD_SHA).to_kwargs()


def test_a_signed_body_that_is_not_json_is_a_400_recorded_as_failed(bot_client, bot_db, redis_url):
    delivery = str(uuid.uuid4())
    response = post(bot_client, "pull_request", b"{not json", delivery=delivery)

    assert response.status_code == 400
    recorded = store.get_delivery(bot_db, delivery)
    assert recorded is not None and recorded.status == "failed"
    assert queued(redis_url) == []


def test_a_delivery_without_its_id_is_a_400(bot_client, bot_db):
    body = raw("pull_request/opened")
    sent = headers("pull_request", body)
    del sent["X-GitHub-Delivery"]

    assert bot_client.post(URL, data=body, headers=sent).status_code == 400
    assert deliveries_count(bot_db) == 0


def test_outcomes_are_counted_by_event(bot_client):
    before = {o: metric("pull_request", o) for o in ("accepted", "duplicate", "rejected")}
    delivery = str(uuid.uuid4())
    post(bot_client, "pull_request", raw("pull_request/opened"), delivery=delivery)
    post(bot_client, "pull_request", raw("pull_request/opened"), delivery=delivery)
    post(bot_client, "pull_request", raw("pull_request/opened"), secret="wrong")
    post(bot_client, "made-up-event", b"{}", secret="wrong")

    assert {o: metric("pull_request", o) - before[o] for o in before} == {
        "accepted": 1, "duplicate": 1, "rejected": 1}
    assert metric("other", "rejected") >= 1


# --- the pure routing and ids -------------------------------------------------------------------


def test_job_ids_use_only_the_characters_rq_accepts_and_keep_similar_repos_apart():
    first = job_id("pull_request", "a/b.c", 1, "f" * 40)
    second = job_id("pull_request", "a/b_c", 1, "f" * 40)

    assert first != second
    assert all(c.isalnum() or c in "-_" for c in first + second)
    assert first.startswith("pull_request-a_b_c-1-ffff")


def test_every_routed_kind_is_a_known_job():
    kinds = {
        route("pull_request", "d", payload("pull_request/opened")).jobs[0].kind,
        route("pull_request", "d", payload("pull_request/closed")).jobs[0].kind,
        route("pull_request", "d", merged_payload()).jobs[0].kind,
        route("push", "d", payload("push/with-new-branch")).jobs[0].kind,
        route("check_run", "d", check_run_payload()).jobs[0].kind,
        route("issue_comment", "d", issue_comment_payload("kilolock help")).jobs[0].kind,
    }
    assert kinds <= set(JOBS)
    assert kinds == {"pull_request", "pull_request_closed", "merge", "push", "rerun", "comment"}


def test_the_webhook_is_not_served_on_the_control_lane(settings):
    from app.web import create_app

    application = create_app(replace(settings, github_webhook_secret=SECRET), lanes="control")
    try:
        body = raw("ping")
        assert application.test_client().post(URL, data=body, headers=headers("ping", body)).status_code == 404
    finally:
        application.extensions["kilolock"].db.close()


def test_the_web_app_never_loads_the_github_client():
    code = "import app.web, sys, json; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    modules = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert "runner.bot.github" not in modules and "github" not in modules
