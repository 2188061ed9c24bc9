"""Scheduled drift in the bot, end to end: ``drift: {every: 1h}`` in ``.kilolock.yml``, the tick job that
enqueues one check per project per window, the ``kilolock/drift`` check (App mode) or status (token mode)
posted once per window even with two workers, and the drift issue opened, edited and closed.

Real Postgres, Redis, git, the embedded Terraform and the fakecloud provider (objects changed behind
Terraform's back); GitHub is simulated. Windows come from the jobs' time arguments, never from waiting.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from rq import Queue

from app import queue
from app.domain.jobs import DriftTickArgs
from app.store import bot as store
from bench.fakecloud.cloud import Cloud
from bench.fakecloud.install import Installed, install
from runner.bot import drift_schedule as botdrift
from runner.bot.config import BotConfigError, RawConfig, parse, validate
from tests.bot.botworld import REPO, SERIALIZER, World, world_factory  # noqa: F401  (fixture)
from tests.fakecloud.world import FILES as CLOUD_FILES

HOUR = 3600
SECRET_VALUES = ("hunter2-original", "rotated-behind-our-back")
# A drifted value long enough never to appear by chance in a commit id or a time shown beside it.
DRIFTED_SIZE = 48213907


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    return install(tmp_path_factory.mktemp("fakecloud-provider"))


def _world(make: Any, provider: Installed, tmp_path: Path, yml: str, **kwargs: Any) -> tuple[World, Cloud]:
    cloud_root = tmp_path / "cloud"
    # The provider finds its cloud through FAKECLOUD_ROOT: a provider variable the worker passes to Terraform
    # only because the default branch's .kilolock.yml names it.
    world = make(files=CLOUD_FILES, kilolock_yml="env: [FAKECLOUD_ROOT]\n" + yml, extra_env=provider.env(cloud_root),
                 **kwargs)
    # The bot knows a repository once a delivery for it arrived.
    store.record_delivery(_db(world), "delivery-1", "installation", "created", REPO)
    return world, Cloud(cloud_root)


def _db(world: World) -> Any:
    from app.store import Database

    assert world.settings.database_url
    return Database(world.settings.database_url, pool_size=1)


def _next_window() -> int:
    """The start of the next hour: ticks there are in the future, so never stale."""
    return botdrift.window_start(int(time.time()), HOUR) + HOUR


def _tick(world: World, at: int) -> None:
    queue.enqueue(world.connection(), DriftTickArgs(at), job_id=botdrift.tick_id(at) + "-test", timeout=600)


def _drift_jobs(world: World) -> list[store.BotJob]:
    return [j for j in store.list_jobs(_db(world), REPO) if j.kind == "drift_check"]


def _drift_runs(world: World) -> list[dict[str, Any]]:
    return world.sim.runs("kilolock/drift")


def _everything_posted(world: World) -> str:
    return json.dumps([c.body for c in world.sim.calls if c.body]) + json.dumps(world.sim.issues)


def test_the_tick_enqueues_one_check_per_project_per_window_and_schedules_the_next_tick(
        world_factory: Any, provider: Installed, tmp_path: Path) -> None:  # noqa: F811
    world, _ = _world(world_factory, provider, tmp_path, "drift: {every: 1h}\n")
    window = _next_window()
    for at in (window + 10, window + 700, window + HOUR + 10):  # two ticks in one window, one in the next
        _tick(world, at)
    world.run_jobs(retries_now=False)

    checks = _drift_jobs(world)
    assert sorted(j.id for j in checks) == sorted(botdrift.check_id(REPO, "infra", w) for w in (window, window + HOUR))
    assert all(j.status == "succeeded" and j.posted and j.attempts == 1 for j in checks)
    head = world.head("main")
    runs = _drift_runs(world)
    assert len(runs) == 1 and runs[0]["head_sha"] == head
    assert runs[0]["conclusion"] == "success", runs[0]
    assert runs[0]["history"] == [("completed", "success")] * 2  # one report per window
    assert "no drift in infra" in runs[0]["output"]["title"]
    # Re-running the check on GitHub runs that window's check again and reports it on the same check run.
    world.deliver_rerun(botdrift.check_id(REPO, "infra", window), head)
    world.run_jobs(retries_now=False)
    assert _drift_runs(world)[0]["history"] == [("completed", "success")] * 3
    rerun = next(j for j in _drift_jobs(world) if j.id == botdrift.check_id(REPO, "infra", window))
    assert (rerun.status, rerun.attempts, rerun.posted) == ("succeeded", 2, True)
    # Every tick schedules its successor at the next boundary (RQ's scheduler starts it).
    scheduled = world.queue().scheduled_job_registry.get_job_ids()
    assert botdrift.tick_id(((window + HOUR + 10) // botdrift.TICK_SECONDS + 1) * botdrift.TICK_SECONDS) in scheduled


def test_drift_fails_the_check_naming_address_and_attribute_and_the_issue_follows_it(
        world_factory: Any, provider: Installed, tmp_path: Path) -> None:  # noqa: F811
    world, cloud = _world(world_factory, provider, tmp_path, "drift: {every: 1h, issue: true}\n")
    window = _next_window()
    serial = world.serial()
    cloud.edit("local", "bucket", "logs", size=DRIFTED_SIZE, secret=SECRET_VALUES[1])

    _tick(world, window + 10)
    world.run_jobs(retries_now=False)
    run = _drift_runs(world)[0]
    assert run["conclusion"] == "failure"
    assert run["output"]["title"] == "1 drifted instance(s) in infra"
    assert "| `fakecloud_bucket.logs` | `secret`, `size` |" in run["output"]["summary"]
    assert len(world.sim.issues) == 1
    issue = next(iter(world.sim.issues.values()))
    assert issue["state"] == "open" and "fakecloud_bucket.logs" in issue["body"] and "`size`" in issue["body"]
    assert "last change Kilolock recorded" in issue["body"] and f" at serial {serial}" in issue["body"]
    assert world.serial() == serial  # a drift check never writes the trunk

    # Still drifted in the next window: the same issue is edited, not a second one opened.
    cloud.delete("local", "queue", "jobs")
    _tick(world, window + HOUR + 10)
    world.run_jobs(retries_now=False)
    assert len(world.sim.issues) == 1 and issue["state"] == "open"
    assert "fakecloud_queue.jobs` | gone" in issue["body"]

    # Put the objects back as the trunk has them: the next window is clean and closes the issue.
    cloud.put("local", "queue", "jobs", {**_queue_as_applied(world)})
    cloud.edit("local", "bucket", "logs", size=10, secret=SECRET_VALUES[0])
    _tick(world, window + 2 * HOUR + 10)
    world.run_jobs(retries_now=False)
    run = _drift_runs(world)[0]
    assert run["conclusion"] == "success"
    assert issue["state"] == "closed" and issue["state_reason"] == "completed"
    assert issue["history"] == ["opened", "closed"]

    # Drift coming back reopens the same issue.
    cloud.edit("local", "bucket", "logs", size=7)
    _tick(world, window + 3 * HOUR + 10)
    world.run_jobs(retries_now=False)
    assert len(world.sim.issues) == 1 and issue["history"] == ["opened", "closed", "reopened"]
    assert [j.result.get("issue_number") for j in _drift_jobs(world)] == [issue["number"]] * 4
    posted = _everything_posted(world)
    assert not any(value in posted for value in SECRET_VALUES), "a value reached GitHub"
    assert str(DRIFTED_SIZE) not in run["output"]["summary"]


def _queue_as_applied(world: World) -> dict[str, Any]:
    """The queue object's attributes as the trunk recorded them."""
    import requests

    doc = requests.get(f"{world.server_url}/v1/states/infra", timeout=10).json()
    found = next(r for r in doc["resources"] if r["type"] == "fakecloud_queue")
    attrs = dict(found["instances"][0]["attributes"])
    return {k: v for k, v in attrs.items() if v is not None}


