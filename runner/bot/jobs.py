"""RQ entry points of the GitHub bot (``app.domain.jobs.REGISTRY`` names them by dotted path), and the table that
says, per job kind, how it runs and how its stored outcome is posted.

Every job is thin and idempotent. Its arguments are one frozen type per kind (``app.domain.jobs``),
passed by keyword. It opens its database connection inside the job (after RQ forked), **claims** its
row in ``bot_jobs`` (the id is the RQ job id, derived from kind, repository, PR and SHA; the row keeps
the arguments), and when that row already holds an outcome it re-posts it instead of recomputing — so a
redelivery, or an RQ retry after GitHub failed, never runs Terraform twice for one job (a job whose
worker died before storing anything runs again: an apply that did commit then plans no changes).
Otherwise it runs (``runner.bot.pulls``, ``runner.bot.merges``), **stores the typed result**
(``runner.bot.results``) and only then delivers it to GitHub; when GitHub is down or rate-limits us the
job raises, RQ retries it, and the retry posts the stored outcome. The one comment per pull request is
always rendered from stored outcomes, under a Redis lock per PR, so jobs of two PRs that overlap can
both refresh both comments without racing.

Must not: import Flask or ``app.web``, read the environment (``runner.bot.context``), or post anything
it has not stored first.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rq import Worker

from app import queue
from app.config import Settings
from app.domain.jobs import (
    ApplyProjectArgs,
    ClosedArgs,
    CommentArgs,
    DriftCheckArgs,
    DriftTickArgs,
    JobArgs,
    JobKind,
    MergeArgs,
    PreviewArgs,
    PullRequestArgs,
    PushArgs,
    ReconcileArgs,
    ReviewArgs,
)
from app.domain.redaction import redact_logs
from app.store import bot as store
from app.store.bot import BotJob, JobStatus
from runner.bot import drift_schedule, flow, merges, outgoing, pr_holds, pulls, render
from runner.bot.context import (
    APPLY_CHECK,
    FOOTPRINT_CHECK,
    PLAN_CHECK,
    Context,
    complete,
    configure,
    current_settings,
    opened,
    services,
)
from runner.bot.github import GitHubError
from runner.bot.results import JobResult, footprint_of, result_of

log = logging.getLogger("kilolock.jobs")

Run = Callable[[Context, Any], tuple[JobStatus, JobResult]]
Deliver = Callable[[Context, BotJob, JobResult], None]


@dataclass(frozen=True, slots=True)
class Handler:
    """How a kind of job runs (returning the result to store) and posts a stored result."""

    run: Run
    deliver: Deliver
    check: str | None = None  # the check run a crash of this kind is reported in


HANDLERS: dict[JobKind, Handler] = {
    JobKind.PULL_REQUEST: Handler(pulls.footprint, pulls.deliver_footprint, FOOTPRINT_CHECK),
    JobKind.PLAN_PREVIEW: Handler(pulls.preview, pulls.deliver_preview, PLAN_CHECK),
    JobKind.PULL_REQUEST_CLOSED: Handler(pulls.closed, pulls.deliver_closed),
    JobKind.COMMENT: Handler(pulls.comment, pulls.deliver_comment),
    JobKind.PULL_REQUEST_REVIEW: Handler(pulls.review, pulls.deliver_review),
    JobKind.MERGE: Handler(merges.merge, merges.deliver_merge, APPLY_CHECK),
    JobKind.PUSH: Handler(merges.push, merges.deliver_push, FOOTPRINT_CHECK),
    JobKind.APPLY_PROJECT: Handler(merges.apply_project, merges.deliver_apply),
}


def run(args: JobArgs, *parts: str | int) -> str:
    """Claim, run, store, deliver: one stored job of any kind in ``HANDLERS``."""
    handler = HANDLERS[args.kind]
    with opened(args, *parts) as ctx, _crash_reported(ctx, args):
        row = store.claim(ctx.db, ctx.id, args)
        if row.is_finished:
            log.info("job %s already %s: delivering the stored outcome", row.id, row.status)
            deliver(ctx, row)
            return "delivered"
        status, result = handler.run(ctx, args)
        _finish(ctx, status, result)
        return status.value


@contextmanager
def _crash_reported(ctx: Context, args: JobArgs) -> Iterator[None]:
    try:
        yield
    except GitHubError:
        raise  # the outcome is stored: RQ's retry posts it
    except Exception as exc:
        # Anything else (git, the server, a bug) is retried by RQ; the last attempt stores the failure and
        # reports it in the job's check, so it does not stay "in progress" with the reason only in a log.
        if ctx.last_attempt:
            _record_crash(ctx, args, f"{exc.__class__.__name__}: {exc}")
        raise


def _finish(ctx: Context, status: JobStatus, result: JobResult, error: str | None = None) -> None:
    store.finish_job(ctx.db, ctx.id, status, result.to_json(), error=error)
    row = store.get_job(ctx.db, ctx.id)
    assert row is not None
    deliver(ctx, row)


def _record_crash(ctx: Context, args: JobArgs, error: str) -> None:
    try:
        row = store.get_job(ctx.db, ctx.id)
        if row is None or row.is_finished:
            return
        result = merges.crash_result(args, error) if isinstance(args, ApplyProjectArgs) else JobResult(crashed=error)
        _finish(ctx, JobStatus.FAILED, result, error=error)
    except Exception:
        log.exception("job %s: could not report its failure", ctx.id)


def deliver(ctx: Context, row: BotJob) -> None:
    """Post a stored outcome (again). Raises GitHubError when GitHub fails, so RQ retries the job and the
    retry posts the same stored outcome."""
    if row.posted:
        return
    result = result_of(row)
    if row.status is JobStatus.SKIPPED and footprint_of(row) is None:
        log.info("job %s skipped: %s", row.id, result.skipped)
    elif result.crashed is not None:
        handler = HANDLERS.get(row.kind)
        check = handler.check if handler is not None else None
        if check is not None and row.sha:
            complete(ctx.github(row.repo), row.sha, check, render.CheckOutput(
                "failure", "Kilolock could not finish this job", f"```\n{result.crashed[-3000:]}\n```\n\n"
                "It was retried; re-run the check once the cause is fixed."), row.id)
    else:
        HANDLERS[row.kind].deliver(ctx, row, result)
    store.mark_posted(ctx.db, row.id)


# How often an idle worker checks whether RQ's scheduler needs a new owner. RQ's scheduler lock outlives a
# worker killed while holding it by about a minute; RQ's own default check (every 10 minutes) would leave
# the drift and event ticks unscheduled for that long. Registry cleaning runs at the same pace (cheap).
SCHEDULER_TAKEOVER_SECONDS = 30


def work(settings: Settings, *, burst: bool = False, name: str | None = None, with_scheduler: bool = True) -> bool:
    """Run an RQ worker on the ``kilolock`` queue (JSON serializer) until SIGTERM (``kl worker``).

    Each job runs in a forked work horse. The first SIGTERM is a warm shutdown: the running job finishes,
    however long its apply takes; a second one kills the horse (Terraform, in its own process group, is
    not killed with it). ``with_scheduler`` also runs RQ's scheduler, which re-enqueues retried jobs.
    """
    configure(settings)
    # Logs never carry the worker's secrets, nor token shapes or Terraform's values from a job's output.
    redact_logs(flow.Workbench.for_settings(settings).redactor)
    redis = queue.connect(settings.redis_url or "redis://")
    # An idle worker wakes from its blocking dequeue every worker_ttl - 15 seconds, and only then runs the check.
    worker = Worker([queue.open_queue(redis)], connection=redis, serializer=queue.SERIALIZER, name=name,
                    maintenance_interval=SCHEDULER_TAKEOVER_SECONDS, worker_ttl=SCHEDULER_TAKEOVER_SECONDS + 15)
    if with_scheduler:  # the drift schedule: one tick stays scheduled (runner.bot.drift_schedule)
        drift_schedule.schedule_tick(redis, settings.job_timeout, time.time())
        outgoing.schedule_tick(redis, settings.event_poll_seconds, time.time())
    outgoing.start(redis)  # what piled up while no worker ran goes out now
    return bool(worker.work(burst=burst, with_scheduler=with_scheduler, logging_level=settings.log_level))


# --- the entry points (one per kind; RQ calls them with the arguments by keyword) ----------------------


def pull_request_footprint(repo: str, number: int, head_sha: str) -> str:
    """PR opened, reopened or synchronized: predict its reservations, record them, comment, check."""
    return run(PullRequestArgs(repo, number, head_sha), number, head_sha)


def pull_request_preview(repo: str, number: int, head_sha: str) -> str:
    """The file-scoped plan of each project the PR touches; updates the comment and ``kilolock/plan``."""
    return run(PreviewArgs(repo, number, head_sha), number, head_sha)


def pull_request_closed(repo: str, number: int) -> str:
    """PR closed without merging: forget its footprint and refresh the comments that named it."""
    return run(ClosedArgs(repo, number), number)


def merge(repo: str, number: int, merge_sha: str) -> str:
    """A merged PR: find the projects the change touches and enqueue one ``apply_project`` each."""
    return run(MergeArgs(repo, number, merge_sha), number, merge_sha)


def apply_project(repo: str, number: int, sha: str, project: str, base: str) -> str:
    """Apply one project of a merge (``number`` > 0) or a push (0) on ``sha``."""
    return run(ApplyProjectArgs(repo, number, sha, project, base), number, sha, project)


def push_to_default_branch(repo: str, after: str, before: str) -> str:
    """A push to the default branch that is not a merged PR: analyze it, and apply it when
    ``apply_on_push`` says so."""
    return run(PushArgs(repo, after, before), after)


def comment_command(repo: str, number: int, comment_id: int, login: str, body: str) -> str:
    """``kilolock plan`` / ``apply`` / ``unlock`` / ``help`` from someone with write access."""
    return run(CommentArgs(repo, number, comment_id, login, body), number, comment_id)


def pull_request_review(repo: str, number: int, head_sha: str) -> str:
    """A review was submitted or dismissed: the head's ``kilolock/apply`` check says whether a comment
    apply may run now (``runner.bot.pr_holds.review_readiness``)."""
    return run(ReviewArgs(repo, number, head_sha), number, head_sha)


def reconcile_holds(repo: str) -> str:
    """Run the merge or close job of every pull request that holds but is no longer open (its delivery
    was missed): see ``runner.bot.pr_holds.reconcile``."""
    args = ReconcileArgs(repo)
    with opened(args) as ctx, _crash_reported(ctx, args):
        ended = pr_holds.reconcile(ctx, ctx.github(repo), repo)
        return "reconciled " + (", ".join(f"#{n}" for n in ended) or "nothing")


def drift_tick(at: int) -> str:
    """Enqueue the drift checks due at ``at`` (epoch seconds) and schedule the next tick."""
    args = DriftTickArgs(at)
    with opened(args, at) as ctx, _crash_reported(ctx, args):
        return "enqueued " + (", ".join(drift_schedule.tick(ctx, at, now=time.time())) or "nothing")


def drift_check(repo: str, project: str, window: int, sha: str, branch: str) -> str:
    """The scheduled drift check of one project for the window starting at ``window``."""
    args = DriftCheckArgs(repo, project, window, sha, branch)
    with opened(args, project, window) as ctx, _crash_reported(ctx, args):
        return drift_schedule.check(ctx, args)


def events_tick(at: int) -> str:
    """Deliver pending outgoing events to every endpoint and schedule the next tick (docs/events.md)."""
    settings = current_settings()
    redis, db = services(settings, "events are read from Postgres")
    try:
        done = outgoing.tick(db, redis, schedule=settings.event_retry_seconds,
                             timeout=settings.event_timeout_seconds, every=settings.event_poll_seconds)
        return ", ".join(f"{name}: {what}" for name, what in done.items()) or "no endpoints"
    finally:
        db.close()


def rerun_check(repo: str, external_id: str, head_sha: str) -> str:
    """A ``kilolock/*`` check run was re-requested: forget the stored outcome of the job its
    ``external_id`` names and run that job again, with the arguments its row kept."""
    settings = current_settings()
    redis, db = services(settings, "bot jobs store their outcome in Postgres")
    try:
        row = store.get_job(db, external_id)
        if row is None or row.repo != repo:
            log.warning("re-run of %s on %s: no such Kilolock job", external_id, repo)
            return "unknown"
        targets = [row]
        if row.kind in (JobKind.MERGE, JobKind.PUSH) and row.status is not JobStatus.FAILED:
            # The apply check stands for all projects of a merge: re-run the ones that failed.
            targets = [j for j in store.list_jobs(db, repo, row.number) if j.kind is JobKind.APPLY_PROJECT
                       and j.sha == row.sha and j.status is JobStatus.FAILED] or [row]
        for target in targets:
            if target.kind in (JobKind.COMMENT, JobKind.PULL_REQUEST_CLOSED) or target.args is None:
                raise ValueError(f"{target.kind} jobs have no check run to re-run")
            store.reset_job(db, target.id)
            queue.enqueue(redis, target.args, job_id=target.id, timeout=settings.job_timeout)
        return "requeued " + ", ".join(t.id for t in targets)
    finally:
        db.close()


__all__: Sequence[str] = ("apply_project", "comment_command", "configure", "drift_check", "drift_tick",
                          "events_tick", "merge",
                          "pull_request_closed", "pull_request_footprint", "pull_request_preview",
                          "pull_request_review", "push_to_default_branch", "reconcile_holds", "rerun_check")
