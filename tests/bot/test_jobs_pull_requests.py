"""The bot on pull requests, end to end: signed webhooks into the real app, RQ jobs run by a real worker on
a real checkout, file-scoped analysis and plans against the real server with the embedded Terraform; only
GitHub's API is simulated, and every call it receives is checked."""

from __future__ import annotations

import time

import pytest

from app.domain.commands import HELP
from app.domain.jobs import job_id
from app.store import bot as store
from tests.bot.botworld import FILES, REPO, comment_globs, world_factory  # noqa: F401
from tests.bot.golden import assert_golden, normalize

pytestmark = pytest.mark.terraform

DB_V2 = FILES["db.tf"].replace("db-v1", "db-v2")
BACKUP_V2 = FILES["db.tf"].replace("backup-v1", "backup-v2")
R = f"/repos/{REPO}"


def rows(w, kind: str, number: int | None = None) -> list[store.BotJob]:  # type: ignore[no-untyped-def]
    from app.store import Database

    db = Database(w.settings.database_url, pool_size=1)
    try:
        return [j for j in store.list_jobs(db, REPO, number) if j.kind == kind]
    finally:
        db.close()


def footprints(w, number: int) -> list[store.PrFootprint]:  # type: ignore[no-untyped-def]
    from app.store import Database

    db = Database(w.settings.database_url, pool_size=1)
    try:
        return [f for f in store.open_footprints(db, REPO, "infra") if f.number == number]
    finally:
        db.close()


def test_a_pull_request_gets_one_comment_with_its_reservations_and_two_checks(world_factory, request):  # noqa: F811
    w = world_factory()
    head = w.open_pr(1, "db-v2", {"db.tf": DB_V2})

    w.run_jobs()

    body = w.sim.bot_comment(1)
    assert comment_globs(body) == {"write": ["terraform_data.db", "terraform_data.db.*", "terraform_data.db_backup",
                                             "terraform_data.db_backup.*"], "read": []}
    assert "| update | `terraform_data.db` |" in body and "Changed files:** `db.tf`" in body
    assert_golden(request, "e2e-opened.md", normalize(body, {head: "<head>"}))
    # One comment, created once and then edited with the plan preview; each check created, then completed.
    assert w.sim.writes() == [("POST", f"{R}/check-runs"), ("POST", f"{R}/issues/1/comments"),
                              ("PATCH", f"{R}/check-runs/1001"),
                              ("POST", f"{R}/check-runs"), ("PATCH", f"{R}/check-runs/1003"),
                              ("PATCH", f"{R}/issues/comments/1002")]
    runs = {r["name"]: r for r in w.sim.runs(sha=head)}
    assert runs["kilolock/footprint"]["history"] == [("in_progress", None), ("completed", "success")]
    assert runs["kilolock/plan"]["history"] == [("in_progress", None), ("completed", "success")]
    assert runs["kilolock/plan"]["output"]["title"] == "plan: 1 to update"
    assert runs["kilolock/footprint"]["external_id"] == rows(w, "pull_request")[0].id
    [saved] = footprints(w, 1)
    assert saved.head_sha == head and saved.files == ("db.tf",) and "terraform_data.db.*" in saved.write_globs


def test_two_overlapping_pull_requests_name_each_other_and_a_disjoint_one_names_neither(world_factory,  # noqa: F811
                                                                                          request):
    w = world_factory()
    first = w.open_pr(1, "db-v2", {"db.tf": DB_V2})
    w.run_jobs()
    assert "#2" not in w.sim.bot_comment(1)

    second = w.open_pr(2, "backup-v2", {"db.tf": BACKUP_V2})
    third = w.open_pr(3, "queue-v2", {"queue.tf": FILES["queue.tf"].replace("v1", "v2")})
    w.run_jobs()

    one, two, three = w.sim.bot_comment(1), w.sim.bot_comment(2), w.sim.bot_comment(3)
    assert "**Overlaps with other open pull requests**" in one and "- #2: `terraform_data.db`" in one
    assert "- #1: `terraform_data.db`" in two
    assert "#1" not in three and "#3" not in one and "#3" not in two
    assert_golden(request, "e2e-overlap.md", normalize(two, {second: "<head>", first: "<other>", third: "<third>"}))
    # PR 1's comment was edited in place by PR 2's job, never posted again.
    assert [m for m, p in w.sim.writes() if p == f"{R}/issues/1/comments"] == ["POST"]
    checks = {r["head_sha"]: r for r in w.sim.runs("kilolock/footprint")}
    assert checks[second]["output"]["title"].endswith("overlaps #1")

    # Closing PR 2 drops its footprint, and PR 1's comment stops naming it.
    w.sim.close_pr(2)
    w.deliver_pr("closed", 2)
    w.run_jobs()
    assert footprints(w, 2) == [] and "#2" not in w.sim.bot_comment(1)


