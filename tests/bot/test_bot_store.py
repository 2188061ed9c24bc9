"""app.store.bot against real Postgres, and the cross-PR overlap rule (app.domain.overlaps)."""

from __future__ import annotations

import json
import threading
import uuid

import pytest

from app.domain.overlaps import pr_overlaps, shared_globs
from app.store import bot as store
from app.store.bot import PrFootprint

REPO = "octo-org/infra"


def fp(number: int, write: tuple[str, ...] = (), read: tuple[str, ...] = (), *, project: str = "network",
       state: str = "prod", repo: str = REPO, sha: str = "a" * 40) -> PrFootprint:
    return PrFootprint(repo=repo, number=number, project=project, state_name=state, head_sha=sha,
                       files=(f"{project}/main.tf",), write_globs=write, read_globs=read)


# --- deliveries ---------------------------------------------------------------------------------


def test_a_delivery_is_recorded_once(bot_db):
    delivery = str(uuid.uuid4())

    assert store.record_delivery(bot_db, delivery, "pull_request", "opened", REPO) is True
    assert store.record_delivery(bot_db, delivery, "pull_request", "opened", REPO) is False
    recorded = store.get_delivery(bot_db, delivery)
    assert recorded is not None and (recorded.status, recorded.job_ids, recorded.detail) == ("received", [], {})


def test_a_queued_or_ignored_delivery_is_never_taken_again(bot_db):
    queued, ignored = str(uuid.uuid4()), str(uuid.uuid4())
    for delivery in (queued, ignored):
        store.record_delivery(bot_db, delivery, "pull_request", "opened", REPO)
    store.mark_delivery(bot_db, queued, "queued", ["job-1"], {"kinds": ["pull_request"]})
    store.mark_delivery(bot_db, ignored, "ignored", detail={"reason": "labeled"})

    assert store.record_delivery(bot_db, queued, "pull_request", "opened", REPO) is False
    assert store.record_delivery(bot_db, ignored, "pull_request", "opened", REPO) is False
    recorded = store.get_delivery(bot_db, queued)
    assert recorded is not None and (recorded.status, recorded.job_ids) == ("queued", ["job-1"])


def test_a_failed_delivery_is_taken_over_by_its_redelivery(bot_db):
    delivery = str(uuid.uuid4())
    store.record_delivery(bot_db, delivery, "pull_request", "opened", REPO)
    store.mark_delivery(bot_db, delivery, "failed", detail={"error": "enqueue failed"})

    assert store.record_delivery(bot_db, delivery, "pull_request", "opened", REPO) is True
    recorded = store.get_delivery(bot_db, delivery)
    assert recorded is not None and (recorded.status, recorded.detail) == ("received", {})


def test_a_delivery_stuck_in_received_is_taken_over_only_when_stale(bot_db):
    delivery = str(uuid.uuid4())
    store.record_delivery(bot_db, delivery, "push", "", REPO)
    assert store.record_delivery(bot_db, delivery, "push", "", REPO) is False

    with bot_db.transaction() as conn:
        conn.execute("UPDATE webhook_deliveries SET received_at = now() - interval '10 minutes' "
                     "WHERE delivery_id = %s", (delivery,))
    assert store.record_delivery(bot_db, delivery, "push", "", REPO) is True


