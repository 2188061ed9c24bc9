"""RQ entry points of the GitHub bot (``app.queue.JOBS`` names them by dotted path).

Every job is thin and idempotent. Its arguments are str/int only. It opens its database connection
inside the job (after RQ forked), **claims** its row in ``bot_jobs`` (the id is the RQ job id, which
``app.domain.webhooks.job_id`` derives from kind, repository, PR and SHA), and when that row already
holds an outcome it re-posts it instead of recomputing — so a redelivery, or an RQ retry after GitHub
failed, never runs Terraform twice for one job (a job whose worker died before storing anything runs again:
an apply that did commit then plans no changes). Otherwise it computes (``runner.botflow``), **stores the outcome**
(``finish_job``) and only then posts it to GitHub (``runner.comments`` renders it); when GitHub is down or
rate-limits us the job raises, RQ retries it, and the retry posts the stored outcome. The one comment per
pull request is always rendered from stored outcomes, under a Redis lock per PR, so jobs of two PRs that
overlap can both refresh both comments without racing.

Merge applies run one job per project. A project's apply first waits for every earlier merge (its merge
commit an ancestor of ours) whose footprint overlaps it and that has not finished, so overlapping merges
apply in merge order while disjoint ones run in parallel on different workers; then Terraform runs with
the rest of ``merge_wait`` as the reservation wait. A job timeout (RQ's ``JobTimeoutException``) stops
Terraform with SIGINT and a grace period (``runner.terraform.run``), closes the job's apply runs so their
reservations end now, and reports the failure.

Must not: import Flask or ``app.web``, read the environment (``Settings`` comes from ``kl worker`` via
:func:`configure`, else ``Settings.from_env()`` once), or post anything it has not stored first.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from redis import Redis
from rq import Queue, Worker, get_current_job
from rq.job import Job
from rq.registry import DeferredJobRegistry, ScheduledJobRegistry, StartedJobRegistry
from rq.timeouts import JobTimeoutException

from app import queue
from app.config import Settings
from app.domain.overlaps import shared_globs
from app.domain.webhooks import job_id
from app.github import GitHub, GitHubError, PullInfo
from app.store import Database
from app.store import bot as store
from app.store.bot import BotJob, PrFootprint
from runner import bot_holds, botdrift, botflow, botview, comments, git
from runner.botconfig import BotConfig, BotConfigError, load
from runner.comments import (
    MARKER,
    ApplyResult,
    FootprintOutcome,
    PreviewOutcome,
    footprint_from_json,
    preview_from_json,
    to_json,
)
from runner.errors import Conflict
from runner.filescoped import ScopedFootprint

log = logging.getLogger("kilolock.jobs")

FOOTPRINT_CHECK, PLAN_CHECK, APPLY_CHECK = "kilolock/footprint", "kilolock/plan", "kilolock/apply"
ZERO_SHA = "0" * 40
POLL_SECONDS = 1.0
GitHubFactory = Callable[[Settings, str], GitHub]
_settings: Settings | None = None
_github_factory: GitHubFactory = GitHub.for_repo


def configure(settings: Settings, *, github: GitHubFactory | None = None) -> None:
    """Give the jobs of this process their settings (``kl worker`` calls it once, before forking) and,
    for tests, how to build GitHub clients (default ``GitHub.for_repo``)."""
    global _settings, _github_factory
    _settings = settings
    _github_factory = github or GitHub.for_repo


def _current_settings() -> Settings:
    global _settings
    if _settings is None:
        _settings = Settings.from_env()
    return _settings


@dataclass
class _Context:
    """One job's resources: settings, a small pool, Redis, GitHub clients per repository."""

    settings: Settings
    db: Database
    redis: Redis
    id: str
    bench: botflow.Bench
    _github: dict[str, GitHub]

    def github(self, repo: str) -> GitHub:
        if repo not in self._github:
            self._github[repo] = _github_factory(self.settings, repo)
        return self._github[repo]


