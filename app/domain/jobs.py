"""The bot's job contract: the kinds of job, one frozen argument type per kind, and the stable job id.

:data:`REGISTRY` is the one table of kinds (argument type, the dotted path of the job function). The webhook
router (``app.domain.webhooks``) builds the arguments, ``app.queue`` enqueues them (by that dotted path,
arguments passed by keyword) and ``runner.bot.jobs`` runs them; ``bot_jobs.args`` keeps them, so a re-run
reads the arguments back instead of rebuilding them. Arguments are str/int only (RQ's JSON serializer).
Pure: no I/O. Must not: import RQ, Redis or anything in ``runner``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from enum import StrEnum
from typing import Any, ClassVar

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


@dataclass(frozen=True, slots=True)
class RepoArgs(JobArgs):
    """Arguments of a job about one repository; every kind but the drift tick."""

    repo: str


@dataclass(frozen=True, slots=True)
class PullArgs(RepoArgs):
    """Arguments of a job about one pull request (or, for ``apply_project``, 0 for a push)."""

    number: int


@dataclass(frozen=True, slots=True)
class PullRequestArgs(PullArgs):
    kind: ClassVar[JobKind] = JobKind.PULL_REQUEST
    SHA: ClassVar[str] = "head_sha"
    head_sha: str


@dataclass(frozen=True, slots=True)
class PreviewArgs(PullRequestArgs):
    kind: ClassVar[JobKind] = JobKind.PLAN_PREVIEW


@dataclass(frozen=True, slots=True)
class ReviewArgs(PullRequestArgs):
    kind: ClassVar[JobKind] = JobKind.PULL_REQUEST_REVIEW


@dataclass(frozen=True, slots=True)
class ClosedArgs(PullArgs):
    kind: ClassVar[JobKind] = JobKind.PULL_REQUEST_CLOSED


@dataclass(frozen=True, slots=True)
class MergeArgs(PullArgs):
    kind: ClassVar[JobKind] = JobKind.MERGE
    SHA: ClassVar[str] = "merge_sha"
    merge_sha: str


@dataclass(frozen=True, slots=True)
class ApplyProjectArgs(PullArgs):
    """One project of a merge (``number`` > 0) or a push (0), diffed from ``base``."""

    kind: ClassVar[JobKind] = JobKind.APPLY_PROJECT
    SHA: ClassVar[str] = "sha"
    sha: str
    project: str
    base: str

    def parent_id(self) -> str:
        """The id of the merge or push job that fanned this one out."""
        if self.number:
            return job_id(JobKind.MERGE, self.repo, self.number, self.sha)
        return job_id(JobKind.PUSH, self.repo, self.sha)


@dataclass(frozen=True, slots=True)
class CommentArgs(PullArgs):
    kind: ClassVar[JobKind] = JobKind.COMMENT
    SHA: ClassVar[str] = "comment_id"  # a comment has no SHA of its own: the row keeps the comment's id
    comment_id: int
    login: str
    body: str


@dataclass(frozen=True, slots=True)
class PushArgs(RepoArgs):
    kind: ClassVar[JobKind] = JobKind.PUSH
    SHA: ClassVar[str] = "after"
    after: str
    before: str


@dataclass(frozen=True, slots=True)
class RerunArgs(RepoArgs):
    kind: ClassVar[JobKind] = JobKind.RERUN
    SHA: ClassVar[str] = "head_sha"
    external_id: str
    head_sha: str


@dataclass(frozen=True, slots=True)
class ReconcileArgs(RepoArgs):
    kind: ClassVar[JobKind] = JobKind.RECONCILE_HOLDS


@dataclass(frozen=True, slots=True)
class TickArgs(JobArgs):
    """Arguments of a periodic job about no repository: ``at`` is the epoch second of its slot."""

    at: int


@dataclass(frozen=True, slots=True)
class DriftTickArgs(TickArgs):
    kind: ClassVar[JobKind] = JobKind.DRIFT_TICK


@dataclass(frozen=True, slots=True)
class EventsTickArgs(TickArgs):
    kind: ClassVar[JobKind] = JobKind.EVENTS_TICK


@dataclass(frozen=True, slots=True)
class DriftCheckArgs(RepoArgs):
    """The scheduled drift check of one project for the window starting at ``window`` (epoch seconds)."""

    kind: ClassVar[JobKind] = JobKind.DRIFT_CHECK
    SHA: ClassVar[str] = "sha"
    project: str
    window: int
    sha: str
    branch: str


TICK_REPO = "-"  # drift ticks belong to no repository


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One kind of job: its argument type and the dotted path of the function RQ calls with them by keyword
    (a string, so that enqueueing never imports job code)."""

    args: type[JobArgs]
    entry: str

    @property
    def kind(self) -> JobKind:
        return self.args.kind


# The one table of job kinds: every other table keyed by kind is derived from it or checked against it.
_SPECS = (
    JobSpec(PullRequestArgs, "runner.bot.jobs.pull_request_footprint"),
    JobSpec(PreviewArgs, "runner.bot.jobs.pull_request_preview"),
    JobSpec(ClosedArgs, "runner.bot.jobs.pull_request_closed"),
    JobSpec(MergeArgs, "runner.bot.jobs.merge"),
    JobSpec(ApplyProjectArgs, "runner.bot.jobs.apply_project"),
    JobSpec(PushArgs, "runner.bot.jobs.push_to_default_branch"),
    JobSpec(RerunArgs, "runner.bot.jobs.rerun_check"),
    JobSpec(CommentArgs, "runner.bot.jobs.comment_command"),
    JobSpec(ReconcileArgs, "runner.bot.jobs.reconcile_holds"),
    JobSpec(ReviewArgs, "runner.bot.jobs.pull_request_review"),
    JobSpec(DriftTickArgs, "runner.bot.jobs.drift_tick"),
    JobSpec(DriftCheckArgs, "runner.bot.jobs.drift_check"),
    JobSpec(EventsTickArgs, "runner.bot.jobs.events_tick"),
)
REGISTRY: dict[JobKind, JobSpec] = {spec.kind: spec for spec in _SPECS}
if set(REGISTRY) != set(JobKind) or len(REGISTRY) != len(_SPECS):  # a kind without a row, or with two
    raise RuntimeError(f"job kinds without exactly one registry row: {set(JobKind) ^ set(REGISTRY)}")

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