def test_two_forking_workers_post_the_window_check_exactly_once(world_factory: Any,  # noqa: F811
                                                              provider: Installed, tmp_path: Path) -> None:
    world, cloud = _world(world_factory, provider, tmp_path, "drift: {every: 1h}\n", mode="token", served=True)
    cloud.edit("east", "bucket", "archive", size=5)
    window = _next_window()
    _tick(world, window + 10)
    _tick(world, window + 20)
    world.run_jobs(retries_now=False, max_jobs=1)  # the first tick: the check is queued
    check = botdrift.check_id(REPO, "infra", window)
    rq_queue = Queue(queue.QUEUE_NAME, connection=world.connection(), serializer=SERIALIZER)
    assert check in rq_queue.get_job_ids()
    # Two ticks racing could both push the id: put a second copy on the queue behind RQ's back.
    job = rq_queue.fetch_job(check)
    assert job is not None
    rq_queue.enqueue(job.func_name, kwargs=job.kwargs, job_id=check, job_timeout=600)
    assert rq_queue.get_job_ids().count(check) == 2

    workers = world.start_workers(2)
    for worker in workers:
        out, _ = worker.communicate(timeout=600)
        assert worker.returncode == 0, out
    statuses = [s for s in world.sim.statuses if s["context"] == "kilolock/drift"]
    assert len(statuses) == 1, statuses
    assert statuses[0]["state"] == "failure" and statuses[0]["sha"] == world.head("main")
    assert "1 drifted instance(s) in infra" in statuses[0]["description"]
    rows = _drift_jobs(world)
    assert [(r.id, r.attempts, r.status) for r in rows] == [(check, 1, "succeeded")]
    (drifted,) = rows[0].result["drift"]["drifted"]
    last = drifted.pop("last_change")  # the last change Kilolock recorded for it, in words
    assert drifted == {"address": "fakecloud_bucket.archive", "attributes": ["size"], "gone": False}
    assert last.startswith(("created by ", "changed by ")) and " at serial " in last


