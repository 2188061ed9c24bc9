"""Merges and pushes, end to end: the merge webhook, one apply job per project on the merge commit, real
Terraform applies committed row by row on the real server, the results reported to the PR comment and the
``kilolock/apply`` check. Concurrency runs on forking RQ workers (``kl worker --burst``), whose GitHub calls
go to the simulation served on a loopback port."""

from __future__ import annotations

import logging
import subprocess
import uuid
from pathlib import Path

import psycopg
import pytest

from app.store import Database
from app.store import bot as store
from tests.bot.botworld import FILES, REPO, World, dump, git, slow, world_factory  # noqa: F401
from tests.bot.golden import assert_golden, normalize
from tests.conftest import kl_terraform_bin, wait_for

pytestmark = pytest.mark.terraform
DB_V2 = FILES["db.tf"].replace("db-v1", "db-v2")


def jobs_of(w: World, kind: str) -> list[store.BotJob]:
    db = Database(w.settings.database_url or "", pool_size=1)
    try:
        return [j for j in store.list_jobs(db, REPO) if j.kind == kind]
    finally:
        db.close()


def converged(w: World) -> None:
    """Vanilla Terraform over the whole merged configuration sees no changes: the trunk is what a full
    apply would have produced."""
    git(w.work, "checkout", "-q", "main")
    proc = subprocess.run([kl_terraform_bin(), "plan", "-detailed-exitcode", "-input=false", "-no-color"],
                          cwd=w.work, env={**w.tf_env, "HOME": str(w.tmp)}, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr


def finish(workers: list[subprocess.Popen[str]]) -> list[str]:
    outputs = [p.communicate(timeout=300)[0] for p in workers]
    assert [p.returncode for p in workers] == [0] * len(workers), outputs
    return outputs


def test_a_merged_pull_request_is_applied_on_the_merge_commit_and_reported(world_factory, request,  # noqa: F811
                                                                          caplog):
    w = world_factory()
    head = w.open_pr(1, "db-v2", {"db.tf": DB_V2})
    w.run_jobs()
    before = len(w.sim.writes())

    merge = w.merge(1)
    caplog.set_level(logging.INFO, logger="kilolock.bot")
    w.run_jobs()
    # Nothing landed on the trunk between the project's plan and its reservations: the saved plan is applied.
    assert "the trunk has not moved since the plan (serial 1): applying the saved plan" in caplog.text

    assert w.trunk()["terraform_data.db"] == "prod-app-db-v2" and w.serial() == 2
    [run] = [r for r in w.runs() if r["status"] == "committed"]
    assert run["actor"] == f"github:{REPO}#1@{merge[:12]}/infra" and run["committed_serial"] == 2
    # The run records where the apply came from, so history names the pull request, its author and merge commit.
    assert run["info"]["bot"] == {"repository": REPO, "pull_request": 1, "merge_commit": merge, "author": "alice"}
    [check] = w.sim.runs("kilolock/apply", sha=merge)
    assert check["history"] == [("in_progress", None), ("completed", "success")]
    assert check["output"]["title"] == "applied: infra at serial 2"
    body = w.sim.bot_comment(1)
    assert f"committed at serial 2 (run `{run['id']}`): 1 to update" in body and "Overlaps" not in body
    assert_golden(request, "e2e-merged.md", normalize(body, {head: "<head>", merge: "<merge>"}))
    assert w.sim.writes()[before:] == [
        ("POST", f"/repos/{REPO}/check-runs"), ("PATCH", f"/repos/{REPO}/issues/comments/1002"),
        ("PATCH", f"/repos/{REPO}/check-runs/{check['id']}"), ("PATCH", f"/repos/{REPO}/issues/comments/1002")]
    assert jobs_of(w, "apply_project")[-1].result["apply"]["status"] == "committed"
    with psycopg.connect(w.settings.database_url) as conn:  # the audit rows outgoing events are made of
        audited = conn.execute("SELECT kind, state_name, detail FROM events WHERE kind LIKE 'pr_apply_%' "
                               "ORDER BY id").fetchall()
    assert [(k, s, d["number"], d["project"], d["sha"], d.get("status")) for k, s, d in audited] == [
        ("pr_apply_started", "infra", 1, "infra", merge, None), ("pr_apply_finished", "infra", 1, "infra", merge,
                                                                 "applied")]
    converged(w)


def test_an_apply_failure_fails_the_check_with_the_error_and_leaves_the_trunk_unchanged(world_factory):  # noqa: F811
    w = world_factory()
    w.open_pr(1, "boom", {"boom.tf": slow("boom", "v1", 0, fail=True)})
    w.run_jobs()
    serial, trunk = w.serial(), w.trunk()

    merge = w.merge(1)
    w.run_jobs()

    assert (w.serial(), w.trunk()) == (serial, trunk)
    [check] = w.sim.runs("kilolock/apply", sha=merge)
    assert check["conclusion"] == "failure"
    assert check["output"]["title"] == "apply failed for infra; the trunk is unchanged"
    summary = check["output"]["summary"]
    assert "local-exec provisioner error" in summary and "nothing was committed" in summary
    assert "What to do: fix the configuration in a new pull request" in summary
    [run] = w.runs()
    assert run["status"] == "failed" and run["id"] in summary
    assert "**Apply failed**" in w.sim.bot_comment(1)


def test_a_rerequested_apply_check_retries_a_failed_apply(world_factory, tmp_path: Path):  # noqa: F811
    marker = tmp_path / "dependency-ready"
    w = world_factory()
    flaky = ('resource "terraform_data" "flaky" {\n  input = "v1"\n  provisioner "local-exec" {\n'
             f'    command = "test -f {marker}"\n  }}\n}}\n')
    w.open_pr(1, "flaky", {"flaky.tf": flaky})
    w.run_jobs()
    merge = w.merge(1)
    w.run_jobs()
    [check] = w.sim.runs("kilolock/apply", sha=merge)
    assert check["conclusion"] == "failure"

    marker.write_text("ok")
    w.deliver_rerun(check["external_id"], merge)
    w.run_jobs()

    assert w.trunk()["terraform_data.flaky"] == "v1"
    assert w.sim.runs("kilolock/apply", sha=merge)[-1]["conclusion"] == "success"
    [child] = jobs_of(w, "apply_project")
    assert (child.attempts, child.status) == (2, "succeeded")
    assert "committed at serial 2" in w.sim.bot_comment(1)


def test_apply_on_merge_off_reports_the_merge_as_not_applied(world_factory):  # noqa: F811
    w = world_factory(kilolock_yml="apply_on_merge: false\n")
    w.open_pr(1, "db-v2", {"db.tf": DB_V2})
    w.run_jobs()
    merge = w.merge(1)
    w.run_jobs()

    assert w.serial() == 1 and w.runs() == []
    [check] = w.sim.runs("kilolock/apply", sha=merge)
    assert (check["conclusion"], check["output"]["title"]) == ("neutral", "not applied: apply on merge is off")
    assert "**Not applied**" in w.sim.bot_comment(1)


def test_a_push_to_the_default_branch_is_analyzed_and_applied_when_configured(world_factory):  # noqa: F811
    w = world_factory(kilolock_yml="apply_on_push: true\nmerge_wait: 2m\n")
    before = w.head("main")
    w.write("queue.tf", FILES["queue.tf"].replace("v1", "v2"))
    git(w.work, "commit", "-qam", "hotfix: queue v2")
    git(w.work, "push", "-q", "origin", "main")
    after = w.head("main")

    w.deliver_push(before, after)
    w.run_jobs()

    assert w.trunk()["terraform_data.queue"] == "queue-v2"
    [footprint] = w.sim.runs("kilolock/footprint", sha=after)
    assert footprint["conclusion"] == "success" and "1 write" not in footprint["output"]["title"]
    [apply] = w.sim.runs("kilolock/apply", sha=after)
    assert apply["output"]["title"] == "applied: infra at serial 2"
    assert w.sim.pr_comments(1) == []

    # The push of a PR's merge commit is left to the merge job.
    w.open_pr(7, "db-v2", {"db.tf": DB_V2})
    w.run_jobs()
    merge = w.merge(7, deliver=False)
    w.deliver_push(after, merge)
    w.run_jobs()
    [push] = [j for j in jobs_of(w, "push") if j.sha == merge]
    assert push.status == "skipped" and "the merge of #7" in push.result["skipped"]
    assert w.serial() == 2


def test_two_disjoint_merges_apply_at_the_same_time_on_two_forking_workers(world_factory):  # noqa: F811
    files = {**FILES, "slow_a.tf": slow("a", "a1", 0), "slow_b.tf": slow("b", "b1", 0)}
    w = world_factory(mode="token", files=files, served=True)
    gate = w.tmp / "release-applies"
    w.open_pr(1, "a2", {"slow_a.tf": slow("a", "a2", 0, until=gate)}, deliver=False)
    w.open_pr(2, "b2", {"slow_b.tf": slow("b", "b2", 0, until=gate)}, deliver=False)
    w.merge(1)
    w.merge(2)
    w.run_jobs(max_jobs=2)  # the two merge jobs: each finds its project and queues its apply

    workers = w.start_workers(2)
    try:
        wait_for(lambda: len([r for r in w.runs() if r["status"] == "running"]) == 2, "both applies to run",
                 timeout=240)
    finally:
        gate.touch()
    outputs = finish(workers)

    runs = {r["actor"].split("#")[1][0]: r for r in w.runs()}
    assert {k: r["status"] for k, r in runs.items()} == {"1": "committed", "2": "committed"}, dump(runs)
    one, two = runs["1"], runs["2"]
    assert one["started_at"] < two["finished_at"] and two["started_at"] < one["finished_at"], dump(runs)
    assert sorted([one["committed_serial"], two["committed_serial"]]) == [2, 3]
    assert w.trunk()["terraform_data.a"] == "a2" and w.trunk()["terraform_data.b"] == "b2"
    workers = {line.split("Worker ")[1].split(":")[0] for out in outputs for line in out.splitlines()
               if "apply_project" in line and "Worker " in line}
    assert len(workers) >= 2, outputs
    assert [s["state"] for s in w.sim.statuses if s["context"] == "kilolock/apply"][-2:] == ["success", "success"]
    converged(w)


def test_two_overlapping_merges_apply_in_merge_order_the_second_waiting(world_factory):  # noqa: F811
    both = slow("x", "x1", 0) + "\n# The y service.\n\n# Owned by the platform team.\n\n" + slow("y", "y1", 0)
    w = world_factory(mode="token", files={**FILES, "slow.tf": both}, served=True)
    first = w.open_pr(1, "x2", {"slow.tf": both.replace('"x1"', '"x2"').replace("sleep 0", "sleep 4", 1)},
                      deliver=False)
    second = w.open_pr(2, "y2", {"slow.tf": both.replace('"y1"', '"y2"')}, deliver=False)
    assert first != second
    w.merge(1)
    w.merge(2)
    w.run_jobs(max_jobs=2)

    finish(w.start_workers(2))

    runs = sorted(w.runs(), key=lambda r: r["started_at"])
    assert [r["status"] for r in runs] == ["committed", "committed"], dump(runs)
    assert [r["actor"].split("#")[1][0] for r in runs] == ["1", "2"], dump(runs)
    assert runs[0]["finished_at"] <= runs[1]["started_at"], dump(runs)
    assert [r["committed_serial"] for r in runs] == [2, 3]
    # Applied out of order, the first merge's slow.tf would have put y back to y1.
    assert (w.trunk()["terraform_data.x"], w.trunk()["terraform_data.y"]) == ("x2", "y2")
    waited = {j.number: j.result["apply"]["waited_seconds"] for j in jobs_of(w, "apply_project")}
    assert waited[2] > 2 > waited[1], waited
    converged(w)


def test_a_job_timeout_interrupts_terraform_and_ends_its_run(world_factory):  # noqa: F811
    w = world_factory(mode="token", files={**FILES, "slow.tf": slow("s", "s1", 0)}, served=True, job_timeout=12)
    seconds = f"120.{uuid.uuid4().int % 10**9:09d}"  # a command line no other process on the machine has
    w.open_pr(1, "s2", {"slow.tf": slow("s", "s2", seconds)}, deliver=False)
    merge = w.merge(1)
    w.run_jobs(max_jobs=1)
    serial = w.serial()

    finish(w.start_workers(1))

    [run] = w.runs()
    assert run["status"] == "failed" and w.serial() == serial, dump(run)
    reservations = __import__("requests").get(f"{w.server_url}/v1/engine/reservations?state=infra", timeout=10)
    assert reservations.json()["reservations"] == []
    [child] = jobs_of(w, "apply_project")
    assert child.status == "failed" and "timed out after 12 s" in child.result["apply"]["error"]
    assert [s["state"] for s in w.sim.statuses if s["sha"] == merge and s["context"] == "kilolock/apply"][-1] == \
        "failure"
    leftovers = subprocess.run(["pgrep", "-f", f"sleep {seconds}"], capture_output=True, text=True)
    assert leftovers.stdout.strip() == "", "the provisioner outlived the job"


@pytest.mark.parametrize("how", ["squash", "rebase"])
def test_squash_and_rebase_merges_apply_exactly_the_pull_requests_changes(world_factory, how):  # noqa: F811
    w = world_factory()
    w.commit("two-steps", {"db.tf": DB_V2}, "db v2")
    w.open_pr(1, "two-steps", {"queue.tf": FILES["queue.tf"].replace("v1", "v2")}, deliver=False)
    # Meanwhile main moves on with a change of its own, applied by its own means.
    w.write("network.tf", FILES["network.tf"] + "# owned by the network team\n")
    git(w.work, "commit", "-qam", "a comment on main")
    if how == "squash":
        git(w.work, "merge", "-q", "--squash", "two-steps")
        git(w.work, "commit", "-qm", "Two steps (#1)")
    else:
        for sha in git(w.work, "rev-list", "--reverse", "main..two-steps").split():
            git(w.work, "cherry-pick", sha)
    git(w.work, "push", "-q", "origin", "main")
    merge = w.head("main")
    w.sim.merge_pr(1, merge)
    w.deliver_merged(1)

    w.run_jobs()

    assert (w.trunk()["terraform_data.db"], w.trunk()["terraform_data.queue"]) == ("prod-app-db-v2", "queue-v2")
    [run] = w.runs()
    assert run["status"] == "committed"
    [child] = jobs_of(w, "apply_project")
    assert {a for a, _ in child.result["apply"]["actions"]} == {"terraform_data.db", "terraform_data.queue"}
    converged(w)