def test_a_synchronize_with_a_new_file_edits_the_comment_instead_of_adding_one(world_factory):  # noqa: F811
    w = world_factory()
    w.open_pr(1, "db-v2", {"db.tf": DB_V2})
    w.run_jobs()
    before = w.sim.bot_comment(1)

    head = w.push_pr(1, {"queue.tf": FILES["queue.tf"].replace("v1", "v2")})
    w.run_jobs()

    after = w.sim.bot_comment(1)
    assert "terraform_data.queue.*" in comment_globs(after)["write"] and "terraform_data.queue" not in before
    assert head[:7] in after and "| update | `terraform_data.queue` |" in after
    comment_writes = [m for m, p in w.sim.writes() if "/comments" in p]
    assert comment_writes[0] == "POST" and set(comment_writes[1:]) == {"PATCH"}
    assert len(w.sim.pr_comments(1)) == 1
    assert {f.head_sha for f in footprints(w, 1)} == {head}


def test_a_late_delivery_for_an_old_head_is_dropped_and_recorded_as_skipped(world_factory):  # noqa: F811
    w = world_factory()
    old = w.open_pr(1, "db-v2", {"db.tf": DB_V2}, deliver=False)
    w.push_pr(1, {"queue.tf": FILES["queue.tf"].replace("v1", "v2")}, deliver=False)

    w.deliver_pr("opened", 1, head_sha=old)
    w.run_jobs()

    assert w.sim.writes() == [] and w.sim.pr_comments(1) == []
    [row] = rows(w, "pull_request", 1)
    assert row.status == "skipped" and "moved from" in row.result["skipped"]
    assert footprints(w, 1) == []
    assert [(c.method, c.path) for c in w.sim.calls if "/pulls/" in c.path] == [("GET", f"{R}/pulls/1")]


def test_a_redelivery_and_a_repeated_job_run_nothing_again(world_factory):  # noqa: F811
    w = world_factory()
    w.open_pr(1, "db-v2", {"db.tf": DB_V2}, deliver=False)
    first = w.deliver_pr("opened", 1, delivery="delivery-0001")
    w.run_jobs()
    calls = len(w.sim.calls)

    again = w.deliver_pr("opened", 1, delivery="delivery-0001")
    assert first.status_code == 202 and again.status_code == 200 and again.json()["status"] == "already processed"
    # The same job enqueued once more (a second hook, a retry): it finds its stored, posted outcome.
    pr = w.sim.prs[1]
    w.queue().enqueue("runner.bot.jobs.pull_request_footprint", REPO, 1, pr["head_sha"],
                      job_id=job_id("pull_request", REPO, 1, pr["head_sha"]))
    w.run_jobs()

    assert len(w.sim.calls) == calls
    assert [(r.attempts, r.status, r.posted) for r in rows(w, "pull_request", 1)] == [(1, "succeeded", True)]
    assert [(r.attempts, r.status) for r in rows(w, "plan_preview", 1)] == [(1, "succeeded")]


