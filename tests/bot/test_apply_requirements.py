"""The apply requirements of comment applies, as pure rules over a pull request and its reviews."""

from __future__ import annotations

from app.domain.commands import parse_apply_args
from app.domain.jobs import ReviewArgs
from app.domain.webhooks import route
from bench import webhooks
from runner.bot.github import PullInfo, Review
from runner.bot.requirements import approval_problem, unmet

HEAD, OLD = "a" * 40, "b" * 40
WRITERS = frozenset({"alice", "bob", "carol"})


def pr(**changes: object) -> PullInfo:
    fields: dict[str, object] = dict(number=3, head_sha=HEAD, head_ref="x", base_ref="main", base_sha="c" * 40,
                                     merged=False, state="open", author="alice", mergeable=True,
                                     mergeable_state="clean")
    fields.update(changes)
    return PullInfo(**fields)  # type: ignore[arg-type]


def review(login: str, state: str, commit: str = HEAD) -> Review:
    return Review(login, state, commit, "2026-12-01T10:00:00Z")


def test_an_approval_of_the_head_by_someone_else_passes():
    assert approval_problem([review("bob", "APPROVED")], author="alice", head_sha=HEAD, writers=WRITERS) is None


def test_the_authors_own_approval_does_not_count():
    problem = approval_problem([review("alice", "APPROVED")], author="alice", head_sha=HEAD, writers=WRITERS)
    assert problem and "other than the author" in problem


def test_an_approval_of_an_earlier_commit_does_not_count():
    problem = approval_problem([review("bob", "APPROVED", OLD)], author="alice", head_sha=HEAD, writers=WRITERS)
    assert problem and "earlier commit" in problem


def test_outstanding_changes_requested_block_even_with_an_approval():
    reviews = [review("bob", "APPROVED"), review("carol", "CHANGES_REQUESTED")]
    problem = approval_problem(reviews, author="alice", head_sha=HEAD, writers=WRITERS)
    assert problem and "@carol" in problem


def test_the_latest_verdict_per_reviewer_counts_and_comments_do_not_change_it():
    reviews = [review("carol", "CHANGES_REQUESTED"), review("carol", "APPROVED"), review("carol", "COMMENTED")]
    assert approval_problem(reviews, author="alice", head_sha=HEAD, writers=WRITERS) is None
    dismissed = [review("bob", "APPROVED"), review("bob", "DISMISSED")]
    assert approval_problem(dismissed, author="alice", head_sha=HEAD, writers=WRITERS) is not None


def test_reviews_by_people_without_write_access_count_for_nothing():
    drive_by = [review("bob", "APPROVED"), review("mallory", "APPROVED")]
    assert approval_problem(drive_by, author="alice", head_sha=HEAD, writers=frozenset({"alice"})) is not None
    blocked = [review("bob", "APPROVED"), review("mallory", "CHANGES_REQUESTED")]
    assert approval_problem(blocked, author="alice", head_sha=HEAD, writers=WRITERS) is None


def test_the_last_push_must_be_approved_by_someone_other_than_its_pusher():
    def problem(reviews: list[Review], pushers: frozenset[str]) -> str | None:
        [found] = unmet(["last_push_approved"], pr(), reviews=reviews, contains_base_tip=True, writers=WRITERS,
                        pushers=pushers) or [None]
        return found.reason if found else None

    assert problem([review("bob", "APPROVED")], frozenset({"alice"})) is None
    assert "@bob" in (problem([review("bob", "APPROVED")], frozenset({"bob"})) or "")
    assert problem([review("carol", "APPROVED", OLD)], frozenset({"bob"})) is not None
    assert problem([review("mallory", "APPROVED")], frozenset({"bob"})) is not None  # not a writer
    assert "cannot tell who pushed" in (problem([review("bob", "APPROVED")], frozenset()) or "")


def test_mergeable_fails_on_conflicts_blocked_and_unknown():
    for changes in ({"mergeable": False, "mergeable_state": "dirty"}, {"mergeable_state": "blocked"},
                    {"mergeable": None, "mergeable_state": "unknown"}):
        assert [u.name for u in unmet(["mergeable"], pr(**changes), reviews=[], contains_base_tip=True)] == \
            ["mergeable"]
    assert unmet(["mergeable"], pr(mergeable_state="unstable"), reviews=[], contains_base_tip=True) == ()


def test_undiverged_needs_the_base_tip_in_the_head_and_an_empty_list_requires_nothing():
    assert [u.name for u in unmet(["undiverged"], pr(), reviews=[], contains_base_tip=False)] == ["undiverged"]
    assert unmet([], pr(mergeable=False), reviews=[], contains_base_tip=False) == ()


def test_every_failing_requirement_is_named_in_order():
    found = unmet(["approved", "mergeable", "undiverged"], pr(mergeable=False, mergeable_state="dirty"),
                  reviews=[], contains_base_tip=False)
    assert [u.name for u in found] == ["approved", "mergeable", "undiverged"]


def test_apply_arguments_name_one_project_or_none():
    assert parse_apply_args([]).project is None
    assert parse_apply_args(["-p", "prod"]).project == "prod"
    assert parse_apply_args(["--project", "prod"]).project == "prod"
    assert parse_apply_args(["-p"]).problem and parse_apply_args(["now", "please"]).problem


def test_submitted_and_dismissed_reviews_route_to_a_readiness_job_and_others_are_ignored():
    routed = route("pull_request_review", "d-1", webhooks.review_payload())
    [job] = routed.jobs
    assert (job.kind, job.args) == ("pull_request_review", ReviewArgs(webhooks.REPO, 2, webhooks.HEAD_SHA))
    assert route("pull_request_review", "d-2", webhooks.review_payload(action="dismissed")).jobs
    edited = route("pull_request_review", "d-3", webhooks.review_payload(action="edited"))
    assert edited.jobs == () and "not handled" in edited.reason
