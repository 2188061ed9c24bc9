"""One bot job's resources, and the posting helpers every kind of job shares.

Owns the process's settings for jobs (``kl worker`` gives them through :func:`configure`, else
``Settings.from_env()`` once), how GitHub clients are built (tests swap it), and the :class:`Context` a
job runs with: a small database pool opened inside the job (after RQ forked), Redis, the job's id and
the GitHub clients per repository. The helpers post check runs and re-render a pull request's comment
from what is stored, under a Redis lock per pull request. Must not: decide what a job computes
(``runner.bot.pulls``, ``runner.bot.merges``) or import Flask.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from redis import Redis
from rq import get_current_job

from app import queue
from app.config import Settings
from app.domain.jobs import JobArgs, job_id
from app.store import Database
from runner.bot import flow, render, view
from runner.bot.github import GitHub, GitHubError

log = logging.getLogger("kilolock.jobs")

FOOTPRINT_CHECK, PLAN_CHECK, APPLY_CHECK = "kilolock/footprint", "kilolock/plan", "kilolock/apply"
GitHubFactory = Callable[[Settings, str], GitHub]
_settings: Settings | None = None
_github_factory: GitHubFactory = GitHub.for_repo


def configure(settings: Settings, *, github: GitHubFactory | None = None) -> None:
    """Give the jobs of this process their settings (``kl worker`` calls it once, before forking) and,
    for tests, how to build GitHub clients (default ``GitHub.for_repo``)."""
    global _settings, _github_factory
    _settings = settings
    _github_factory = github or GitHub.for_repo


def current_settings() -> Settings:
    global _settings
    if _settings is None:
        _settings = Settings.from_env()
    return _settings


@dataclass
class Context:
    """One job's resources: settings, a small pool, Redis, GitHub clients per repository."""

    settings: Settings
    db: Database
    redis: Redis
    id: str
    workbench: flow.Workbench
    last_attempt: bool = True
    _github: dict[str, GitHub] = field(default_factory=dict)

    def github(self, repo: str) -> GitHub:
        if repo not in self._github:
            self._github[repo] = _github_factory(self.settings, repo)
        return self._github[repo]

    def enqueue(self, args: JobArgs, jid: str) -> None:
        queue.enqueue(self.redis, args, job_id=jid, timeout=self.settings.job_timeout)


def services(settings: Settings, needs: str) -> tuple[Redis, Database]:
    """The running job's Redis connection (outside RQ, KL_REDIS_URL's) and a small pool on KL_DATABASE_URL,
    which a job must have because it ``needs`` it; the caller closes the pool."""
    if not settings.database_url:
        raise RuntimeError(f"KL_DATABASE_URL is not set: {needs}")
    current = get_current_job()
    redis = current.connection if current is not None else queue.connect(settings.redis_url or "redis://")
    return redis, Database(settings.database_url, pool_size=2)


@contextmanager
def opened(args: JobArgs, *parts: str | int) -> Iterator[Context]:
    """The context of the job running now (its RQ id; outside RQ, the id ``parts`` derive)."""
    settings = current_settings()
    redis, db = services(settings, "bot jobs store their outcome in Postgres")
    _let_children_take_sigint()
    current = get_current_job()
    jid = current.id if current is not None else job_id(args.kind, args.subject().repo, *parts)
    ctx = Context(settings, db, redis, jid, flow.Workbench.for_settings(settings),
                  last_attempt=current is None or not current.retries_left)
    try:
        yield ctx
    finally:
        db.close()


def _let_children_take_sigint() -> None:
    """RQ's work horse ignores SIGINT, and an ignored signal stays ignored across exec. Terraform's Go
    runtime takes an ignored SIGINT back when it asks for it, but a wrapper script (or anything else
    Terraform is started through) would never see the SIGINT that stops it gracefully on a timeout. A
    Python handler that does nothing keeps the horse deaf to SIGINT and is reset to the default in every
    child."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, lambda signum, frame: None)


# --- posting ------------------------------------------------------------------------------------------


def complete(gh: GitHub, sha: str, name: str, check: render.CheckOutput, external_id: str) -> None:
    gh.set_check(sha, name, status="completed", conclusion=check.conclusion, title=check.title,
                 summary=check.summary, text=check.text, external_id=external_id)


def progress(gh: GitHub, sha: str, name: str, external_id: str, title: str) -> None:
    """Best effort: a check that shows the job started (the outcome is posted for sure later)."""
    try:
        gh.set_check(sha, name, status="in_progress", title=title, summary=title + "…", external_id=external_id)
    except GitHubError as exc:
        log.warning("could not mark %s in progress on %s: %s", name, sha[:12], exc)


def refresh(ctx: Context, gh: GitHub, repo: str, number: int) -> None:
    """Re-render PR ``number``'s comment from what is stored, under a per-PR lock."""
    with ctx.redis.lock(f"kilolock:comment:{repo}#{number}", timeout=300, blocking_timeout=300):
        shown = view.comment_view(ctx.db, repo, number)
        if shown.footprint is None and not shown.applies:
            return
        gh.upsert_comment(number, render.MARKER, render.render_comment(shown))