@pytest.mark.parametrize("failure", ["5xx", "rate limit", "lost answer"])
def test_github_failing_while_posting_is_retried_without_duplicates_or_recomputing(world_factory, failure):  # noqa: F811
    w = world_factory()
    comments = r"/issues/\d+/comments$"
    if failure == "5xx":
        # More 502s than one operation retries: the job fails, RQ retries it, the retry posts.
        w.sim.fail("POST", comments, 502, times=6)
    elif failure == "rate limit":
        reset = str(int(time.time()) + 3600)
        w.sim.fail("POST", comments, 403, headers={"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": reset})
    else:
        w.sim.fail("POST", comments, 502, after=True)
    w.open_pr(1, "db-v2", {"db.tf": DB_V2})

    w.run_jobs()

    assert len(w.sim.pr_comments(1)) == 1
    body = w.sim.bot_comment(1)
    assert "terraform_data.db.*" in body and "| update | `terraform_data.db` |" in body
    [footprint] = rows(w, "pull_request", 1)
    [preview] = rows(w, "plan_preview", 1)
    # Computed once, posted once the outcome could be: attempts counts computations, not deliveries.
    assert (footprint.attempts, footprint.status, footprint.posted) == (1, "succeeded", True)
    assert (preview.attempts, preview.posted) == (1, True)
    assert w.failed_jobs() == []
    failed_posts = [c for c in w.sim.calls if c.method == "POST" and "comments" in c.path and c.status >= 400]
    assert failed_posts, "the failure was injected"


def test_token_mode_reports_commit_statuses_instead_of_check_runs(world_factory):  # noqa: F811
    w = world_factory(mode="token")
    head = w.open_pr(1, "db-v2", {"db.tf": DB_V2})

    w.run_jobs()

    assert w.sim.check_runs == {}
    assert [(s["context"], s["state"]) for s in w.sim.statuses if s["sha"] == head] == [
        ("kilolock/footprint", "pending"), ("kilolock/footprint", "success"),
        ("kilolock/plan", "pending"), ("kilolock/plan", "success")]
    assert all(len(s["description"]) <= 140 for s in w.sim.statuses)
    assert "terraform_data.db.*" in w.sim.bot_comment(1)


def test_comment_commands_need_write_access_and_everything_gets_an_answer(world_factory):  # noqa: F811
    w = world_factory()
    head = w.open_pr(1, "db-v2", {"db.tf": DB_V2})
    w.run_jobs()

    w.deliver_comment(1, "kilolock plan", comment_id=11)
    w.deliver_comment(1, "kilolock help", comment_id=12)
    w.deliver_comment(1, "kilolock destroy-everything", comment_id=13)
    w.deliver_comment(1, "kilolock plan", login="mallory", comment_id=14)
    w.run_jobs()

    replies = [c["body"] for c in w.sim.pr_comments(1) if "kilolock:pull-request" not in c["body"]]
    assert replies[0] == f"@alice re-running the plan preview for {head[:7]}; the Kilolock comment on this pull " \
                         "request will show it."
    assert replies[1] == HELP
    assert replies[2].startswith("@alice sorry, `kilolock destroy-everything` is not a command I know.")
    assert replies[3].startswith("@mallory only people with write access")
    [preview] = rows(w, "plan_preview", 1)
    assert preview.attempts == 2 and preview.status == "succeeded"
    plan_runs = w.sim.runs("kilolock/plan", sha=head)
    assert [r["history"][-1] for r in plan_runs] == [("completed", "success"), ("completed", "success")]


def test_an_invalid_kilolock_yml_fails_the_footprint_check_with_what_to_fix(world_factory):  # noqa: F811
    w = world_factory()
    head = w.open_pr(1, "bad-config", {".kilolock.yml": "projects:\n  - dir: nowhere\n    aply_on_merge: false\n",
                                       "db.tf": DB_V2})
    w.run_jobs()

    [run] = w.sim.runs("kilolock/footprint", sha=head)
    assert run["conclusion"] == "failure" and run["output"]["title"] == ".kilolock.yml is invalid"
    assert "projects[0]: dir 'nowhere' does not exist" in run["output"]["summary"]
    body = w.sim.bot_comment(1)
    assert "`.kilolock.yml` is invalid" in body and "unknown key 'aply_on_merge'" in body
    assert w.sim.runs("kilolock/plan") == []


