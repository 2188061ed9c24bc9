"""The pull-request jobs, each a run (compute, return a typed result for the job to store) and a deliver
(post a stored result): the footprint of a head, its plan preview, a close, a comment command and a review.

Owns what those jobs decide; ``runner.bot.jobs`` claims each job's row, stores the result, and only then
calls the deliver. Must not: store outcomes itself, or post anything that is not stored.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from app.domain import commands
from app.domain.commands import CommandName
from app.domain.jobs import ClosedArgs, CommentArgs, JobKind, PreviewArgs, PullRequestArgs, ReviewArgs, job_id
from app.store import bot as store
from app.store.bot import BotJob, JobStatus, PrFootprint
from runner.bot import flow, manual_holds, owners, pr_holds, render, requirements, view
from runner.bot import trust as trust_rules
from runner.bot.config import BotConfig
from runner.bot.context import APPLY_CHECK, FOOTPRINT_CHECK, PLAN_CHECK, Context, complete, progress, refresh
from runner.bot.github import GitHub, PullInfo, Review
from runner.bot.outcomes import FootprintOutcome, PreviewOutcome, ProjectFootprint, ProjectPreview
from runner.bot.owners import groups_of, missing_groups, owned_globs
from runner.bot.results import ClosedResult, CommentResult, FootprintResult, JobResult, PreviewResult, ReviewResult
from runner.core import git

log = logging.getLogger("kilolock.jobs")
Outcome = tuple[JobStatus, JobResult]


def _head(ctx: Context, args: PullRequestArgs, check: str, title: str) -> tuple[GitHub, PullInfo, str | None]:
    """The pull request, and why the delivery came late (it is closed, or its head moved on); when it is
    not late, ``check`` shows the job started."""
    gh = ctx.github(args.repo)
    pr = gh.pull_request(args.number)
    sha = args.head_sha
    if pr.state != "open":
        return gh, pr, f"pull request #{pr.number} is {pr.state}: the delivery for {sha[:12]} came late"
    if pr.head_sha != sha:
        return gh, pr, f"late delivery: the head of #{pr.number} moved from {sha[:12]} to {pr.head_sha[:12]}"
    progress(gh, sha, check, ctx.id, title)
    return gh, pr, None


# --- the footprint of a head -------------------------------------------------------------------------


def footprint(ctx: Context, args: PullRequestArgs) -> Outcome:
    """PR opened, reopened or synchronized: predict its reservations, record them."""
    repo, number, head_sha = args.repo, args.number, args.head_sha
    gh, pr, late = _head(ctx, args, FOOTPRINT_CHECK, "Predicting the reservations of the changed files")
    if late:
        return JobStatus.SKIPPED, FootprintResult(skipped=late)
    outcome = _footprint_outcome(ctx, gh, repo, pr)
    before = view.overlapping(ctx.db, repo, number, view.states_of(ctx.db, repo, number))
    store.drop_footprints(ctx.db, repo, number)
    for project in outcome.projects:
        if not project.error:
            store.save_footprint(ctx.db, PrFootprint(repo, number, project.name, project.state, head_sha,
                                                     project.files, project.write_globs, project.read_globs))
    after = view.overlapping(ctx.db, repo, number, {p.state for p in outcome.projects})
    status = JobStatus.FAILED if outcome.failed else JobStatus.SUCCEEDED
    return status, FootprintResult(footprint=outcome, notify=tuple(sorted(before | after)))


def _footprint_outcome(ctx: Context, gh: GitHub, repo: str, pr: PullInfo) -> FootprintOutcome:
    token = gh.clone_token()
    with flow.checkout(ctx.workbench, repo, pr.head_sha, token, want=(pr.base_sha,)) as root:
        config, errors = flow.read_config(root)
        base = git.merge_base(root, pr.base_sha, pr.head_sha)
        if config is None:
            return FootprintOutcome(pr.head_sha, base, config_errors=errors, config_source=flow.config_source(root))
        _, trusted, _ = flow.default_config(ctx.workbench, repo, root, gh.default_branch(), token)
        projects = flow.footprint(ctx.workbench, repo, root, config, base, pr.head_sha, trusted=trusted)
        if trusted is not None:
            projects = _with_owners(gh, trusted, pr, projects)
        return FootprintOutcome(pr.head_sha, base, projects, config_source=config.source)


def _with_owners(gh: GitHub, trusted: BotConfig, pr: PullInfo,
                 projects: tuple[ProjectFootprint, ...]) -> tuple[ProjectFootprint, ...]:
    """Each project's write globs with their owners (the default branch's ``owners:``), and the groups whose
    approval of the head is missing (reviews and team memberships read now)."""
    found: list[ProjectFootprint] = []
    reviews: list[Review] | None = None
    for shown in projects:
        project = trusted.project(shown.name)
        owned = owned_globs(project.owners, shown.write_globs) if project is not None else ()
        if not any(o.groups for o in owned):
            found.append(shown)
            continue
        if reviews is None:
            reviews = gh.reviews(pr.number)
        writers = frozenset(login for login in {r.login for r in reviews} if gh.has_write_access(login))
        approvers = requirements.head_approvers(reviews, author=pr.author, head_sha=pr.head_sha, writers=writers)
        missing = missing_groups(groups_of(owned), approvers, lambda login, owner: owner.team is not None and
                                 gh.is_team_member(owner.login, owner.team, login))
        found.append(replace(shown, owners=tuple((o.glob, "; ".join(owners.shown(g) for g in o.groups))
                                                 for o in owned),
                             owners_missing=tuple(owners.shown(g) for g in missing)))
    return tuple(found)


def deliver_footprint(ctx: Context, row: BotJob, result: JobResult) -> None:
    assert isinstance(result, FootprintResult) and result.footprint is not None
    repo, number, outcome = row.repo, row.number or 0, result.footprint
    gh = ctx.github(repo)
    refresh(ctx, gh, repo, number)  # the comment first: it is what people wait for
    complete(gh, row.sha, FOOTPRINT_CHECK, render.footprint_check(outcome, view.overlaps_of(ctx.db, repo, number,
                                                                                            outcome)), row.id)
    for other in result.notify:
        if other != number:
            refresh(ctx, gh, repo, other)
    pr_holds.mark_stale(gh, ctx.db, repo, number, row.sha)
    pr_holds.maybe_reconcile(ctx, repo)
    if outcome.projects and any(not p.error for p in outcome.projects):
        ctx.enqueue(PreviewArgs(repo, number, row.sha), job_id(JobKind.PLAN_PREVIEW, repo, number, row.sha))


# --- the plan preview --------------------------------------------------------------------------------


def preview(ctx: Context, args: PreviewArgs) -> Outcome:
    """The file-scoped plan of each project the PR touches. Untrusted code (``runner.bot.trust``) is not
    planned unless the operator enabled it, and then with the default branch's projects and no credential."""
    repo, head_sha = args.repo, args.head_sha
    gh, pr, late = _head(ctx, args, PLAN_CHECK, "Planning the changed files")
    if late:
        return JobStatus.SKIPPED, PreviewResult(skipped=late)
    trust = trust_rules.of_pull_request(gh, repo, pr)
    workbench = ctx.workbench
    token = gh.clone_token()
    with flow.checkout(ctx.workbench, repo, head_sha, token, want=(pr.base_sha,), refresh=not trust.trusted) as root:
        config, errors = flow.read_config(root)
        branch = gh.default_branch()
        _, trusted, trusted_errors = flow.default_config(ctx.workbench, repo, root, branch, token)
        if not trust.trusted:
            config, errors = trusted, trusted_errors
            if not trust_rules.previews_enabled(ctx.settings, repo, config):
                withheld = trust_rules.preview_withheld(trust, branch)
                log.info("preview of %s#%s withheld: %s", repo, pr.number, trust.reason)
                return JobStatus.SUCCEEDED, PreviewResult(preview=PreviewOutcome(head_sha, withheld=withheld))
            workbench = ctx.workbench.without_credentials()
        projects: tuple[ProjectPreview, ...] = ()
        if config is not None:
            base = git.merge_base(root, pr.base_sha, head_sha)
            projects = flow.preview(workbench, repo, root, config, base, head_sha, trusted=trusted)
    outcome = PreviewOutcome(head_sha, projects, errors)
    return (JobStatus.FAILED if outcome.failed else JobStatus.SUCCEEDED), PreviewResult(preview=outcome)


