"""Scheduled drift in the bot: ``drift: {every: 6h}`` in the default branch's ``.kilolock.yml`` runs the
``kl drift`` check (``runner.core.pipeline.drift``) of each project once per window, and reports it as the
``kilolock/drift`` check run (App mode) or commit status (token mode) on the default branch's head, plus,
with ``issue: true``, one issue per project edited in place and closed when the drift clears.

How a schedule runs. A **tick** job (``runner.bot.jobs.drift_tick``) is scheduled with RQ's scheduler for
each ``TICK_SECONDS`` boundary: ``kl worker`` schedules the next one when it starts, and every tick
schedules its successor before it does anything else, so one tick is always pending while a worker with
the scheduler runs. Ticks are deduplicated twice: by a Redis ``SET NX`` on the slot and by the job id
derived from the slot. A tick reads the repositories the bot knows (``app.store.bot.known_repos``), the
configuration at each default branch's head, and enqueues the check of every project whose window has
no check yet. A window is ``[at - at % every, …)`` in epoch seconds, so every worker and every tick
computes the same windows; the check's job id is derived from repository, project and window start.

One run per project per window, with any number of workers: the tick enqueues a window's check once
(``SET NX`` on its job id), and the check **claims** its ``bot_jobs`` row in Postgres
(``claim_window``): a second copy of the job finds the row running or finished and does not run
Terraform. The outcome is stored before it is posted, and posting happens under a Redis lock and only
while the row is not marked posted, so GitHub sees it once.

Time enters as arguments only (the tick's ``at``, the check's ``window``; ``now`` for staleness), so
tests drive windows without waiting. Must not: render Markdown (``runner.bot.drifttext``), import RQ
(``app.queue`` enqueues), or put attribute values anywhere (a drift outcome holds names only).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from app import queue
from app.domain.jobs import TICK_REPO, DriftCheckArgs, DriftTickArgs, JobKind, job_id
from app.store import bot as store
from app.store.bot import BotJob, JobStatus
from runner.bot import drifttext, flow
from runner.bot.config import BotConfigError, load
from runner.bot.github import GitHubError
from runner.bot.outcomes import DriftOutcome, DriftTarget
from runner.bot.results import DriftResult
from runner.core import git
from runner.core.config import ClientConfigError
from runner.core.engine_client import EngineError
from runner.core.errors import KlExit
from runner.core.pipeline import DriftRequest, drift

if TYPE_CHECKING:
    from runner.bot.context import Context

log = logging.getLogger("kilolock.drift")
DRIFT_CHECK = "kilolock/drift"
TICK_SECONDS = 300


def window_start(at: int, every: int) -> int:
    """The start (epoch seconds) of the ``every``-second window holding ``at``."""
    return at - at % every


def check_id(repo: str, project: str, window: int) -> str:
    return job_id(JobKind.DRIFT_CHECK, repo, project, window)


def tick_id(slot: int) -> str:
    return job_id(JobKind.DRIFT_TICK, TICK_REPO, slot)


def schedule_tick(redis: Any, timeout: int, after: float) -> str | None:
    """Schedule the tick of the first ``TICK_SECONDS`` boundary after ``after``; None when some worker
    already did."""
    slot = (int(after) // TICK_SECONDS + 1) * TICK_SECONDS
    if not redis.set(f"kilolock:drift-tick:{slot}", 1, nx=True, ex=4 * TICK_SECONDS):
        return None
    return queue.enqueue_at(redis, datetime.fromtimestamp(slot, UTC), DriftTickArgs(slot), job_id=tick_id(slot),
                            timeout=timeout).job_id


def tick(ctx: Context, at: int, *, now: float) -> list[str]:
    """One tick at time ``at``: schedule the next tick, then enqueue each due project check (their job
    ids are returned). A tick that ran more than two periods late (no scheduler ran for a while) only
    schedules the next one, so a worker coming back does not replay old windows."""
    schedule_tick(ctx.redis, ctx.settings.job_timeout, max(at, now))
    if at < now - 2 * TICK_SECONDS:
        log.info("drift tick for %s is stale: skipped", at)
        return []
    enqueued: list[str] = []
    for repo in store.known_repos(ctx.db):
        try:
            enqueued += _enqueue_due(ctx, repo, at)
        except (GitHubError, git.GitError, BotConfigError) as exc:
            log.warning("drift schedule of %s: %s", repo, exc)
    return enqueued


def _enqueue_due(ctx: Context, repo: str, at: int) -> list[str]:
    gh = ctx.github(repo)
    branch = gh.default_branch()
    sha = flow.branch_head(ctx.workbench, repo, branch, gh.clone_token())
    with flow.checkout(ctx.workbench, repo, sha, gh.clone_token()) as root:
        config = load(root)
    found: list[str] = []
    for project in config.projects:
        if project.drift is None:
            continue
        window = window_start(at, project.drift.every)
        jid = check_id(repo, project.name, window)
        if ctx.redis.set(f"kilolock:drift-due:{jid}", 1, nx=True, ex=project.drift.every + TICK_SECONDS):
            queue.enqueue(ctx.redis, DriftCheckArgs(repo, project.name, window, sha, branch), job_id=jid,
                          timeout=ctx.settings.job_timeout)
            found.append(jid)
    return found


def check(ctx: Context, args: DriftCheckArgs) -> str:
    """The drift check of one project for one window (at most once: see the module docstring)."""
    row, mine = store.claim_window(ctx.db, ctx.id, args, stale_seconds=ctx.settings.job_timeout + 60)
    if not mine:
        if row.is_finished:
            deliver(ctx, row)
            return "delivered"
        log.info("drift check %s is running on another worker", ctx.id)
        return "running elsewhere"
    try:
        status, outcome = _run(ctx, args.repo, args.project, args.window, args.sha, args.branch)
    except Exception:
        store.reset_job(ctx.db, ctx.id)  # unclaimed again: RQ's retry of this job may run it
        raise
    store.finish_job(ctx.db, ctx.id, status, DriftResult(drift=outcome).to_json())
    fresh = store.get_job(ctx.db, ctx.id)
    assert fresh is not None
    deliver(ctx, fresh)
    return status.value


def _run(ctx: Context, repo: str, name: str, window: int, sha: str,
         branch: str) -> tuple[JobStatus, DriftOutcome]:
    outcome = DriftOutcome(name, sha, branch, window)
    gh = ctx.github(repo)
    try:
        with flow.checkout(ctx.workbench, repo, sha, gh.clone_token()) as root:
            try:
                config = load(root)
            except BotConfigError as exc:
                return JobStatus.FAILED, replace(outcome, error=ctx.workbench.redact(str(exc)))
            project = config.project(name)
            if project is None or project.drift is None:
                return JobStatus.SKIPPED, replace(
                    outcome, skipped=f"project {name!r} has no drift schedule on {branch} now")
            outcome = replace(outcome, target=DriftTarget(project.state, project.shown_dir, project.drift.every,
                                                          project.drift.issue))
            request = DriftRequest(state=project.state, config_dir=root / project.dir,
                                   actor=f"github:{repo}@{sha[:12]}/{name}:drift", data_dir=ctx.workbench.data_dir,
                                   lease_seconds=flow.LEASE_SECONDS)
            result = drift(flow.engine_client(ctx.workbench, repo, root, project),
                           flow.terraform_context(ctx.workbench, project), request)
    except (KlExit, EngineError, ClientConfigError, git.GitError) as exc:
        return JobStatus.FAILED, replace(outcome, error=ctx.workbench.redact(safe_error(str(exc))))
    return JobStatus.SUCCEEDED, replace(outcome, serial=result.serial, checked=result.checked,
                                        run_id=result.run_id, drifted=result.drifted)


def safe_error(text: str) -> str:
    """What a failure may show: Terraform's diagnostics can quote configuration source (and so literal
    values), so of a Terraform failure only its first line and the ``Error:`` summaries are kept."""
    lines = text.strip().splitlines()
    if not lines or not lines[0].startswith("terraform "):
        return text.strip()[-2000:]
    kept = [lines[0]] + [line.strip() for line in lines[1:] if line.strip().startswith("Error:")]
    return "\n".join(kept)[-2000:]


def deliver(ctx: Context, row: BotJob) -> None:
    """Post a stored drift outcome once: under a lock, re-read, and skipped when already posted. Raises
    GitHubError when GitHub fails (RQ retries the job; the retry posts the stored outcome)."""
    with ctx.redis.lock(f"kilolock:deliver:{row.id}", timeout=300, blocking_timeout=300):
        fresh = store.get_job(ctx.db, row.id) or row
        if fresh.posted:
            return
        outcome = DriftResult.from_json(fresh.result).drift
        if fresh.status is JobStatus.SKIPPED or outcome is None:
            log.info("drift check %s: %s", fresh.id, (outcome and outcome.skipped) or fresh.result)
            store.mark_posted(ctx.db, fresh.id)
            return
        gh = ctx.github(fresh.repo)
        shown = drifttext.check_output(outcome)
        gh.set_check(outcome.sha, DRIFT_CHECK, status="completed", conclusion=shown.conclusion, title=shown.title,
                     summary=shown.summary, text=shown.text, external_id=fresh.id)
        if outcome.keeps_issue and not outcome.error:
            earlier = store.last_result(ctx.db, fresh.repo, JobKind.DRIFT_CHECK, fresh.project, "issue_number")
            number = gh.sync_issue(drifttext.issue_marker(fresh.project), drifttext.issue_title(outcome),
                                   drifttext.issue_body(outcome), open_=bool(outcome.drifted),
                                   number=int(earlier["issue_number"]) if earlier else None)
            if number is not None:
                store.merge_result(ctx.db, fresh.id, {"issue_number": number})
        store.mark_posted(ctx.db, fresh.id)