@contextmanager
def _job(kind: str, repo: str, *parts: str | int) -> Iterator[_Context]:
    settings = _current_settings()
    if not settings.database_url:
        raise RuntimeError("KL_DATABASE_URL is not set: bot jobs store their outcome in Postgres")
    current = get_current_job()
    redis = current.connection if current is not None else queue.connect(settings.redis_url or "redis://")
    _let_children_take_sigint()
    db = Database(settings.database_url, pool_size=2)
    ctx = _Context(settings, db, redis, current.id if current is not None else job_id(kind, repo, *parts),
                   botflow.Bench.for_settings(settings), {})
    try:
        yield ctx
    except GitHubError:
        raise  # the outcome is stored: RQ's retry posts it
    except Exception as exc:
        # Anything else (git, the server, a bug) is retried by RQ; the last attempt stores the failure and
        # reports it in the job's check, so it does not stay "in progress" with the reason only in a log.
        if current is None or not current.retries_left:
            _record_crash(ctx, f"{exc.__class__.__name__}: {exc}")
        raise
    finally:
        db.close()


def _record_crash(ctx: _Context, error: str) -> None:
    try:
        row = store.get_job(ctx.db, ctx.id)
        if row is None or row.is_finished:
            return
        result: dict[str, Any] = {"crashed": error}
        if row.kind == "merge_apply" and row.project:
            result = {"apply": to_json(ApplyResult(row.project, "", row.sha, "failed", error=error,
                                                   hint="re-run the kilolock/apply check once the cause is fixed"))}
        store.finish_job(ctx.db, ctx.id, "failed", result, error=error)
        _deliver(ctx, store.get_job(ctx.db, ctx.id) or row)
    except Exception:
        log.exception("job %s: could not report its failure", ctx.id)