def test_concurrent_copies_of_one_delivery_record_it_once(bot_db):
    delivery = str(uuid.uuid4())
    results: list[bool] = []
    barrier = threading.Barrier(8)

    def record() -> None:
        barrier.wait()
        results.append(store.record_delivery(bot_db, delivery, "pull_request", "opened", REPO))

    threads = [threading.Thread(target=record) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 7 + [True]


def test_receive_delivery_records_and_marks_in_one_transaction(bot_db):
    delivery = str(uuid.uuid4())
    with store.receive_delivery(bot_db, delivery, "pull_request", "opened", REPO) as receipt:
        assert receipt is not None
        receipt.mark("queued", ["job-1"])
    with store.receive_delivery(bot_db, delivery, "pull_request", "opened", REPO) as again:
        assert again is None

    recorded = store.get_delivery(bot_db, delivery)
    assert recorded is not None and (recorded.status, recorded.job_ids) == ("queued", ["job-1"])


def test_receive_delivery_records_nothing_when_the_block_fails(bot_db):
    delivery = str(uuid.uuid4())
    with pytest.raises(RuntimeError), store.receive_delivery(bot_db, delivery, "push", "", REPO) as receipt:
        assert receipt is not None
        raise RuntimeError("redis is down")

    assert store.get_delivery(bot_db, delivery) is None
    assert store.record_delivery(bot_db, delivery, "push", "", REPO) is True


def test_mark_delivery_refuses_an_unknown_status(bot_db):
    with pytest.raises(ValueError):
        store.mark_delivery(bot_db, "x", "done")


# --- footprints ---------------------------------------------------------------------------------


def test_footprints_are_upserted_listed_by_state_and_dropped(bot_db):
    store.save_footprint(bot_db, fp(1, ("aws_vpc.main",)))
    store.save_footprint(bot_db, fp(1, ("aws_vpc.main", "aws_subnet.a"), sha="b" * 40))  # same key: replaced
    store.save_footprint(bot_db, fp(1, ("aws_iam_role.x",), project="iam", state="iam"))
    store.save_footprint(bot_db, fp(2, ("module.app.*",), ("aws_vpc.main",), project="app"))
    store.save_footprint(bot_db, fp(3, ("aws_vpc.main",), repo="octo-org/other"))

    found = store.open_footprints(bot_db, REPO, "prod")
    assert [(f.number, f.project, f.head_sha, f.write_globs, f.read_globs) for f in found] == [
        (1, "network", "b" * 40, ("aws_vpc.main", "aws_subnet.a"), ()),
        (2, "app", "a" * 40, ("module.app.*",), ("aws_vpc.main",)),
    ]
    assert found[0].files == ("network/main.tf",) and found[0].updated_at is not None
    assert [f.number for f in store.open_footprints(bot_db, REPO, "prod", exclude_number=1)] == [2]

    store.drop_footprints(bot_db, REPO, 1)
    assert [f.number for f in store.open_footprints(bot_db, REPO, "prod")] == [2]
    assert store.open_footprints(bot_db, REPO, "iam") == []
    assert [f.number for f in store.open_footprints(bot_db, "octo-org/other", "prod")] == [3]


def test_overlaps_name_the_other_prs_and_the_shared_globs(bot_db):
    mine = fp(5, ("aws_vpc.main", "module.app.*"), ("data.aws_ami.base",))
    for other in [
        fp(1, ("aws_vpc.main",)),                                 # write/write, same glob
        fp(2, (), ("module.app.aws_instance.web[0]",)),           # my write covers their read
        fp(3, ("data.aws_ami.base",)),                            # their write on my read
        fp(4, (), ("data.aws_ami.base", "aws_s3_bucket.logs")),   # read/read only: no overlap
        fp(6, ("aws_vpc.main",), state="staging"),                # another state
        fp(7, ("aws_subnet.a",)),                                 # disjoint
        fp(8, ("aws_vpc.main",), project="a"), fp(8, ("module.app.*",), project="b"),
    ]:
        store.save_footprint(bot_db, other)

    others = store.open_footprints(bot_db, REPO, "prod", exclude_number=5)
    assert pr_overlaps(mine, others) == [
        (1, ["aws_vpc.main"]),
        (2, ["module.app.* ∩ module.app.aws_instance.web[0]"]),
        (3, ["data.aws_ami.base"]),
        (8, ["aws_vpc.main", "module.app.*"]),
    ]


def test_the_overlap_rule_is_symmetric_and_skips_the_pr_itself():
    a = fp(1, ("*",))
    b = fp(2, (), ("aws_vpc.main",))

    assert pr_overlaps(a, [a, b]) == [(2, ["* ∩ aws_vpc.main"])]
    assert pr_overlaps(b, [a, b]) == [(1, ["aws_vpc.main ∩ *"])]
    assert shared_globs(fp(1, (), ("*",)), fp(2, (), ("*",))) == []
    assert pr_overlaps(fp(1, ("not a glob!",)), [fp(2, ("aws_vpc.main",))]) == [(2, ["not a glob! ∩ aws_vpc.main"])]


# --- jobs ---------------------------------------------------------------------------------------


def test_claim_inserts_a_running_job_and_counts_attempts(bot_db):
    job = store.claim_job(bot_db, "job-a", "pull_request", REPO, number=2, sha="c" * 40, project="network")
    again = store.claim_job(bot_db, "job-a", "pull_request", REPO, number=2, sha="c" * 40, project="network")

    assert (job.status, job.attempts, job.result, job.posted, job.error) == ("running", 1, {}, False, None)
    assert (job.kind, job.repo, job.number, job.sha, job.project) == ("pull_request", REPO, 2, "c" * 40, "network")
    assert (again.status, again.attempts) == ("running", 2)


def test_a_finished_job_is_returned_unchanged_so_its_stored_result_is_posted(bot_db):
    store.claim_job(bot_db, "job-b", "merge_apply", REPO, number=3, sha="d" * 40)
    store.finish_job(bot_db, "job-b", "failed", {"serial": None, "error": "apply failed"}, error="exit 1")

    stored = store.claim_job(bot_db, "job-b", "merge_apply", REPO, number=3, sha="d" * 40)
    assert (stored.status, stored.attempts, stored.result, stored.error, stored.posted) == (
        "failed", 1, {"serial": None, "error": "apply failed"}, "exit 1", False)
    assert stored.is_finished

    store.mark_posted(bot_db, "job-b")
    posted = store.get_job(bot_db, "job-b")
    assert posted is not None and posted.posted is True
    assert store.claim_job(bot_db, "job-b", "merge_apply", REPO, number=3, sha="d" * 40) == posted


def test_finishing_again_stores_the_new_outcome_as_not_yet_posted(bot_db):
    store.claim_job(bot_db, "job-c", "pull_request", REPO, number=2, sha="e" * 40)
    store.finish_job(bot_db, "job-c", "succeeded", {"comment": 1})
    store.mark_posted(bot_db, "job-c")
    store.finish_job(bot_db, "job-c", "succeeded", {"comment": 2})

    job = store.get_job(bot_db, "job-c")
    assert job is not None and (job.result, job.posted) == ({"comment": 2}, False)


def test_finish_job_refuses_a_status_that_is_not_an_outcome_and_an_unknown_job(bot_db):
    store.claim_job(bot_db, "job-d", "push", REPO, number=None, sha="f" * 40)
    with pytest.raises(ValueError, match="succeeded, failed or skipped"):
        store.finish_job(bot_db, "job-d", "running", {})
    with pytest.raises(LookupError, match="claim_job it first"):
        store.finish_job(bot_db, "no-such-job", "succeeded", {})


def test_reset_job_lets_the_next_claim_run_it_again(bot_db):
    store.claim_job(bot_db, "job-e", "pull_request", REPO, number=2, sha="1" * 40)
    store.finish_job(bot_db, "job-e", "succeeded", {"x": 1})
    store.mark_posted(bot_db, "job-e")

    reset = store.reset_job(bot_db, "job-e")
    rerun = store.claim_job(bot_db, "job-e", "pull_request", REPO, number=2, sha="1" * 40)

    assert reset is not None and (reset.status, reset.result, reset.posted) == ("queued", {}, False)
    assert (rerun.status, rerun.attempts) == ("running", 2)
    assert store.reset_job(bot_db, "no-such-job") is None


def test_jobs_are_listed_per_repository_and_pull_request(bot_db):
    store.claim_job(bot_db, "j1", "pull_request", REPO, number=2, sha="1" * 40)
    store.claim_job(bot_db, "j2", "plan_preview", REPO, number=2, sha="1" * 40, project="app")
    store.claim_job(bot_db, "j3", "pull_request", REPO, number=3, sha="2" * 40)
    store.claim_job(bot_db, "j4", "push", "octo-org/other", number=None, sha="3" * 40)

    assert [j.id for j in store.list_jobs(bot_db, REPO)] == ["j1", "j2", "j3"]
    assert [j.id for j in store.list_jobs(bot_db, REPO, 2)] == ["j1", "j2"]
    assert store.get_job(bot_db, "missing") is None


def test_rows_stored_before_arguments_were_kept_read_back_typed_after_the_migration(bot_db):
    from pathlib import Path

    from app.domain.jobs import ApplyProjectArgs, DriftCheckArgs, JobKind, MergeArgs, PushArgs

    old = [  # as the worker stored them when the merge job still had one kind for both steps
        ("m", "merge_apply", 7, "a" * 40, "", {"base": "b" * 40, "children": ["app"], "skipped": []}),
        ("m-app", "merge_apply", 7, "a" * 40, "app", {"apply": {"status": "failed"}}),
        ("p", "push", None, "c" * 40, "", {"skipped": "the push created or deleted the branch", "before": "d" * 40}),
        ("dc", "drift_check", None, "e" * 40, "app", {"drift": {"window": 3600, "branch": "main"}}),
    ]
    with bot_db.transaction() as conn:
        for id_, kind, number, sha, project, result in old:
            conn.execute("INSERT INTO bot_jobs (id, kind, repo, number, sha, project, status, result) "
                         "VALUES (%s, %s, %s, %s, %s, %s, 'failed', %s)",
                         (id_, kind, REPO, number, sha, project, json.dumps(result)))
    migration = (Path(__file__).resolve().parents[2] / "migrations" / "0014_bot_job_args.sql").read_text()
    statements = [s for s in migration.split(";")
                  if "\n".join(line for line in s.splitlines() if not line.startswith("--")).strip()
                  .startswith("UPDATE")]
    with bot_db.transaction() as conn:
        for statement in statements:
            conn.execute(statement)

    rows = {r.id: r for r in store.list_jobs(bot_db, REPO)}
    assert (rows["m"].kind, rows["m"].args) == (JobKind.MERGE, MergeArgs(REPO, 7, "a" * 40))
    assert (rows["m-app"].kind, rows["m-app"].args) == (
        JobKind.APPLY_PROJECT, ApplyProjectArgs(REPO, 7, "a" * 40, "app", "b" * 40))
    assert rows["p"].args == PushArgs(REPO, "c" * 40, "d" * 40)
    assert rows["dc"].args == DriftCheckArgs(REPO, "app", 3600, "e" * 40, "main")