def test_a_change_that_cannot_be_scoped_says_so_and_reserves_nothing(world_factory):  # noqa: F811
    w = world_factory()
    head = w.open_pr(1, "tfvars", {"prod.tfvars": 'env = "staging"\n'})
    w.run_jobs()

    [run] = w.sim.runs("kilolock/footprint", sha=head)
    assert run["conclusion"] == "failure"
    body = w.sim.bot_comment(1)
    assert "Cannot be scoped to the changed files" in body and "prod.tfvars" in body
    assert "kl plan without -f" in body and footprints(w, 1) == []


def test_a_rerequested_check_runs_its_job_again(world_factory):  # noqa: F811
    w = world_factory()
    head = w.open_pr(1, "db-v2", {"db.tf": DB_V2})
    w.run_jobs()
    [run] = w.sim.runs("kilolock/footprint", sha=head)

    w.deliver_rerun(run["external_id"], head)
    w.run_jobs()

    [row] = rows(w, "pull_request", 1)
    assert (row.attempts, row.status, row.posted) == (2, "succeeded", True)
    assert [r["history"][-1] for r in w.sim.runs("kilolock/footprint", sha=head)] == [("completed", "success"),
                                                                                     ("completed", "success")]
    assert len(w.sim.pr_comments(1)) == 1


def test_sensitive_values_never_reach_github(world_factory):  # noqa: F811
    w = world_factory()
    secret = "hunter2-correct-horse-battery"
    w.open_pr(1, "secret", {"secret.tf": f'variable "db_password" {{\n  type      = string\n  sensitive = true\n'
                                         f'  default   = "{secret}"\n}}\n\nresource "terraform_data" "creds" {{\n'
                                         '  input = var.db_password\n}\n'})
    w.run_jobs()

    body = w.sim.bot_comment(1)
    assert "| create | `terraform_data.creds` |" in body
    sent = [str(c.body) for c in w.sim.calls if c.body]
    assert sent and not any(secret in text for text in sent)
    assert not any(secret in str(r.result) for kind in ("pull_request", "plan_preview") for r in rows(w, kind, 1))


def test_a_job_that_keeps_failing_reports_why_in_its_check_after_the_last_retry(world_factory):  # noqa: F811
    from dataclasses import replace

    from runner.bot import jobs
    from tests.bot.botworld import fast_github

    w = world_factory()
    jobs.configure(replace(w.settings, github_clone_urls=((REPO, str(w.tmp / "gone.git")),)), github=fast_github)
    head = w.open_pr(1, "db-v2", {"db.tf": DB_V2})

    w.run_jobs()

    [run] = w.sim.runs("kilolock/footprint", sha=head)
    assert run["history"] == [("in_progress", None)] * 4 + [("completed", "failure")]
    assert run["output"]["title"] == "Kilolock could not finish this job"
    assert "GitError: git failed while cloning octo-org/infra" in run["output"]["summary"]
    [row] = rows(w, "pull_request", 1)
    assert (row.status, row.attempts, row.posted) == ("failed", 4, True)
    assert w.sim.pr_comments(1) == [] and len(w.failed_jobs()) == 1


def test_live_reservations_the_change_would_wait_for_are_named(world_factory):  # noqa: F811
    import requests

    w = world_factory()
    opened = requests.post(f"{w.server_url}/v1/engine/states/infra/runs", timeout=10, json={
        "actor": "carol@laptop", "reservations": [{"glob": "terraform_data.db.*", "mode": "write"},
                                                  {"glob": "terraform_data.queue.*", "mode": "read"}]})
    assert opened.status_code == 201, opened.text
    run_id = opened.json()["run"]["id"]

    w.open_pr(1, "db-v2", {"db.tf": DB_V2})
    w.run_jobs()

    body = w.sim.bot_comment(1)
    assert "**Live reservations this would wait for right now:**" in body
    assert (f"- write `terraform_data.db.*` conflicts with write `terraform_data.db.*` held by `carol@laptop` "
            f"(run `{run_id}`)") in body
    assert "terraform_data.queue" not in body