def _let_children_take_sigint() -> None:
    """RQ's work horse ignores SIGINT, and an ignored signal stays ignored across exec. Terraform's Go
    runtime takes an ignored SIGINT back when it asks for it, but a wrapper script (or anything else
    Terraform is started through) would never see the SIGINT that stops it gracefully on a timeout. A
    Python handler that does nothing keeps the horse deaf to SIGINT and is reset to the default in every
    child."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, lambda signum, frame: None)


def _deliver_or_claim(ctx: _Context, kind: str, repo: str, *, number: int | None, sha: str,
                      project: str = "") -> BotJob | None:
    """Claim the job; None means it was already done and its stored outcome has now been delivered."""
    row = store.claim_job(ctx.db, ctx.id, kind, repo, number=number, sha=sha, project=project)
    if row.is_finished:
        log.info("job %s already %s: delivering the stored outcome", row.id, row.status)
        _deliver(ctx, row)
        return None
    return row


def _finish(ctx: _Context, status: str, result: dict[str, Any]) -> str:
    store.finish_job(ctx.db, ctx.id, status, result)
    row = store.get_job(ctx.db, ctx.id)
    assert row is not None
    _deliver(ctx, row)
    return status


def work(settings: Settings, *, burst: bool = False, name: str | None = None, with_scheduler: bool = True) -> bool:
    """Run an RQ worker on the ``kilolock`` queue (JSON serializer) until SIGTERM (``kl worker``).

    Each job runs in a forked work horse. The first SIGTERM is a warm shutdown: the running job finishes,
    however long its apply takes; a second one kills the horse (Terraform, in its own process group, is
    not killed with it). ``with_scheduler`` also runs RQ's scheduler, which re-enqueues retried jobs.
    """
    configure(settings)
    redis = queue.connect(settings.redis_url or "redis://")
    serializer = "rq.serializers.JSONSerializer"
    rq_queue = Queue(queue.QUEUE_NAME, connection=redis, serializer=serializer)
    worker = Worker([rq_queue], connection=redis, serializer=serializer, name=name)
    if with_scheduler:  # the drift schedule: one tick stays scheduled (runner.botdrift)
        botdrift.schedule_tick(redis, settings.job_timeout, time.time())
    return bool(worker.work(burst=burst, with_scheduler=with_scheduler, logging_level=settings.log_level))


# --- pull requests --------------------------------------------------------------------------------


def pull_request_footprint(repo: str, number: int, head_sha: str) -> str:
    """PR opened, reopened or synchronized: predict its reservations, record them, comment, check."""
    with _job("pull_request", repo, number, head_sha) as ctx:
        if _deliver_or_claim(ctx, "pull_request", repo, number=number, sha=head_sha) is None:
            return "delivered"
        gh = ctx.github(repo)
        pr = gh.pull_request(number)
        if pr.state != "open" or pr.head_sha != head_sha:
            return _finish(ctx, "skipped", {"skipped": _late(pr, head_sha)})
        _progress(gh, head_sha, FOOTPRINT_CHECK, ctx.id, "Predicting the reservations of the changed files")
        outcome = _footprint_outcome(ctx, gh, repo, pr)
        before = botview.overlapping(ctx.db, repo, number, botview.states_of(ctx.db, repo, number))
        store.drop_footprints(ctx.db, repo, number)
        for project in outcome.projects:
            if not project.error:
                store.save_footprint(ctx.db, PrFootprint(repo, number, project.name, project.state, head_sha,
                                                         project.files, project.write_globs, project.read_globs))
        after = botview.overlapping(ctx.db, repo, number, {p.state for p in outcome.projects})
        return _finish(ctx, "failed" if outcome.failed else "succeeded",
                       {"footprint": to_json(outcome), "notify": sorted(before | after)})


def pull_request_preview(repo: str, number: int, head_sha: str) -> str:
    """The file-scoped plan of each project the PR touches; updates the comment and ``kilolock/plan``."""
    with _job("plan_preview", repo, number, head_sha) as ctx:
        if _deliver_or_claim(ctx, "plan_preview", repo, number=number, sha=head_sha) is None:
            return "delivered"
        gh = ctx.github(repo)
        pr = gh.pull_request(number)
        if pr.state != "open" or pr.head_sha != head_sha:
            return _finish(ctx, "skipped", {"skipped": _late(pr, head_sha)})
        _progress(gh, head_sha, PLAN_CHECK, ctx.id, "Planning the changed files")
        with botflow.checkout(ctx.bench, repo, head_sha, gh.clone_token(), want=(pr.base_sha,)) as root:
            config, errors = _config(root)
            projects: tuple[comments.ProjectPreview, ...] = ()
            if config is not None:
                base = git.merge_base(root, pr.base_sha, head_sha)
                projects = botflow.preview(ctx.bench, root, config, base, head_sha)
        outcome = PreviewOutcome(head_sha, projects, errors)
        return _finish(ctx, "failed" if outcome.failed else "succeeded", {"preview": to_json(outcome)})


def pull_request_closed(repo: str, number: int) -> str:
    """PR closed without merging: forget its footprint and refresh the comments that named it."""
    with _job("pull_request_closed", repo, number) as ctx:
        if _deliver_or_claim(ctx, "pull_request_closed", repo, number=number, sha="") is None:
            return "delivered"
        notify = botview.overlapping(ctx.db, repo, number, botview.states_of(ctx.db, repo, number))
        released = bot_holds.released_on_close(ctx, repo, number)
        store.drop_footprints(ctx.db, repo, number)
        return _finish(ctx, "succeeded", {"notify": sorted(notify | set(released["released_notify"])), **released})


def _footprint_outcome(ctx: _Context, gh: GitHub, repo: str, pr: PullInfo) -> FootprintOutcome:
    with botflow.checkout(ctx.bench, repo, pr.head_sha, gh.clone_token(), want=(pr.base_sha,)) as root:
        config, errors = _config(root)
        base = git.merge_base(root, pr.base_sha, pr.head_sha)
        if config is None:
            return FootprintOutcome(pr.head_sha, base, config_errors=errors, config_source=_source(root))
        projects = botflow.footprint(ctx.bench, root, config, base, pr.head_sha)
        return FootprintOutcome(pr.head_sha, base, projects, config_source=config.source)


def _late(pr: PullInfo, sha: str) -> str:
    if pr.state != "open":
        return f"pull request #{pr.number} is {pr.state}: the delivery for {sha[:12]} came late"
    return f"late delivery: the head of #{pr.number} moved from {sha[:12]} to {pr.head_sha[:12]}"


# --- merges and pushes ---------------------------------------------------------------------------


def merge_apply(repo: str, number: int, merge_sha: str, project: str = "", base: str = "") -> str:
    """A merged PR (``number`` > 0) or a push (0): without ``project``, find the projects the change
    touches and enqueue one apply job each; with it, apply that project on ``merge_sha``."""
    if project:
        return _apply_one(repo, number, merge_sha, project, base)
    with _job("merge_apply", repo, number, merge_sha) as ctx:
        if _deliver_or_claim(ctx, "merge_apply", repo, number=number, sha=merge_sha) is None:
            return "delivered"
        notify = botview.overlapping(ctx.db, repo, number, botview.states_of(ctx.db, repo, number))
        store.drop_footprints(ctx.db, repo, number)
        gh = ctx.github(repo)
        pr = gh.pull_request(number)
        applied = bot_holds.holds_heads(ctx.db, repo, number)
        with botflow.checkout(ctx.bench, repo, merge_sha, gh.clone_token(),
                              also=(pr.base_sha, pr.head_sha, *applied)) as root:
            config, errors = _config(root)
            if config is None:
                bot_holds.release_all(ctx.db, repo, number, f"#{number} was merged")
                return _finish(ctx, "failed", {"config_errors": list(errors), "notify": sorted(notify)})
            base = botflow.merge_diff_base(root, merge_sha, pr.base_sha, pr.head_sha)
            touched = botflow.changed_for(config, root, base, merge_sha)
            # The pull request's holds end here; what it applied before merge is not applied twice.
            touched, before = bot_holds.settle_merge(ctx, root, config, repo, number, merge_sha, touched)
        children, skipped = _fan_out(ctx, config, repo, number, merge_sha, base, touched, config.apply_on_merge,
                                     "apply on merge is off in .kilolock.yml")
        skipped += before
        return _finish(ctx, "succeeded", {"base": base, "children": children, "skipped": skipped,
                                          "notify": sorted(notify)})


def push_to_default_branch(repo: str, after: str, before: str) -> str:
    """A push to the default branch that is not a merged PR: analyze it, and apply it when
    ``apply_on_push`` says so."""
    with _job("push", repo, after) as ctx:
        if _deliver_or_claim(ctx, "push", repo, number=None, sha=after) is None:
            return "delivered"
        if before == ZERO_SHA or after == ZERO_SHA:
            return _finish(ctx, "skipped", {"skipped": "the push created or deleted the branch", "before": before})
        gh = ctx.github(repo)
        merged = botview.merged_by_job(ctx.db, repo, after)
        if merged is not None:
            return _finish(ctx, "skipped", {"skipped": f"the merge of #{merged}: its merge job applies it",
                                            "before": before})
        with botflow.checkout(ctx.bench, repo, after, gh.clone_token(), want=(before,), refresh=True) as root:
            branch = gh.default_branch()
            if not git.is_ancestor(root, after, f"refs/heads/{branch}"):
                return _finish(ctx, "skipped", {"skipped": f"{after[:12]} is not on {branch}", "before": before})
            number = _merged_pull_request(git.commit_subject(root, after))
            if number is not None:
                return _finish(ctx, "skipped", {"skipped": f"the merge of #{number}: its merge job applies it",
                                                "before": before})
            config, errors = _config(root)
            if config is None:
                outcome = FootprintOutcome(after, before, config_errors=errors, config_source=_source(root))
                return _finish(ctx, "failed", {"footprint": to_json(outcome), "before": before})
            outcome = FootprintOutcome(after, before, botflow.footprint(ctx.bench, root, config, before, after),
                                       config_source=config.source)
            touched = {p.name: p.changed for p in outcome.projects}
        children, skipped = _fan_out(ctx, config, repo, 0, after, before, touched, config.apply_on_push,
                                     "apply_on_push is off in .kilolock.yml (pushes are analyzed only)")
        return _finish(ctx, "failed" if outcome.failed else "succeeded",
                       {"footprint": to_json(outcome), "before": before, "base": before, "children": children,
                        "skipped": skipped})


def _fan_out(ctx: _Context, config: BotConfig, repo: str, number: int, sha: str, base: str,
             touched: dict[str, tuple[str, ...]], enabled: bool,
             why_off: str) -> tuple[list[str], list[dict[str, Any]]]:
    children: list[str] = []
    skipped: list[dict[str, Any]] = []
    for name in touched:
        project = config.project(name)
        assert project is not None
        if not enabled or not project.apply_on_merge:
            reason = why_off if not enabled else f"apply_on_merge is off for project {name}"
            skipped.append(to_json(ApplyResult(name, project.state, sha, "skipped", error=reason)))
            continue
        queue.enqueue(ctx.redis, "merge_apply", (repo, number, sha, name, base),
                      job_id=job_id("merge_apply", repo, number, sha, name), timeout=ctx.settings.job_timeout)
        children.append(name)
    return children, skipped


def _apply_one(repo: str, number: int, sha: str, name: str, base: str) -> str:
    with _job("merge_apply", repo, number, sha, name) as ctx:
        pr_number = number or None
        if _deliver_or_claim(ctx, "merge_apply", repo, number=pr_number, sha=sha, project=name) is None:
            return "delivered"
        gh = ctx.github(repo)
        actor = f"github:{repo}#{number}@{sha[:12]}/{name}" if number else f"github:{repo}@{sha[:12]}/{name}"
        with botflow.checkout(ctx.bench, repo, sha, gh.clone_token(), want=(base,)) as root:
            config, errors = _config(root)
            project = config.project(name) if config is not None else None
            if config is None or project is None:
                why = "; ".join(errors) or f"project {name!r} is no longer in .kilolock.yml"
                result = ApplyResult(name, "", sha, "failed", error=why, hint="fix .kilolock.yml and re-run the "
                                     "kilolock/apply check")
                return _finish(ctx, "failed", {"apply": to_json(result)})
            deadline = time.monotonic() + config.merge_wait
            try:
                result = botflow.apply_project(
                    ctx.bench, root, project, base, sha, actor=actor, wait_seconds=config.merge_wait,
                    before_apply=lambda scoped: _wait_for_earlier_merges(ctx, root, repo, sha, project.state,
                                                                         scoped, deadline))
            except JobTimeoutException:
                ended = botflow.end_live_runs(ctx.bench, root, project, actor, "the bot job timed out")
                result = ApplyResult(name, project.state, sha, "failed", run_id=ended[0] if ended else None,
                                     error=f"the apply job timed out after {ctx.settings.job_timeout} s; Terraform "
                                           "was interrupted and nothing was committed",
                                     hint="raise KL_JOB_TIMEOUT or make the change smaller, then re-run the "
                                          "kilolock/apply check")
        return _finish(ctx, "failed" if result.failed else "succeeded", {"apply": to_json(result)})


def _wait_for_earlier_merges(ctx: _Context, root: Any, repo: str, sha: str, state: str, scoped: ScopedFootprint,
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
            raise Conflict("an earlier merge that overlaps this one has not finished applying (job "
                            f"{blocking[0].id}); applying now could undo it")
        log.info("apply of %s waits for earlier merge job(s): %s", sha[:12], ", ".join(j.id for j in blocking))
        time.sleep(POLL_SECONDS)


def _pending_merge_jobs(current: Job) -> list[Job]:
    ids: set[str] = set()
    q = Queue(current.origin, connection=current.connection, serializer=current.serializer)
    ids.update(q.get_job_ids())
    for registry in (StartedJobRegistry(queue=q), ScheduledJobRegistry(queue=q), DeferredJobRegistry(queue=q)):
        ids.update(registry.get_job_ids())
    ids.discard(current.id)
    found = Job.fetch_many(sorted(ids), connection=current.connection, serializer=current.serializer)
    wanted = (queue.JOBS["merge_apply"], queue.JOBS["push"])
    done = ("finished", "failed", "canceled", "stopped")
    return [j for j in found if j is not None and j.func_name in wanted and j.get_status() not in done]


def _blocks(root: Any, repo: str, sha: str, mine: PrFootprint, other: Job) -> bool:
    args = list(other.args)
    if not args or args[0] != repo:
        return False
    other_sha = str(args[1] if other.func_name == queue.JOBS["push"] else args[2])
    if other_sha == sha:
        return False
    try:
        if not git.is_ancestor(root, other_sha, sha):
            return False
    except git.GitError:
        return False  # not in our history (another branch, or not fetched): not an earlier merge of ours
    published = other.meta.get("kilolock")
    if not published:
        return True  # a fan-out, or an apply that has not computed its footprint yet
    theirs = PrFootprint(repo, 1, "", str(published["state"]), other_sha, (), tuple(published["write_globs"]),
                         tuple(published["read_globs"]))
    return bool(shared_globs(mine, theirs))


def _merged_pull_request(subject: str) -> int | None:
    """GitHub's own subjects for a merge commit (``Merge pull request #12 from …``) and a squash merge
    (``Title (#12)``)."""
    import re

    found = re.match(r"Merge pull request #(\d+) ", subject) or re.search(r"\(#(\d+)\)$", subject.strip())
    return int(found.group(1)) if found else None


# --- comment commands and re-runs ----------------------------------------------------------------


def comment_command(repo: str, number: int, comment_id: int, login: str, body: str) -> str:
    """``kilolock plan`` / ``kilolock help`` from someone with write access; anything else a polite reply."""
    with _job("comment", repo, number, comment_id) as ctx:
        if _deliver_or_claim(ctx, "comment", repo, number=number, sha=str(comment_id)) is None:
            return "delivered"
        gh = ctx.github(repo)
        words = body.split()
        command = words[1].lower() if len(words) > 1 else "help"
        if login == gh.login:
            return _finish(ctx, "skipped", {"skipped": "a comment by the bot itself"})
        if not gh.has_write_access(login):
            reply = (f"@{login} only people with write access to {repo} can run Kilolock commands; ask a "
                     f"maintainer to comment `kilolock {command}` if it is needed.")
        elif command == "plan":
            pr = gh.pull_request(number)
            if pr.state != "open":
                reply = f"@{login} #{number} is {pr.state}: there is nothing to preview."
            else:
                preview_id = job_id("plan_preview", repo, number, pr.head_sha)
                store.reset_job(ctx.db, preview_id)
                queue.enqueue(ctx.redis, "plan_preview", (repo, number, pr.head_sha), job_id=preview_id,
                              timeout=ctx.settings.job_timeout)
                reply = (f"@{login} re-running the plan preview for {pr.head_sha[:7]}; the Kilolock comment on "
                         "this pull request will show it.")
        elif command == "apply":
            return _finish(ctx, "succeeded", bot_holds.comment_apply(ctx, gh, repo, number, login, words[2:]))
        elif command == "unlock":
            return _finish(ctx, "succeeded", bot_holds.comment_unlock(ctx, repo, number, login))
        elif command == "help":
            reply = comments.HELP
        else:
            reply = f"@{login} sorry, `kilolock {command}` is not a command I know.\n\n{comments.HELP}"
        return _finish(ctx, "succeeded", {"reply": reply, "command": command})


def pull_request_review(repo: str, number: int, head_sha: str) -> str:
    """A review was submitted or dismissed: the head's ``kilolock/apply`` check says whether a comment
    apply may run now (``runner.bot_holds.review_readiness``)."""
    with _job("pull_request_review", repo, number, head_sha) as ctx:
        if _deliver_or_claim(ctx, "pull_request_review", repo, number=number, sha=head_sha) is None:
            return "delivered"
        return _finish(ctx, *bot_holds.review_readiness(ctx, ctx.github(repo), repo, number, head_sha))


def reconcile_holds(repo: str) -> str:
    """Run the merge or close job of every pull request that holds but is no longer open (its delivery
    was missed): see ``runner.bot_holds.reconcile``."""
    with _job("reconcile_holds", repo) as ctx:
        ended = bot_holds.reconcile(ctx, ctx.github(repo), repo)
        return "reconciled " + (", ".join(f"#{n}" for n in ended) or "nothing")


def drift_tick(at: int) -> str:
    """Enqueue the drift checks due at ``at`` (epoch seconds) and schedule the next tick."""
    with _job("drift_tick", botdrift.TICK_REPO, at) as ctx:
        return "enqueued " + (", ".join(botdrift.tick(ctx, at, now=time.time())) or "nothing")


def drift_check(repo: str, project: str, window: int, sha: str, branch: str) -> str:
    """The scheduled drift check of one project for the window starting at ``window``."""
    with _job("drift_check", repo, project, window) as ctx:
        return botdrift.check(ctx, repo, project, window, sha, branch)


def rerun_check(repo: str, external_id: str, head_sha: str) -> str:
    """A ``kilolock/*`` check run was re-requested: forget the stored outcome of the job its
    ``external_id`` names and run that job again."""
    settings = _current_settings()
    assert settings.database_url
    db = Database(settings.database_url, pool_size=2)
    current = get_current_job()
    redis = current.connection if current is not None else queue.connect(settings.redis_url or "redis://")
    try:
        row = store.get_job(db, external_id)
        if row is None or row.repo != repo:
            log.warning("re-run of %s on %s: no such Kilolock job", external_id, repo)
            return "unknown"
        targets = [row]
        if row.kind in ("merge_apply", "push") and not row.project and row.status != "failed":
            # The apply check stands for all projects of a merge: re-run the ones that failed.
            targets = [j for j in store.list_jobs(db, repo, row.number) if j.kind == "merge_apply" and j.project
                       and j.sha == row.sha and j.status == "failed"] or [row]
        for target in targets:
            args = _rerun_args(db, target)
            store.reset_job(db, target.id)
            queue.enqueue(redis, target.kind, args, job_id=target.id, timeout=settings.job_timeout)
        return "requeued " + ", ".join(t.id for t in targets)
    finally:
        db.close()


def _rerun_args(db: Database, row: BotJob) -> tuple[str | int, ...]:
    number = row.number or 0
    if row.kind == "drift_check":
        return botdrift.rerun_args(row)
    if row.kind == "push":
        return row.repo, row.sha, str(row.result.get("before", ZERO_SHA))
    if row.kind == "merge_apply" and row.project:
        parent_kind = "merge_apply" if number else "push"
        parent = store.get_job(db, job_id(parent_kind, row.repo, number, row.sha) if number else
                               job_id(parent_kind, row.repo, row.sha))
        base = str(parent.result.get("base", "")) if parent is not None else ""
        return row.repo, number, row.sha, row.project, base
    if row.kind in ("comment", "pull_request_closed"):
        raise ValueError(f"{row.kind} jobs have no check run to re-run")
    return row.repo, number, row.sha


# --- posting stored outcomes ---------------------------------------------------------------------


def _deliver(ctx: _Context, row: BotJob) -> None:
    """Post a stored outcome (again). Raises GitHubError when GitHub fails, so RQ retries the job and the
    retry posts the same stored outcome."""
    if row.posted:
        return
    result = row.result
    if row.status == "skipped" and "footprint" not in result:
        log.info("job %s skipped: %s", row.id, result.get("skipped"))
        store.mark_posted(ctx.db, row.id)
        return
    repo, number = row.repo, row.number
    gh = ctx.github(repo)
    if "crashed" in result:
        name = {"pull_request": FOOTPRINT_CHECK, "push": FOOTPRINT_CHECK, "plan_preview": PLAN_CHECK,
                "merge_apply": APPLY_CHECK}.get(row.kind)
        if name is not None and row.sha:
            _complete(gh, row.sha, name, comments.CheckOutput(
                "failure", "Kilolock could not finish this job", f"```\n{result['crashed'][-3000:]}\n```\n\n"
                "It was retried; re-run the check once the cause is fixed."), row.id)
    elif row.kind == "pull_request":
        outcome = footprint_from_json(result["footprint"])
        _refresh(ctx, gh, repo, number or 0)  # the comment first: it is what people wait for
        check = comments.footprint_check(outcome, botview.overlaps_of(ctx.db, repo, number or 0, outcome))
        _complete(gh, row.sha, FOOTPRINT_CHECK, check, row.id)
        for other in result.get("notify", ()):
            if other != number:
                _refresh(ctx, gh, repo, int(other))
        bot_holds.mark_stale(gh, ctx.db, repo, number or 0, row.sha)
        bot_holds.maybe_reconcile(ctx, repo)
        if outcome.projects and any(not p.error for p in outcome.projects):
            queue.enqueue(ctx.redis, "plan_preview", (repo, number or 0, row.sha),
                          job_id=job_id("plan_preview", repo, number or 0, row.sha), timeout=ctx.settings.job_timeout)
    elif row.kind == "plan_preview":
        _complete(gh, row.sha, PLAN_CHECK, comments.plan_check(preview_from_json(result["preview"])), row.id)
        _refresh(ctx, gh, repo, number or 0)
    elif row.kind == "pull_request_closed":
        if result.get("released") or result.get("applied_before"):
            _refresh(ctx, gh, repo, number or 0)
        for other in result.get("notify", ()):
            _refresh(ctx, gh, repo, int(other))
    elif row.kind == "comment":
        others = [int(n) for n in result.get("notify", ())]
        if "pr_apply" in result:
            others += bot_holds.deliver_apply(gh, number or 0, result, row.id)
        gh.reply(number or 0, str(result["reply"]))
        if result.get("command") in ("apply", "unlock"):
            for other in [number or 0, *sorted(set(others) - {number})]:
                _refresh(ctx, gh, repo, other)
        bot_holds.maybe_reconcile(ctx, repo)
    elif row.kind == "pull_request_review":
        ready = result["ready_check"]
        gh.set_check(ready["sha"], APPLY_CHECK, status="queued", title=ready["title"], summary=ready["summary"],
                     external_id=row.id)
    elif row.kind == "push":
        if "footprint" in result:
            _complete(gh, row.sha, FOOTPRINT_CHECK, comments.footprint_check(
                footprint_from_json(result["footprint"]), {}), row.id)
        if result.get("children") or result.get("skipped"):
            _report_apply(ctx, gh, store.get_job(ctx.db, row.id) or row)
    elif row.kind == "merge_apply":
        parent = row if not row.project else store.get_job(ctx.db, _parent_id(row))
        if parent is not None:
            _report_apply(ctx, gh, parent)
        if number:
            _refresh(ctx, gh, repo, number)
            for other in result.get("notify", ()):
                _refresh(ctx, gh, repo, int(other))
    store.mark_posted(ctx.db, row.id)


def _parent_id(row: BotJob) -> str:
    return job_id("merge_apply", row.repo, row.number, row.sha) if row.number else job_id("push", row.repo, row.sha)


def _report_apply(ctx: _Context, gh: GitHub, parent: BotJob) -> None:
    """The ``kilolock/apply`` check of a merge or push: all its projects, in progress until each is done.
    Under a lock, and read inside it: a later report always sees at least what an earlier one saw."""
    with ctx.redis.lock(f"kilolock:apply-check:{parent.id}", timeout=300, blocking_timeout=300):
        fresh = store.get_job(ctx.db, parent.id) or parent
        _report_apply_locked(ctx, gh, fresh)


def _report_apply_locked(ctx: _Context, gh: GitHub, parent: BotJob) -> None:
    if "config_errors" in parent.result:
        _complete(gh, parent.sha, APPLY_CHECK, comments.CheckOutput(
            "failure", ".kilolock.yml is invalid: nothing was applied",
            "\n".join(f"- {e}" for e in parent.result["config_errors"])), parent.id)
        return
    results, pending = botview.apply_results(ctx.db, parent)
    if pending:
        gh.set_check(parent.sha, APPLY_CHECK, status="in_progress", title=f"applying {', '.join(pending)}",
                     summary=f"Waiting for reservations or applying: {', '.join(pending)}", external_id=parent.id)
        return
    if results:
        _complete(gh, parent.sha, APPLY_CHECK, comments.apply_check(results), parent.id)


def _complete(gh: GitHub, sha: str, name: str, check: comments.CheckOutput, external_id: str) -> None:
    gh.set_check(sha, name, status="completed", conclusion=check.conclusion, title=check.title,
                 summary=check.summary, text=check.text, external_id=external_id)


def _progress(gh: GitHub, sha: str, name: str, external_id: str, title: str) -> None:
    """Best effort: a check that shows the job started (the outcome is posted for sure later)."""
    try:
        gh.set_check(sha, name, status="in_progress", title=title, summary=title + "…", external_id=external_id)
    except GitHubError as exc:
        log.warning("could not mark %s in progress on %s: %s", name, sha[:12], exc)


def _refresh(ctx: _Context, gh: GitHub, repo: str, number: int) -> None:
    """Re-render PR ``number``'s comment from what is stored, under a per-PR lock."""
    with ctx.redis.lock(f"kilolock:comment:{repo}#{number}", timeout=300, blocking_timeout=300):
        view = botview.comment_view(ctx.db, repo, number)
        if view.footprint is None and not view.applies:
            return
        gh.upsert_comment(number, MARKER, comments.render_comment(view))


def _config(root: Any) -> tuple[BotConfig | None, tuple[str, ...]]:
    try:
        return load(root), ()
    except BotConfigError as exc:
        return None, exc.problems


def _source(root: Any) -> str:
    from runner.botconfig import read_raw

    try:
        return read_raw(root).source
    except BotConfigError as exc:
        return exc.source


__all__: Sequence[str] = ("comment_command", "configure", "drift_check", "drift_tick", "merge_apply",
                          "pull_request_closed", "pull_request_footprint", "pull_request_preview",
                          "pull_request_review", "push_to_default_branch", "reconcile_holds", "rerun_check")