def test_a_stale_tick_only_schedules_the_next_one(world_factory: Any, provider: Installed, tmp_path: Path) -> None:  # noqa: F811
    world, _ = _world(world_factory, provider, tmp_path, "drift: {every: 1h}\n")
    _tick(world, int(time.time()) - 3 * HOUR)
    world.run_jobs(retries_now=False)
    assert _drift_jobs(world) == []
    assert world.queue().scheduled_job_registry.get_job_ids()


# --- validation of drift: ----------------------------------------------------------------------------


def _validate(text: str, root: Path) -> Any:
    return validate(RawConfig(".kilolock.yml", parse(text)), root)


@pytest.mark.parametrize(("text", "problem"), [
    ("drift: 6h\n", "drift must be a mapping such as {every: 6h}"),
    ("drift: {every: 5m}\n", "drift: every must be a duration between 15m and 31d"),
    ("drift: {every: soon}\n", "drift: every must be a duration between 15m and 31d such as 30m, 6h or 1d, got 'soon'"),
    ("drift: {every: 40d}\n", "between 15m and 31d"),
    ("drift: {issue: true}\n", "drift: every is required"),
    ("drift: {every: 1h, issues: true}\n", "drift: unknown key 'issues' (known: every, issue)"),
    ("drift: {every: 1h, issue: 'yes'}\n", "drift: issue must be true or false, got 'yes'"),
    ("projects:\n  - dir: .\n    state: s\n    drift: {every: true}\n", "projects[0]: drift: every must be"),
])
def test_bad_drift_values_are_listed_with_what_to_write(tmp_path: Path, text: str, problem: str) -> None:
    with pytest.raises(BotConfigError) as caught:
        _validate(text, tmp_path)
    assert any(problem in p for p in caught.value.problems), caught.value.problems


def test_drift_is_inherited_overridden_or_turned_off_per_project(tmp_path: Path) -> None:
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
    config = _validate("drift: {every: 6h, issue: true}\nprojects:\n  - {dir: a, state: a}\n"
                       "  - {dir: b, state: b, drift: {every: 1d}}\n  - {dir: c, state: c, drift: false}\n", tmp_path)
    schedules = {p.name: p.drift for p in config.projects}
    assert schedules["a"] is not None and (schedules["a"].every, schedules["a"].issue) == (6 * HOUR, True)
    assert schedules["b"] is not None and (schedules["b"].every, schedules["b"].issue) == (24 * HOUR, False)
    assert schedules["c"] is None
    assert all(p.drift is None for p in _validate("projects:\n  - {dir: a, state: a}\n", tmp_path).projects)