def deliver_preview(ctx: Context, row: BotJob, result: JobResult) -> None:
    assert isinstance(result, PreviewResult) and result.preview is not None
    gh = ctx.github(row.repo)
    complete(gh, row.sha, PLAN_CHECK, render.plan_check(result.preview), row.id)
    refresh(ctx, gh, row.repo, row.number or 0)


# --- a close without merging -------------------------------------------------------------------------


def closed(ctx: Context, args: ClosedArgs) -> Outcome:
    """PR closed without merging: forget its footprint and release its holds — once GitHub confirms it is
    closed (a replayed old delivery of a pull request that is open again changes nothing)."""
    repo, number = args.repo, args.number
    pr = ctx.github(repo).pull_request(number)
    if pr.state == "open":
        return JobStatus.SKIPPED, ClosedResult(skipped=f"#{number} is open on GitHub: the close delivery is stale")
    notify = view.overlapping(ctx.db, repo, number, view.states_of(ctx.db, repo, number))
    released, applied_before, neighbours = pr_holds.released_on_close(ctx, repo, number)
    store.drop_footprints(ctx.db, repo, number)
    return JobStatus.SUCCEEDED, ClosedResult(notify=tuple(sorted(notify | set(neighbours))), released=released,
                                             applied_before=applied_before)


