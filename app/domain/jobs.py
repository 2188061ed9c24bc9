"""The bot's job contract: the kinds of job, one frozen argument type per kind, and the stable job id.

:data:`REGISTRY` is the one table of kinds (argument type, the dotted path of the job function), filled by
:func:`job` where each argument type is declared. The webhook router (``app.domain.webhooks``) builds the
arguments, ``app.queue`` enqueues them (by that dotted path, arguments passed by keyword) and ``runner.bot.jobs``
runs them; ``bot_jobs.args`` keeps them, so a re-run reads the arguments back instead of rebuilding them.
Arguments are str/int only (RQ's JSON serializer). Pure: no I/O. Must not: import RQ, Redis or anything in ``runner``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from enum import StrEnum
from typing import Any, ClassVar, TypeVar

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


class JobKind(StrEnum):
    """What a job does; the value is what ``bot_jobs.kind`` stores and what job ids start with."""

    PULL_REQUEST = "pull_request"  # predict the footprint of a pull request's head
    PLAN_PREVIEW = "plan_preview"  # the file-scoped plan of that head
    PULL_REQUEST_CLOSED = "pull_request_closed"
    MERGE = "merge"  # a merged pull request: fan out one apply_project per touched project
    APPLY_PROJECT = "apply_project"  # one project's apply of a merge or a push
    PUSH = "push"  # a push to the default branch that is not a merge: analyze, maybe fan out
    RERUN = "rerun"  # a re-requested check run
    COMMENT = "comment"  # a `kilolock …` comment command
    RECONCILE_HOLDS = "reconcile_holds"
    PULL_REQUEST_REVIEW = "pull_request_review"
    DRIFT_TICK = "drift_tick"
    DRIFT_CHECK = "drift_check"
    EVENTS_TICK = "events_tick"  # deliver pending outgoing events to every endpoint


@dataclass(frozen=True, slots=True)
class JobArgs:
    """Base of every kind's arguments. ``subject`` is what the job's ``bot_jobs`` row is about: its
    ``repo``, ``number`` and ``project`` fields where the kind has them, and the field ``SHA`` names."""

    kind: ClassVar[JobKind]
    SHA: ClassVar[str] = ""  # the field that holds the row's SHA ("" for none)

    def to_kwargs(self) -> dict[str, str | int]:
        return dict(asdict(self))

    def subject(self) -> Subject:
        kwargs = self.to_kwargs()
        number = kwargs.get("number")
        return Subject(str(kwargs.get("repo", "")) or TICK_REPO, int(number) if number else None,
                       str(kwargs[self.SHA]) if self.SHA else "", str(kwargs.get("project", "")))


@dataclass(frozen=True, slots=True)
class Subject:
    """The columns of a ``bot_jobs`` row: repository, pull request (None for pushes), SHA, project."""

    repo: str
    number: int | None
    sha: str
    project: str = ""


A = TypeVar("A", bound=type[JobArgs])


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One kind of job: its argument type and the dotted path of the function RQ calls with them by keyword
    (a string, so that enqueueing never imports job code)."""

    args: type[JobArgs]
    entry: str

    @property
    def kind(self) -> JobKind:
        return self.args.kind


# The one table of job kinds, filled by :func:`job` as each argument type is declared: every other table keyed
# by kind is derived from it or checked against it.
REGISTRY: dict[JobKind, JobSpec] = {}


def job(kind: JobKind, entry: str, *, sha: str | None = None) -> Callable[[A], A]:
    """Declare the decorated type the arguments of ``kind``, run by the function at the dotted path ``entry``;
    ``sha`` names the field that holds the row's SHA (the base type's when not given)."""

    def declare(cls: A) -> A:
        if kind in REGISTRY:
            raise RuntimeError(f"job kind {kind} declared twice: {REGISTRY[kind].args.__name__}, {cls.__name__}")
        cls.kind = kind
        if sha is not None:
            cls.SHA = sha
        REGISTRY[kind] = JobSpec(cls, entry)
        return cls

    return declare


@dataclass(frozen=True, slots=True)
class RepoArgs(JobArgs):
    """Arguments of a job about one repository; every kind but the periodic ticks."""

    repo: str


@dataclass(frozen=True, slots=True)
class PullArgs(RepoArgs):
    """Arguments of a job about one pull request (or, for ``apply_project``, 0 for a push)."""

    number: int


@job(JobKind.PULL_REQUEST, "runner.bot.jobs.pull_request_footprint", sha="head_sha")
@dataclass(frozen=True, slots=True)
class PullRequestArgs(PullArgs):
    """Predict the footprint of a pull request's head."""

    head_sha: str


@job(JobKind.PLAN_PREVIEW, "runner.bot.jobs.pull_request_preview")
@dataclass(frozen=True, slots=True)
class PreviewArgs(PullRequestArgs):
    """The file-scoped plan of a pull request's head."""


