"""Apply before merge, end to end: ``kilolock apply`` comments into the real app, RQ jobs on a real worker
(in-process SimpleWorker, or forking ``kl worker`` processes), real git checkouts and Terraform applies on the
real server, and the pull-request holds they leave; GitHub (reviews, the pull's mergeable fields, comments,
checks) is simulated."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import requests

from app.store import Database, pr_holds
from app.store import bot as store
from runner.bot.render import MARKER
from tests.bot.botworld import FILES, REPO, World, dump, git, slow, world_factory  # noqa: F401
from tests.bot.golden import assert_golden, normalize
from tests.conftest import wait_for

pytestmark = pytest.mark.terraform
DB_V2 = FILES["db.tf"].replace("db-v1", "db-v2")
DB_V3 = FILES["db.tf"].replace("db-v1", "db-v3")
QUEUE_V2 = FILES["queue.tf"].replace("v1", "v2")
DB_HELD = ["write terraform_data.db", "write terraform_data.db.*", "write terraform_data.db_backup",
           "write terraform_data.db_backup.*"]
OPEN = "apply_on_comment: true\napply_requirements: []\n"
_ids = itertools.count(7001)


def comment(w: World, number: int, body: str, *, login: str = "alice") -> None:
    w.deliver_comment(number, body, login=login, comment_id=next(_ids))


def replies(w: World, number: int) -> list[str]:
    return [str(c["body"]) for c in w.sim.pr_comments(number) if c["user"] == w.sim.bot_login
            and MARKER not in c["body"]]


def marked(w: World, number: int) -> str:
    """The Kilolock comment (the one with the marker; replies are separate comments)."""
    [body] = [str(c["body"]) for c in w.sim.pr_comments(number) if c["user"] == w.sim.bot_login
              and MARKER in c["body"]]
    return body


def reservations(w: World) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = requests.get(f"{w.server_url}/v1/engine/reservations?state=infra",
                                               timeout=10).json()["reservations"]
    return found


def held(w: World) -> dict[str, list[str]]:
    """holder → write globs of the live reservations."""
    found: dict[str, list[str]] = {}
    for r in reservations(w):
        found.setdefault(r["holder"], []).append(f"{r['mode']} {r['glob']}")
    return {k: sorted(v) for k, v in found.items()}


def holds_of(w: World, number: int) -> list[pr_holds.PrHold]:
    db = Database(w.settings.database_url or "", pool_size=1)
    try:
        return pr_holds.of_pull_request(db, REPO, number)
    finally:
        db.close()


def jobs_of(w: World, kind: str) -> list[store.BotJob]:
    db = Database(w.settings.database_url or "", pool_size=1)
    try:
        return [j for j in store.list_jobs(db, REPO) if j.kind == kind]
    finally:
        db.close()


def apply_check(w: World, sha: str) -> dict[str, Any]:
    found = w.sim.runs("kilolock/apply", sha=sha)
    assert found, f"no kilolock/apply check on {sha[:7]}"
    return found[-1]


def test_comment_applies_are_off_unless_the_default_branch_enables_them(world_factory):  # noqa: F811
    w = world_factory()
    # The pull request tries to switch comment applies on for itself.
    w.open_pr(1, "db-v2", {"db.tf": DB_V2, ".kilolock.yml": OPEN})
    w.run_jobs()

    comment(w, 1, "kilolock apply")
    w.run_jobs()

    [reply] = replies(w, 1)
    assert reply.startswith("@alice comment applies are disabled for `infra`, so nothing was applied.")
    assert "set `apply_on_comment: true` in `.kilolock.yml` on main" in reply
    assert w.serial() == 1 and w.runs() == [] and reservations(w) == []


def test_each_requirement_fails_with_its_name_and_the_apply_runs_once_all_hold(world_factory, request):  # noqa: F811
    gate = "apply_on_comment: true\napply_requirements: [approved, mergeable, undiverged]\n"
    w = world_factory(kilolock_yml=gate)
    # The head relaxes the gate in its own .kilolock.yml: only the default branch's counts.
    w.open_pr(1, "db-v2", {"db.tf": DB_V2, ".kilolock.yml": OPEN})
    w.run_jobs()

    comment(w, 1, "kilolock apply")
    w.run_jobs()
    assert "- **approved**: no approving review by someone with write access other than the author" in replies(w, 1)[-1]
    w.push_pr(1, {".kilolock.yml": gate})

    w.sim.review(1, "alice", "APPROVED")  # the author's own approval does not count
    w.sim.review(1, "bob", "APPROVED")
    w.sim.prs[1].update(mergeable=False, mergeable_state="dirty")
    comment(w, 1, "kilolock apply")
    w.run_jobs()
    reply = replies(w, 1)[-1]
    assert "**mergeable**: it has merge conflicts" in reply and "approved" not in reply

    w.sim.prs[1].update(mergeable=True, mergeable_state="clean")
    w.write("README.md", "# infra\n")
    git(w.work, "add", "README.md")
    git(w.work, "commit", "-qm", "main moves on")
    git(w.work, "push", "-q", "origin", "main")
    comment(w, 1, "kilolock apply")
    w.run_jobs()
    reply = replies(w, 1)[-1]
    assert "**undiverged**: the head does not contain the tip of main" in reply and "mergeable" not in reply
    assert w.serial() == 1 and w.runs() == []

    git(w.work, "checkout", "-q", "db-v2")
    git(w.work, "merge", "-q", "--no-edit", "main")
    git(w.work, "push", "-q", "origin", "db-v2")
    head = w.head()
    git(w.work, "checkout", "-q", "main")
    w.sim.push_pr(1, head)
    w.sim.prs[1]["base_sha"] = w.head("main")
    w.deliver_pr("synchronize", 1)
    comment(w, 1, "kilolock apply")
    w.run_jobs()
    assert "**approved**: the approval is of an earlier commit" in replies(w, 1)[-1]

    w.deliver_review(1, "carol", "changes_requested")
    w.run_jobs()
    assert apply_check(w, head)["output"]["title"] == "waiting for: approved"
    w.deliver_review(1, "carol", "approved")
    w.run_jobs()
    check = apply_check(w, head)
    assert (check["status"], check["output"]["title"]) == \
        ("queued", "ready to apply before merge: comment kilolock apply (infra)")
    assert w.serial() == 1
    comment(w, 1, "kilolock apply")
    w.run_jobs()

    assert w.trunk()["terraform_data.db"] == "prod-app-db-v2", replies(w, 1)[-1]
    assert w.trunk()["terraform_data.db"] == "prod-app-db-v2" and w.serial() == 2
    [run] = [r for r in w.runs() if r["status"] == "committed"]
    assert run["actor"] == f"github:{REPO}#1@{head[:12]}/infra"
    reply = replies(w, 1)[-1]
    assert f"- `infra`: committed at serial 2 (run `{run['id']}`): 1 to update" in reply
    check = apply_check(w, head)
    assert (check["conclusion"], check["output"]["title"]) == ("success", "applied before merge: infra at serial 2")
    assert held(w) == {f"{REPO}#1": DB_HELD}, dump(held(w))
    body = marked(w, 1)
    assert "### Applied before merge" in body
    assert "| `infra` | `infra` | `terraform_data.db`, `terraform_data.db.*`," in body
    assert_golden(request, "e2e-applied-before-merge.md", normalize(body, {head: "<head>"}))
    assert_golden(request, "e2e-apply-reply.md", normalize(reply, {head: "<head>"}))


def test_disjoint_pull_requests_apply_in_parallel_and_an_overlapping_one_is_refused(world_factory):  # noqa: F811
    files = {**FILES, "slow_a.tf": slow("a", "a1", 0), "slow_b.tf": slow("b", "b1", 0)}
    w = world_factory(mode="token", files=files, served=True, kilolock_yml=OPEN)
    gate = w.tmp / "release-applies"
    w.open_pr(1, "a2", {"slow_a.tf": slow("a", "a2", 0, until=gate)})
    w.open_pr(2, "b2", {"slow_b.tf": slow("b", "b2", 0, until=gate)})
    w.run_jobs()
    comment(w, 1, "kilolock apply")
    comment(w, 2, "kilolock apply -p infra")

    workers = w.start_workers(2)
    try:
        wait_for(lambda: len([r for r in w.runs() if r["status"] == "running" and not r["actor"].startswith(REPO)])
                 == 2, "both applies to run", timeout=240)
    finally:
        gate.touch()
    outputs = [p.communicate(timeout=300)[0] for p in workers]

    runs = {r["actor"].split("#")[1][0]: r for r in w.runs() if not r["actor"].startswith(REPO)}
    assert {k: r["status"] for k, r in runs.items()} == {"1": "committed", "2": "committed"}, dump(runs) + \
        "\n".join(outputs)
    one, two = runs["1"], runs["2"]
    assert one["started_at"] < two["finished_at"] and two["started_at"] < one["finished_at"], dump(runs)
    assert held(w) == {f"{REPO}#1": ["write terraform_data.a", "write terraform_data.a.*"],
                       f"{REPO}#2": ["write terraform_data.b", "write terraform_data.b.*"]}

    # A third pull request changes what #1 applied: its comment apply is refused, naming #1.
    w.open_pr(3, "a3", {"slow_a.tf": slow("a", "a3", 0)})
    w.run_jobs()
    comment(w, 3, "kilolock apply")
    w.run_jobs()
    reply = replies(w, 3)[-1]
    assert "held by another pull request: pull request #1 (octo-org/infra#1) holds write terraform_data.a" in reply
    assert w.trunk()["terraform_data.a"] == "a2"
    assert "**Held by #1** (`infra`)" in marked(w, 3)
    assert "### Applied before merge" in marked(w, 1)

    # A person's kl apply of the same file is refused (exit 2), naming the pull request.
    w.write("slow_a.tf", slow("a", "a9", 0))
    env = {**w.tf_env, "PATH": os.environ["PATH"], "HOME": str(w.tmp), "KL_DATA_DIR": str(w.tmp / "human")}
    kl = str(Path(sys.executable).with_name("kl"))
    proc = subprocess.run([kl, "apply", "-f", "slow_a.tf", "--confirm-scope", "--actor", "bob"], cwd=w.work,
                          env=env, capture_output=True, text=True, timeout=300)
    git(w.work, "checkout", "-q", "--", "slow_a.tf")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"held by {REPO}#1" in proc.stdout + proc.stderr

    # Terraform's whole-state LOCK meets the holds: 423, naming both pull requests.
    lock = requests.request("LOCK", f"{w.server_url}/v1/states/infra", timeout=10,
                            json={"ID": "tf-1", "Operation": "OperationTypeApply", "Who": "carol@laptop"})
    assert lock.status_code == 423 and f"{REPO}#1" in lock.json()["Who"] and f"{REPO}#2" in lock.json()["Who"]
    assert w.trunk()["terraform_data.a"] == "a2"


def test_a_merge_of_the_applied_files_does_not_apply_again_and_releases_the_holds(world_factory, request):  # noqa: F811
    w = world_factory(kilolock_yml=OPEN)
    head = w.open_pr(1, "db-v2", {"db.tf": DB_V2})
    w.run_jobs()
    comment(w, 1, "kilolock apply")
    w.run_jobs()
    assert w.serial() == 2 and held(w)

    merge = w.merge(1)
    w.run_jobs()

    assert w.serial() == 2 and reservations(w) == [] and holds_of(w, 1) == []
    assert jobs_of(w, "apply_project") == []
    check = apply_check(w, merge)
    assert (check["conclusion"], check["output"]["title"]) == ("success", "applied: infra before merge at serial 2")
    body = marked(w, 1)
    assert "applied before merge at serial 2" in body and "### Applied before merge" not in body
    assert_golden(request, "e2e-merged-after-apply.md", normalize(body, {head: "<head>", merge: "<merge>"}))
    [hold_run] = [r for r in w.runs() if r["actor"] == f"{REPO}#1"]
    assert hold_run["status"] == "aborted" and "#1 was merged" in hold_run["error_summary"]


def test_a_merge_after_the_base_moved_applies_again(world_factory):  # noqa: F811
    w = world_factory(kilolock_yml=OPEN)
    w.open_pr(1, "db-v2", {"db.tf": DB_V2})
    w.run_jobs()
    comment(w, 1, "kilolock apply")
    w.run_jobs()
    # Meanwhile another change reaches main, touching the project (applied by its own means).
    w.write("network.tf", FILES["network.tf"] + "# owned by the network team\n")
    git(w.work, "commit", "-qam", "network comment")
    git(w.work, "push", "-q", "origin", "main")

    merge = w.merge(1)
    w.run_jobs()

    [child] = jobs_of(w, "apply_project")
    assert child.result["apply"]["status"] == "no_changes", child.result
    assert reservations(w) == [] and w.trunk()["terraform_data.db"] == "prod-app-db-v2"
    assert apply_check(w, merge)["output"]["title"] == "applied: no changes"
    assert "applied before merge" not in marked(w, 1)


def test_unlock_needs_write_access_and_a_close_releases_and_warns(world_factory):  # noqa: F811
    w = world_factory(kilolock_yml=OPEN)
    w.open_pr(1, "db-v2", {"db.tf": DB_V2})
    w.run_jobs()
    comment(w, 1, "kilolock apply")
    w.run_jobs()

    comment(w, 1, "kilolock unlock", login="mallory")
    w.run_jobs()
    assert replies(w, 1)[-1].startswith("@mallory only people with write access to octo-org/infra")
    assert f"{REPO}#1" in held(w)

    comment(w, 1, "kilolock unlock")
    w.run_jobs()
    reply = replies(w, 1)[-1]
    assert reply.startswith("@alice released the holds of #1:") and "write `terraform_data.db`" in reply
    assert reservations(w) == [] and "### Applied before merge" not in marked(w, 1)

    comment(w, 1, "kilolock apply")
    w.run_jobs()
    assert holds_of(w, 1) and "no changes" in replies(w, 1)[-1]
    w.sim.close_pr(1)
    w.deliver_pr("closed", 1)
    w.run_jobs()

    assert reservations(w) == [] and holds_of(w, 1) == []
    body = marked(w, 1)
    assert "**Closed without merging**: the change applied before merge (`infra` at serial 2)" in body
    assert "**not on the default branch**" in body


def test_a_push_makes_the_apply_check_stale_and_the_holds_stay(world_factory):  # noqa: F811
    w = world_factory(kilolock_yml=OPEN)
    first = w.open_pr(1, "db-v2", {"db.tf": DB_V2})
    w.run_jobs()
    comment(w, 1, "kilolock apply")
    w.run_jobs()
    assert apply_check(w, first)["conclusion"] == "success"

    second = w.push_pr(1, {"queue.tf": QUEUE_V2})
    w.run_jobs()

    check = apply_check(w, second)
    assert (check["status"], check["output"]["title"]) == ("queued", "not applied: new commits since kilolock apply")
    assert held(w) == {f"{REPO}#1": DB_HELD}
    assert "The head moved to" in marked(w, 1)

    comment(w, 1, "kilolock apply")
    w.run_jobs()
    assert apply_check(w, second)["conclusion"] == "success" and w.trunk()["terraform_data.queue"] == "queue-v2"
    assert held(w)[f"{REPO}#1"] == sorted(DB_HELD + ["write terraform_data.queue", "write terraform_data.queue.*"])
    [hold] = holds_of(w, 1)
    assert (hold.head_sha, hold.applied_serial) == (second, 3)


def test_a_missed_close_is_reconciled_at_the_next_delivery(world_factory):  # noqa: F811
    w = world_factory(kilolock_yml=OPEN)
    w.open_pr(1, "db-v2", {"db.tf": DB_V2})
    w.run_jobs()
    comment(w, 1, "kilolock apply")
    w.run_jobs()
    assert holds_of(w, 1)
    w.sim.close_pr(1)  # GitHub never delivers this close

    w.connection().delete(f"kilolock:reconcile:{REPO}")  # the reconciliation interval has passed
    w.open_pr(2, "queue-v2", {"queue.tf": QUEUE_V2})
    w.run_jobs()

    assert holds_of(w, 1) == [] and reservations(w) == []
    assert "**Closed without merging**" in marked(w, 1)
    [reconciled] = jobs_of(w, "pull_request_closed")
    assert reconciled.number == 1 and reconciled.result["released"][0]["serial"] == 2


def test_another_pull_requests_merge_waits_for_the_hold_and_then_fails_naming_it(world_factory):  # noqa: F811
    w = world_factory(kilolock_yml=OPEN + "merge_wait: 3s\n")
    w.open_pr(1, "db-v2", {"db.tf": DB_V2})
    w.open_pr(2, "db-v3", {"db.tf": DB_V3})
    w.run_jobs()
    comment(w, 1, "kilolock apply")
    w.run_jobs()
    assert "**Held by #1** (`infra`)" in marked(w, 2)  # opened before the apply: refreshed by it
    # People see the hold where they see every reservation: kl reservations and the dashboard.
    env = {**w.tf_env, "PATH": os.environ["PATH"], "HOME": str(w.tmp), "KL_DATA_DIR": str(w.tmp / "human")}
    listed = subprocess.run([str(Path(sys.executable).with_name("kl")), "reservations"], cwd=w.work, env=env,
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0 and f"write terraform_data.db\theld by {REPO}#1 (" in listed.stdout, listed
    page = requests.get(f"{w.server_url}/ui/reservations", timeout=10)
    assert page.status_code == 200 and f"{REPO}#1" in page.text

    merge = w.merge(2)
    w.run_jobs()

    assert w.trunk()["terraform_data.db"] == "prod-app-db-v2" and w.serial() == 2
    check = apply_check(w, merge)
    assert check["conclusion"] == "failure" and f"held by {REPO}#1" in check["output"]["summary"]
    assert held(w) == {f"{REPO}#1": DB_HELD}


def test_a_writer_holds_and_releases_from_a_comment_and_an_apply_meeting_the_hold_names_it(world_factory):  # noqa: F811
    w = world_factory(kilolock_yml=OPEN)
    w.open_pr(1, "db-v2", {"db.tf": DB_V2})
    w.run_jobs()
    comment(w, 1, 'kilolock hold terraform_data.db --reason "DB freeze: vendor <maintenance>" --until 1h',
            login="mallory")
    w.run_jobs()
    assert replies(w, 1)[-1].startswith("@mallory only people with write access") and reservations(w) == []

    comment(w, 1, 'kilolock hold terraform_data.db --reason "DB freeze: vendor <maintenance>" --until 1h')
    w.run_jobs()
    reply = replies(w, 1)[-1]
    [held_row] = reservations(w)
    hold_id = held_row["run_id"]
    assert reply.startswith("@alice holds `terraform_data.db` on state `infra`")
    assert f"kilolock release {hold_id}" in reply
    assert "&lt;maintenance&gt;" in reply or "\\<maintenance\\>" in reply, reply  # escaped once, never raw HTML
    assert held_row["holder"] == (f'@alice on {REPO}#1\'s manual hold "DB freeze: vendor <maintenance>" '
                                  f"(release: kl release {hold_id})")

    # The pull request's own apply meets the hold: refused before Terraform applies, naming holder and reason.
    comment(w, 1, "kilolock apply")
    w.run_jobs()
    refused = replies(w, 1)[-1]
    assert "manual hold" in refused and f"kl release {hold_id}" in refused and "@alice" in refused, refused
    assert w.trunk()["terraform_data.db"] == "prod-app-db-v1"

    comment(w, 1, f"kilolock release {hold_id}", login="bob")
    w.run_jobs()
    assert replies(w, 1)[-1].startswith(f"@bob released hold `{hold_id}`") and reservations(w) == []
    comment(w, 1, "kilolock hold --reason nothing")
    w.run_jobs()
    assert "needs address globs and a reason" in replies(w, 1)[-1]