def deliver_closed(ctx: Context, row: BotJob, result: JobResult) -> None:
    assert isinstance(result, ClosedResult)
    gh = ctx.github(row.repo)
    if result.released or result.applied_before:
        refresh(ctx, gh, row.repo, row.number or 0)
    for other in result.notify:
        refresh(ctx, gh, row.repo, other)


# --- comment commands --------------------------------------------------------------------------------


def comment(ctx: Context, args: CommentArgs) -> Outcome:
    """A ``kilolock …`` comment from someone with write access; anything else a polite reply."""
    repo, number, login = args.repo, args.number, args.login
    gh = ctx.github(repo)
    command = commands.parse(args.body) or commands.Command(CommandName.HELP.value, CommandName.HELP)
    if login == gh.login:
        return JobStatus.SKIPPED, CommentResult(skipped="a comment by the bot itself")
    if not gh.has_write_access(login):
        reply = (f"@{login} only people with write access to {repo} can run Kilolock commands; ask a "
                 f"maintainer to comment `kilolock {command.word}` if it is needed.")
    elif command.name is CommandName.PLAN:
        reply = _replan(ctx, gh, repo, number, login)
    elif command.name is CommandName.APPLY:
        return JobStatus.SUCCEEDED, pr_holds.comment_apply(ctx, gh, repo, number, login, command.apply)
    elif command.name is CommandName.UNLOCK:
        return JobStatus.SUCCEEDED, pr_holds.comment_unlock(ctx, repo, number, login)
    elif command.name is CommandName.HOLD:
        return JobStatus.SUCCEEDED, manual_holds.comment_hold(ctx, gh, repo, number, login, command.hold)
    elif command.name is CommandName.RELEASE:
        return JobStatus.SUCCEEDED, manual_holds.comment_release(ctx, repo, number, login, command.hold)
    elif command.name is CommandName.HELP:
        reply = commands.HELP
    else:
        reply = f"@{login} sorry, `kilolock {command.word}` is not a command I know.\n\n{commands.HELP}"
    return JobStatus.SUCCEEDED, CommentResult(reply=reply, command=command.word)


def _replan(ctx: Context, gh: GitHub, repo: str, number: int, login: str) -> str:
    pr = gh.pull_request(number)
    if pr.state != "open":
        return f"@{login} #{number} is {pr.state}: there is nothing to preview."
    preview_id = job_id(JobKind.PLAN_PREVIEW, repo, number, pr.head_sha)
    store.reset_job(ctx.db, preview_id)
    ctx.enqueue(PreviewArgs(repo, number, pr.head_sha), preview_id)
    return (f"@{login} re-running the plan preview for {pr.head_sha[:7]}; the Kilolock comment on this pull "
            "request will show it.")


def deliver_comment(ctx: Context, row: BotJob, result: JobResult) -> None:
    assert isinstance(result, CommentResult)
    number = row.number or 0
    gh = ctx.github(row.repo)
    others = list(result.notify)
    if result.pr_apply is not None:
        others += pr_holds.deliver_apply(gh, result.pr_apply, row.id)
    gh.reply(number, result.reply)
    if result.command in (CommandName.APPLY, CommandName.UNLOCK):
        for other in [number, *sorted(set(others) - {number})]:
            refresh(ctx, gh, row.repo, other)
    pr_holds.maybe_reconcile(ctx, row.repo)


# --- reviews -------------------------------------------------------------------------------------------


def review(ctx: Context, args: ReviewArgs) -> Outcome:
    """A review was submitted or dismissed: whether a comment apply may run on the head now."""
    return pr_holds.review_readiness(ctx, ctx.github(args.repo), args.repo, args.number, args.head_sha)


def deliver_review(ctx: Context, row: BotJob, result: JobResult) -> None:
    assert isinstance(result, ReviewResult) and result.ready_check is not None
    ready = result.ready_check
    ctx.github(row.repo).set_check(ready.sha, APPLY_CHECK, status="queued", title=ready.title,
                                   summary=ready.summary, external_id=row.id)