@job(JobKind.PULL_REQUEST_REVIEW, "runner.bot.jobs.pull_request_review")
@dataclass(frozen=True, slots=True)
class ReviewArgs(PullRequestArgs):
    """A review was submitted or dismissed: whether a comment apply may run on the head now."""


@job(JobKind.PULL_REQUEST_CLOSED, "runner.bot.jobs.pull_request_closed")
@dataclass(frozen=True, slots=True)
class ClosedArgs(PullArgs):
    """A pull request closed without a merge: forget its footprint and release its holds."""


@job(JobKind.MERGE, "runner.bot.jobs.merge", sha="merge_sha")
@dataclass(frozen=True, slots=True)
class MergeArgs(PullArgs):
    """A merged pull request: fan out one ``apply_project`` per touched project."""

    merge_sha: str


@job(JobKind.APPLY_PROJECT, "runner.bot.jobs.apply_project", sha="sha")
@dataclass(frozen=True, slots=True)
class ApplyProjectArgs(PullArgs):
    """One project of a merge (``number`` > 0) or a push (0), diffed from ``base``."""

    sha: str
    project: str
    base: str

    def parent_id(self) -> str:
        """The id of the merge or push job that fanned this one out."""
        if self.number:
            return job_id(JobKind.MERGE, self.repo, self.number, self.sha)
        return job_id(JobKind.PUSH, self.repo, self.sha)


# A comment has no SHA of its own: the row keeps the comment's id.
@job(JobKind.COMMENT, "runner.bot.jobs.comment_command", sha="comment_id")
@dataclass(frozen=True, slots=True)
class CommentArgs(PullArgs):
    """A ``kilolock …`` comment command."""

    comment_id: int
    login: str
    body: str


@job(JobKind.PUSH, "runner.bot.jobs.push_to_default_branch", sha="after")
@dataclass(frozen=True, slots=True)
class PushArgs(RepoArgs):
    """A push to the default branch that is not a merge: analyze it, and maybe fan out."""

    after: str
    before: str


@job(JobKind.RERUN, "runner.bot.jobs.rerun_check", sha="head_sha")
@dataclass(frozen=True, slots=True)
class RerunArgs(RepoArgs):
    """A re-requested check run."""

    external_id: str
    head_sha: str


@job(JobKind.RECONCILE_HOLDS, "runner.bot.jobs.reconcile_holds")
@dataclass(frozen=True, slots=True)
class ReconcileArgs(RepoArgs):
    """Run the merge or close job of every pull request that holds but is no longer open."""


@dataclass(frozen=True, slots=True)
class TickArgs(JobArgs):
    """Arguments of a periodic job about no repository: ``at`` is the epoch second of its slot."""

    at: int


@job(JobKind.DRIFT_TICK, "runner.bot.jobs.drift_tick")
@dataclass(frozen=True, slots=True)
class DriftTickArgs(TickArgs):
    """Enqueue the drift checks that are due and schedule the next tick."""


@job(JobKind.EVENTS_TICK, "runner.bot.jobs.events_tick")
@dataclass(frozen=True, slots=True)
class EventsTickArgs(TickArgs):
    """Deliver pending outgoing events to every endpoint."""


@job(JobKind.DRIFT_CHECK, "runner.bot.jobs.drift_check", sha="sha")
@dataclass(frozen=True, slots=True)
class DriftCheckArgs(RepoArgs):
    """The scheduled drift check of one project for the window starting at ``window`` (epoch seconds)."""

    project: str
    window: int
    sha: str
    branch: str


TICK_REPO = "-"  # drift ticks belong to no repository

if set(REGISTRY) != set(JobKind):  # a kind declared by no argument type
    raise RuntimeError(f"job kinds without an argument type: {set(JobKind) - set(REGISTRY)}")

ARGS: dict[JobKind, type[JobArgs]] = {kind: spec.args for kind, spec in REGISTRY.items()}


def args_from_json(kind: JobKind, doc: Mapping[str, Any]) -> JobArgs | None:
    """The arguments a ``bot_jobs`` row kept; None when it kept none (a comment job stored before
    arguments were kept)."""
    cls = ARGS[kind]
    names = [f.name for f in fields(cls)]
    if not doc or any(n not in doc for n in names):
        return None
    return cls(**{n: doc[n] for n in names})


def job_id(kind: str, repo: str, *parts: str | int) -> str:
    """The stable job id for ``kind`` on ``repo`` and ``parts`` (PR number, SHA…).

    RQ accepts only ``[A-Za-z0-9_-]`` in ids, so the readable part replaces anything else with ``_``
    (``Codertocat/Hello-World`` → ``Codertocat_Hello-World``); the trailing digest of the exact
    values keeps ids of repositories that differ only there (``a/b.c``, ``a/b_c``) apart.
    """
    exact = "\x1f".join([kind, repo, *(str(p) for p in parts)])
    digest = hashlib.blake2b(exact.encode(), digest_size=4).hexdigest()
    readable = "-".join(_UNSAFE.sub("_", str(p)) for p in (kind, repo, *parts))
    return f"{readable}-{digest}"
