"""The merge and push jobs: the fan-out ``merge`` (a merged pull request) and ``push`` (a push to the
default branch) find the projects a change touches and enqueue one ``apply_project`` each; an
``apply_project`` applies one project file-scoped, after every earlier overlapping merge.

A project's apply first waits for every earlier merge (its commit an ancestor of ours) whose footprint
overlaps it and that has not finished, so overlapping merges apply in merge order while disjoint ones run
in parallel on different workers; then Terraform runs with the rest of ``merge_wait`` as the reservation
wait. A job timeout (RQ's ``JobTimeoutException``) stops Terraform with SIGINT and a grace period
(``runner.core.terraform.run``), closes the job's apply runs so their reservations end now, and reports the
failure. Each job is a run (returning a typed result for ``runner.bot.jobs`` to store) and a deliver.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from rq import Queue, get_current_job
from rq.job import Job
from rq.job import JobStatus as RqStatus
from rq.registry import DeferredJobRegistry, ScheduledJobRegistry, StartedJobRegistry
from rq.timeouts import JobTimeoutException

from app import queue
from app.domain.jobs import ApplyProjectArgs, JobArgs, JobKind, MergeArgs, PushArgs, args_from_json, job_id
from app.domain.overlaps import shared_globs
from app.domain.principal import Principal
from app.store import bot as store
from app.store import events
from app.store.bot import BotJob, JobStatus, PrFootprint
from runner.bot import flow, pr_holds, render, view
from runner.bot.config import CONFIG_NAMES, BotConfig, Project
from runner.bot.context import APPLY_CHECK, FOOTPRINT_CHECK, Context, complete, refresh
from runner.bot.github import GitHub, PullInfo
from runner.bot.outcomes import ApplyResult, ApplyStatus, FootprintOutcome
from runner.bot.results import ApplyProjectResult, FanOutResult, JobResult, result_of
from runner.core import git
from runner.core.errors import Failed, ReservationRefused
from runner.core.scope import ScopedFootprint

log = logging.getLogger("kilolock.jobs")
ZERO_SHA = "0" * 40
POLL_SECONDS = 1.0
Outcome = tuple[JobStatus, JobResult]
_KIND_OF = {path: kind for kind, path in queue.JOBS.items()}
_DONE = frozenset({RqStatus.FINISHED, RqStatus.FAILED, RqStatus.CANCELED, RqStatus.STOPPED})


# --- the fan-out ------------------------------------------------------------------------------------


def merge(ctx: Context, args: MergeArgs) -> Outcome:
    """A merged PR: find the projects the change touches and enqueue one apply job each."""
    repo, number, merge_sha = args.repo, args.number, args.merge_sha
    notify = tuple(sorted(view.overlapping(ctx.db, repo, number, view.states_of(ctx.db, repo, number))))
    store.drop_footprints(ctx.db, repo, number)
    gh = ctx.github(repo)
    pr = gh.pull_request(number)
    applied = pr_holds.holds_heads(ctx.db, repo, number)
    with flow.checkout(ctx.workbench, repo, merge_sha, gh.clone_token(),
                       also=(pr.base_sha, pr.head_sha, *applied)) as root:
        config, errors = flow.read_config(root)
        if config is None:
            pr_holds.release_all(ctx.db, repo, number, f"#{number} was merged")
            return JobStatus.FAILED, FanOutResult(config_errors=errors, notify=notify)
        base = flow.merge_diff_base(root, merge_sha, pr.base_sha, pr.head_sha)
        touched = flow.changed_for(config, root, base, merge_sha)
        elsewhere = _other_branch(ctx, gh, repo, root, config, pr.base_ref)
        if elsewhere is not None:
            pr_holds.release_all(ctx.db, repo, number, f"#{number} was merged into {pr.base_ref}")
            not_applied = tuple(ApplyResult(name, (config.project(name) or pr_holds.NO_PROJECT).state, merge_sha,
                                            ApplyStatus.OTHER_BRANCH, error=elsewhere) for name in touched)
            return JobStatus.SUCCEEDED, FanOutResult(base=base, not_applied=not_applied, notify=notify)
        # The pull request's holds end here; what it applied before merge is not applied twice.
        touched, before = pr_holds.settle_merge(ctx, root, config, repo, number, merge_sha, touched)
    children, skipped = _fan_out(ctx, config, repo, number, merge_sha, base, touched, config.apply_on_merge,
                                 "apply on merge is off in .kilolock.yml")
    return JobStatus.SUCCEEDED, FanOutResult(base=base, children=children, not_applied=skipped + before,
                                             notify=notify)


def _other_branch(ctx: Context, gh: GitHub, repo: str, root: Path, config: BotConfig, base_ref: str) -> str | None:
    """None when merges into ``base_ref`` apply (it is the configured branch: ``apply_branch`` in the default
    branch's ``.kilolock.yml``, else the default branch); otherwise why this merge is not applied. A merge
    into the default branch reads that setting from the merge commit, which is the default branch now."""
    branch = gh.default_branch()
    trusted: BotConfig | None = config  # an invalid default-branch file: the default branch applies
    if base_ref != branch:
        _, trusted, _ = flow.default_config(ctx.workbench, repo, root, branch, gh.clone_token())
    target = pr_holds.apply_branch(trusted, branch)
    if base_ref == target:
        return None
    log.info("merge into %s on %s is not applied: the applied branch is %s", base_ref, repo, target)
    return (f"merged into {base_ref}; Kilolock applies only merges into {target} (apply_branch in .kilolock.yml "
            f"on {branch})")



def push(ctx: Context, args: PushArgs) -> Outcome:
    """A push to the default branch that is not a merged PR: analyze it, and apply it when
    ``apply_on_push`` says so."""
    repo, after, before = args.repo, args.after, args.before
    if before == ZERO_SHA or after == ZERO_SHA:
        return JobStatus.SKIPPED, FanOutResult(skipped="the push created or deleted the branch", before=before)
    gh = ctx.github(repo)
    merged = view.merged_by_job(ctx.db, repo, after)
    if merged is not None:
        return JobStatus.SKIPPED, FanOutResult(skipped=f"the merge of #{merged}: its merge job applies it",
                                               before=before)
    with flow.checkout(ctx.workbench, repo, after, gh.clone_token(), want=(before,), refresh=True) as root:
        branch = gh.default_branch()
        if not git.is_ancestor(root, after, f"refs/heads/{branch}"):
            return JobStatus.SKIPPED, FanOutResult(skipped=f"{after[:12]} is not on {branch}", before=before)
        number = _merged_pull_request(git.commit_subject(root, after))
        if number is not None:
            return JobStatus.SKIPPED, FanOutResult(skipped=f"the merge of #{number}: its merge job applies it",
                                                   before=before)
        config, errors = flow.read_config(root)
        if config is None:
            outcome = FootprintOutcome(after, before, config_errors=errors, config_source=flow.config_source(root))
            return JobStatus.FAILED, FanOutResult(footprint=outcome, before=before)
        found = flow.footprint(ctx.workbench, repo, root, config, before, after, trusted=config)  # the default branch
        outcome = FootprintOutcome(after, before, found, config_source=config.source)
        touched = {p.name: p.changed for p in outcome.projects}
    children, skipped = _fan_out(ctx, config, repo, 0, after, before, touched, config.apply_on_push,
                                 "apply_on_push is off in .kilolock.yml (pushes are analyzed only)")
    return (JobStatus.FAILED if outcome.failed else JobStatus.SUCCEEDED,
            FanOutResult(footprint=outcome, before=before, base=before, children=children, not_applied=skipped))


def _fan_out(ctx: Context, config: BotConfig, repo: str, number: int, sha: str, base: str,
             touched: dict[str, tuple[str, ...]], enabled: bool,
             why_off: str) -> tuple[tuple[str, ...], tuple[ApplyResult, ...]]:
    children: list[str] = []
    skipped: list[ApplyResult] = []
    for name in touched:
        project = config.project(name)
        assert project is not None
        if not enabled or not project.apply_on_merge:
            reason = why_off if not enabled else f"apply_on_merge is off for project {name}"
            skipped.append(ApplyResult(name, project.state, sha, ApplyStatus.SKIPPED, error=reason))
            continue
        ctx.enqueue(ApplyProjectArgs(repo, number, sha, name, base),
                    job_id(JobKind.APPLY_PROJECT, repo, number, sha, name))
        children.append(name)
    return tuple(children), tuple(skipped)


def _merged_pull_request(subject: str) -> int | None:
    """GitHub's own subjects for a merge commit (``Merge pull request #12 from …``) and a squash merge
    (``Title (#12)``)."""
    found = re.match(r"Merge pull request #(\d+) ", subject) or re.search(r"\(#(\d+)\)$", subject.strip())
    return int(found.group(1)) if found else None


# --- one project's apply ------------------------------------------------------------------------------


def apply_project(ctx: Context, args: ApplyProjectArgs) -> Outcome:
    """Apply one project of a merge or push on its commit, after every earlier overlapping merge."""
    repo, number, sha, name = args.repo, args.number, args.sha, args.project
    gh = ctx.github(repo)
    actor = f"github:{repo}#{number}@{sha[:12]}/{name}" if number else f"github:{repo}@{sha[:12]}/{name}"
    with flow.checkout(ctx.workbench, repo, sha, gh.clone_token(), want=(args.base,)) as root:
        config, errors = flow.read_config(root)
        project = config.project(name) if config is not None else None
        if config is None or project is None:
            why = "; ".join(errors) or f"project {name!r} is no longer in .kilolock.yml"
            result = ApplyResult(name, "", sha, ApplyStatus.FAILED, error=why, hint="fix .kilolock.yml and re-run the "
                                 "kilolock/apply check")
            return JobStatus.FAILED, ApplyProjectResult(apply=result)
        deadline = time.monotonic() + config.merge_wait
        state = project.state
        pr = gh.pull_request(number) if number else None
        gate = _owners_gate(ctx, gh, root, args, config, project, pr)

        def before_apply(scoped: ScopedFootprint) -> float:
            if gate is not None:
                gate(scoped)
            return _wait_for_earlier_merges(root, repo, sha, state, scoped, deadline)

        author = pr.author if pr is not None else None  # blame names it beside its merge commit
        _audit_apply(ctx, "pr_apply_started", args, state, actor)
        try:
            result = flow.apply_project(ctx.workbench, repo, root, project, args.base, sha, actor=actor,
                                        wait_seconds=config.merge_wait, before_apply=before_apply,
                                        origin={"repository": repo, "pull_request": number or None,
                                                "merge_commit": sha, "author": author})
            if gate is not None and result.failed and (result.error or "").startswith("owners_approved: "):
                result = replace(result, hint="ask a member of each owner group named above to approve the pull "
                                              "request, then re-run the kilolock/apply check; nothing was reserved "
                                              "or committed")
        except JobTimeoutException:
            ended = flow.end_live_runs(ctx.workbench, repo, root, project, actor, "the bot job timed out")
            result = ApplyResult(name, project.state, sha, ApplyStatus.FAILED, run_id=ended[0] if ended else None,
                                 error=f"the apply job timed out after {ctx.settings.job_timeout} s; Terraform "
                                       "was interrupted and nothing was committed",
                                 hint="raise KL_JOB_TIMEOUT or make the change smaller, then re-run the "
                                      "kilolock/apply check")
        _audit_apply(ctx, "pr_apply_finished", args, state, actor, status="failed" if result.failed else "applied",
                     run_id=result.run_id)
    return (JobStatus.FAILED if result.failed else JobStatus.SUCCEEDED), ApplyProjectResult(apply=result)


def _owners_gate(ctx: Context, gh: GitHub, root: Path, args: ApplyProjectArgs, config: BotConfig,
                 project: Project, pr: PullInfo | None) -> Callable[[ScopedFootprint], None] | None:
    """``owners_approved`` for a merge (or push) apply, as the branch was before it: the requirement and the
    owners come from ``.kilolock.yml`` at the change's base, so a pull request cannot drop its own owners
    (the merge commit's file when the base's is invalid). Checked on the exact footprint, before anything is
    reserved; raises ``Failed`` naming the groups that did not approve the pull request's last head. The base
    is checked out only when its file may ask for owners: when the change touches the file, or when the
    change's own (then the same text) does."""
    if not _base_may_need_owners(root, args, config):
        return None
    with flow.checkout(ctx.workbench, args.repo, args.base, gh.clone_token()) as base_root:
        before, _ = flow.read_config(base_root)
    trusted = before or config
    owners_project = trusted.project(project.name) or project
    if "owners_approved" not in trusted.apply_requirements or not owners_project.owners:
        return None

    def check(scoped: ScopedFootprint) -> None:
        problem = pr_holds.exact_owners_problem(gh, owners_project, pr, scoped.write_globs)
        if problem:
            raise Failed(f"owners_approved: {problem}")

    return check


def _base_may_need_owners(root: Path, args: ApplyProjectArgs, config: BotConfig) -> bool:
    if any(path in CONFIG_NAMES for path in git.changed_paths(root, args.sha, args.base)):
        return True
    return "owners_approved" in config.apply_requirements and any(p.owners for p in config.projects)


def _audit_apply(ctx: Context, kind: str, args: ApplyProjectArgs, state: str, actor: str, **more: Any) -> None:
    """The audit record (and so the outgoing event) of a pull request's apply starting or ending."""
    events.record_alone(ctx.db, Principal(tenant_id=0, actor=actor), kind, state_name=state, repo=args.repo,
                        number=args.number, project=args.project, sha=args.sha, **more)


def crash_result(args: ApplyProjectArgs, error: str) -> ApplyProjectResult:
    """What an apply job that kept crashing stores: a failed apply, reported in the merge's check with
    the others."""
    return ApplyProjectResult(apply=ApplyResult(
        args.project, "", args.sha, ApplyStatus.FAILED, error=error,
        hint="re-run the kilolock/apply check once the cause is fixed"))


def _wait_for_earlier_merges(root: Path, repo: str, sha: str, state: str, scoped: ScopedFootprint,
                             deadline: float) -> float:
    """Block while an unfinished apply job of an earlier merge (an ancestor of ``sha``) may overlap ours;
    return the seconds left until ``deadline``. Our footprint goes into the RQ job's meta for later merges
    to read; an earlier job that has not published its own yet counts as overlapping."""
    current = get_current_job()
    if current is None:
        return max(deadline - time.monotonic(), 0.0)
    current.meta["kilolock"] = {"repo": repo, "sha": sha, "state": state, "write_globs": list(scoped.write_globs),
                                "read_globs": list(scoped.read_globs)}
    current.save_meta()
    mine = PrFootprint(repo, 0, "", state, sha, (), scoped.write_globs, scoped.read_globs)
    while True:
        blocking = [j for j in _pending_merge_jobs(current) if _blocks(root, repo, sha, mine, j)]
        if not blocking:
            return max(deadline - time.monotonic(), 0.0)
        if time.monotonic() >= deadline:
            raise ReservationRefused("an earlier merge that overlaps this one has not finished applying (job "
                            f"{blocking[0][0].id}); applying now could undo it")
        log.info("apply of %s waits for earlier merge job(s): %s", sha[:12], ", ".join(j.id for j, _ in blocking))
        time.sleep(POLL_SECONDS)


def _pending_merge_jobs(current: Job) -> list[tuple[Job, JobArgs]]:
    """The unfinished merge, push and apply jobs on the queue, with their typed arguments."""
    ids: set[str] = set()
    q = Queue(current.origin, connection=current.connection, serializer=current.serializer)
    ids.update(q.get_job_ids())
    for registry in (StartedJobRegistry(queue=q), ScheduledJobRegistry(queue=q), DeferredJobRegistry(queue=q)):
        ids.update(registry.get_job_ids())
    ids.discard(current.id)
    found = Job.fetch_many(sorted(ids), connection=current.connection, serializer=current.serializer)
    wanted = (JobKind.MERGE, JobKind.PUSH, JobKind.APPLY_PROJECT)
    pending: list[tuple[Job, JobArgs]] = []
    for job in found:
        kind = _KIND_OF.get(job.func_name or "") if job is not None else None
        if job is None or kind not in wanted or job.get_status() in _DONE:
            continue
        assert kind is not None
        args = args_from_json(kind, job.kwargs)
        if args is not None:
            pending.append((job, args))
    return pending


def _commit_of(args: JobArgs) -> str:
    if isinstance(args, MergeArgs):
        return args.merge_sha
    if isinstance(args, PushArgs):
        return args.after
    assert isinstance(args, ApplyProjectArgs)
    return args.sha


def _blocks(root: Path, repo: str, sha: str, mine: PrFootprint, other: tuple[Job, JobArgs]) -> bool:
    job, args = other
    if args.subject().repo != repo:
        return False
    other_sha = _commit_of(args)
    if other_sha == sha:
        return False
    try:
        if not git.is_ancestor(root, other_sha, sha):
            return False
    except git.GitError:
        return False  # not in our history (another branch, or not fetched): not an earlier merge of ours
    published: dict[str, Any] | None = job.meta.get("kilolock")
    if not published:
        return True  # a fan-out, or an apply that has not computed its footprint yet
    theirs = PrFootprint(repo, 1, "", str(published["state"]), other_sha, (), tuple(published["write_globs"]),
                         tuple(published["read_globs"]))
    return bool(shared_globs(mine, theirs))


# --- delivering -----------------------------------------------------------------------------------------


def deliver_merge(ctx: Context, row: BotJob, result: JobResult) -> None:
    """The merge's apply check, and the pull request's comment (and those it overlapped)."""
    assert isinstance(result, FanOutResult)
    gh = ctx.github(row.repo)
    report_apply(ctx, gh, row)
    _refresh_pull_request(ctx, gh, row, result)


def deliver_push(ctx: Context, row: BotJob, result: JobResult) -> None:
    assert isinstance(result, FanOutResult)
    gh = ctx.github(row.repo)
    if result.footprint is not None:
        complete(gh, row.sha, FOOTPRINT_CHECK, render.footprint_check(result.footprint, {}), row.id)
    if result.children or result.not_applied:
        report_apply(ctx, gh, row)


def deliver_apply(ctx: Context, row: BotJob, result: JobResult) -> None:
    """One project finished: the merge's (or push's) apply check again, and the pull request's comment."""
    assert isinstance(row.args, ApplyProjectArgs)
    gh = ctx.github(row.repo)
    parent = store.get_job(ctx.db, row.args.parent_id())
    if parent is not None:
        report_apply(ctx, gh, parent)
    _refresh_pull_request(ctx, gh, row, result)


def _refresh_pull_request(ctx: Context, gh: GitHub, row: BotJob, result: JobResult) -> None:
    """A merge's comment (a push has no pull request), and those of the pull requests it overlapped."""
    if row.number:
        refresh(ctx, gh, row.repo, row.number)
        for other in result.notify:
            refresh(ctx, gh, row.repo, other)


def report_apply(ctx: Context, gh: GitHub, parent: BotJob) -> None:
    """The ``kilolock/apply`` check of a merge or push: all its projects, in progress until each is done.
    Under a lock, and read inside it: a later report always sees at least what an earlier one saw."""
    with ctx.redis.lock(f"kilolock:apply-check:{parent.id}", timeout=300, blocking_timeout=300):
        fresh = store.get_job(ctx.db, parent.id) or parent
        _report_apply_locked(ctx, gh, fresh)


def _report_apply_locked(ctx: Context, gh: GitHub, parent: BotJob) -> None:
    fan = result_of(parent)
    if isinstance(fan, FanOutResult) and fan.config_errors:
        complete(gh, parent.sha, APPLY_CHECK, render.CheckOutput(
            "failure", ".kilolock.yml is invalid: nothing was applied",
            "\n".join(f"- {e}" for e in fan.config_errors)), parent.id)
        return
    results, pending = view.apply_results(ctx.db, parent)
    if pending:
        gh.set_check(parent.sha, APPLY_CHECK, status="in_progress", title=f"applying {', '.join(pending)}",
                     summary=f"Waiting for reservations or applying: {', '.join(pending)}", external_id=parent.id)
        return
    if results:
        complete(gh, parent.sha, APPLY_CHECK, render.apply_check(results), parent.id)