def test_github_failing_after_the_check_is_retried_by_posting_the_stored_outcome(
        world_factory: Any, provider: Installed, tmp_path: Path) -> None:  # noqa: F811
    world, _ = _world(world_factory, provider, tmp_path, "drift: {every: 1h}\n")
    world.sim.fail("POST", r"/check-runs$", 500, times=5)  # every attempt of the first try
    window = _next_window()
    _tick(world, window + 10)
    world.run_jobs(retries_now=False)
    assert _drift_runs(world) == []
    # The retry RQ scheduled for the check (not the next tick): run it now.
    check = botdrift.check_id(REPO, "infra", window)
    rq_queue = world.queue()
    assert check in rq_queue.scheduled_job_registry.get_job_ids()
    job = rq_queue.fetch_job(check)
    assert job is not None
    rq_queue.scheduled_job_registry.remove(job)
    rq_queue.enqueue_job(job)
    world.run_jobs(retries_now=False)
    runs = _drift_runs(world)
    assert len(runs) == 1 and runs[0]["conclusion"] == "success"
    (row,) = _drift_jobs(world)
    assert (row.status, row.attempts, row.posted) == ("succeeded", 1, True)  # Terraform ran once


# --- the stored outcome -------------------------------------------------------------------------------

STORED_DRIFT = [  # each shape a drift check stores in bot_jobs.result["drift"]
    {"project": "infra", "sha": "a" * 40, "branch": "main", "window": 7200,
     "drifted": [{"address": "fakecloud_bucket.archive", "attributes": ["size", "tags"], "gone": False},
                 {"address": "fakecloud_bucket.logs", "attributes": [], "gone": True}],
     "checked": 3, "serial": 4, "state": "prod", "dir": "infra", "every": 3600, "issue": True, "run_id": "r-1"},
    {"project": "infra", "sha": "a" * 40, "branch": "main", "window": 7200, "drifted": [], "checked": 0,
     "serial": 0, "state": "prod", "dir": ".", "every": 3600, "issue": False, "error": "terraform plan failed"},
    {"project": "infra", "sha": "a" * 40, "branch": "main", "window": 7200, "drifted": [], "checked": 0,
     "serial": 0, "error": ".kilolock.yml: projects: must be a list"},
    {"project": "infra", "sha": "a" * 40, "branch": "main", "window": 7200, "drifted": [], "checked": 0,
     "serial": 0, "skipped": "project 'infra' has no drift schedule on main now"},
]


@pytest.mark.parametrize("stored", STORED_DRIFT)
def test_a_stored_drift_outcome_reads_back_and_writes_the_same_json(stored: dict[str, Any]) -> None:
    from runner.bot.results import DriftResult

    result = DriftResult.from_json({"drift": stored, "issue_number": 12})
    assert result.drift is not None and result.issue_number == 12
    assert result.to_json() == {"drift": stored, "issue_number": 12}
    assert json.dumps(result.drift.to_json()) == json.dumps(stored)  # same keys, in the same order


def test_a_drift_outcome_renders_from_its_stored_form() -> None:
    from runner.bot import drifttext
    from runner.bot.outcomes import drift_from_json

    drifted = drift_from_json(STORED_DRIFT[0])
    shown = drifttext.check_output(drifted)
    assert (shown.conclusion, shown.title) == ("failure", "2 drifted instance(s) in infra")
    assert "| `fakecloud_bucket.archive` | `size`, `tags` |" in shown.summary
    assert "| `fakecloud_bucket.logs` | gone: the object was deleted |" in shown.summary
    assert "in `infra`;" in shown.summary and drifttext.issue_title(drifted) == "Kilolock: drift in infra (prod)"
    failed = drift_from_json(STORED_DRIFT[2])
    assert drifttext.check_output(failed).title == "drift check of infra failed"
    assert "(state ``)" in drifttext.check_output(failed).summary and not failed.keeps_issue
    # A row written before every key was kept still reads; an empty one reads as no outcome.
    partial = drift_from_json({"window": 3600, "branch": "main"})
    assert (partial.window, partial.branch, partial.drifted, partial.target) == (3600, "main", (), None)
    from runner.bot.results import DriftResult
    assert DriftResult.from_json({"drift": {}}).drift is None and DriftResult().to_json() == {"drift": {}}
