"""What each kind of bot job stores in ``bot_jobs.result``: one frozen result type per kind, with its JSON form.

Every result may say why the job did nothing (``skipped``), why it crashed (``crashed``) and which other pull
requests' comments must re-render (``notify``); each kind adds its own outcome (``runner.bot.outcomes``).
The JSON is the one rows were always written in, so rows stored before read back unchanged.
:func:`result_of` reads a row into the type of its kind. Must not: render, post or compute anything.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

from app.domain.jobs import JobKind
from app.store.bot import BotJob
from runner.bot.outcomes import (
    ApplyResult,
    FootprintOutcome,
    PreviewOutcome,
    apply_from_json,
    footprint_from_json,
    preview_from_json,
    to_json,
)


@dataclass(frozen=True, slots=True)
class JobResult:
    """What any job may store: why it did nothing, why it crashed, whom to notify."""

    skipped: str | None = None
    crashed: str | None = None
    notify: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {}
        if self.skipped is not None:
            doc["skipped"] = self.skipped
        if self.crashed is not None:
            doc["crashed"] = self.crashed
        if self.notify:
            doc["notify"] = sorted(self.notify)
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Self:
        return cls(**_base(doc))


def _base(doc: Mapping[str, Any]) -> dict[str, Any]:
    skipped = doc.get("skipped")
    return {"skipped": skipped if isinstance(skipped, str) else None, "crashed": doc.get("crashed"),
            "notify": tuple(int(n) for n in doc.get("notify", ()))}


@dataclass(frozen=True, slots=True)
class FootprintResult(JobResult):
    footprint: FootprintOutcome | None = None

    def to_json(self) -> dict[str, Any]:
        doc = JobResult.to_json(self)
        if self.footprint is not None:
            doc["footprint"] = to_json(self.footprint)
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Self:
        fp = doc.get("footprint")
        return cls(**_base(doc), footprint=footprint_from_json(fp) if fp else None)


@dataclass(frozen=True, slots=True)
class PreviewResult(JobResult):
    preview: PreviewOutcome | None = None

    def to_json(self) -> dict[str, Any]:
        doc = JobResult.to_json(self)
        if self.preview is not None:
            doc["preview"] = to_json(self.preview)
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Self:
        preview = doc.get("preview")
        return cls(**_base(doc), preview=preview_from_json(preview) if preview else None)


@dataclass(frozen=True, slots=True)
class Released:
    """A pull-request hold that a job ended."""

    project: str
    state: str
    serial: int | None
    run_id: str | None
    head_sha: str
    write_globs: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Released:
        return cls(doc["project"], doc["state"], doc.get("serial"), doc.get("run_id"), doc.get("head_sha", ""),
                   tuple(doc.get("write_globs", ())))

    def to_json(self) -> dict[str, Any]:
        return {"project": self.project, "state": self.state, "serial": self.serial, "run_id": self.run_id,
                "head_sha": self.head_sha, "write_globs": list(self.write_globs)}


@dataclass(frozen=True, slots=True)
class AppliedBefore:
    """The latest commit a comment apply of a pull request made on one project."""

    project: str
    serial: int | None
    state: str

    def to_json(self) -> dict[str, Any]:
        return {"project": self.project, "serial": self.serial, "state": self.state}


@dataclass(frozen=True, slots=True)
class ClosedResult(JobResult):
    released: tuple[Released, ...] = ()
    applied_before: tuple[AppliedBefore, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {**JobResult.to_json(self), "released": [r.to_json() for r in self.released],
                "applied_before": [a.to_json() for a in self.applied_before]}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Self:
        return cls(**_base(doc), released=tuple(Released.from_json(r) for r in doc.get("released", ())),
                   applied_before=tuple(AppliedBefore(a["project"], a.get("serial"), a.get("state", ""))
                                        for a in doc.get("applied_before", ())))


@dataclass(frozen=True, slots=True)
class FanOutResult(JobResult):
    """A merge or a push: the projects it enqueued an apply for (``children``), the ones it did not apply
    and why (``not_applied``), the commit the change is measured from; a push's footprint too."""

    base: str = ""
    before: str = ""
    children: tuple[str, ...] = ()
    not_applied: tuple[ApplyResult, ...] = ()
    config_errors: tuple[str, ...] = ()
    footprint: FootprintOutcome | None = None

    @property
    def has_config_errors(self) -> bool:
        return bool(self.config_errors)

    def to_json(self) -> dict[str, Any]:
        doc = JobResult.to_json(self)
        for key, value in (("base", self.base), ("before", self.before)):
            if value:
                doc[key] = value
        if self.children or self.not_applied or self.base:
            doc["children"] = list(self.children)
            doc["skipped"] = [to_json(r) for r in self.not_applied]  # the stored name of the not-applied list
        if self.config_errors:
            doc["config_errors"] = list(self.config_errors)
        if self.footprint is not None:
            doc["footprint"] = to_json(self.footprint)
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Self:
        skipped = doc.get("skipped")
        fp = doc.get("footprint")
        return cls(**_base(doc), base=doc.get("base", ""), before=doc.get("before", ""),
                   children=tuple(doc.get("children", ())),
                   not_applied=tuple(apply_from_json(s) for s in skipped) if isinstance(skipped, list) else (),
                   config_errors=tuple(doc.get("config_errors", ())),
                   footprint=footprint_from_json(fp) if fp else None)


@dataclass(frozen=True, slots=True)
class ApplyProjectResult(JobResult):
    apply: ApplyResult | None = None

    def to_json(self) -> dict[str, Any]:
        doc = JobResult.to_json(self)
        if self.apply is not None:
            doc["apply"] = to_json(self.apply)
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Self:
        applied = doc.get("apply")
        return cls(**_base(doc), apply=apply_from_json(applied) if applied else None)


@dataclass(frozen=True, slots=True)
class PrApply:
    """What a ``kilolock apply`` comment applied on the head, and whose comments show its new holds."""

    head_sha: str
    results: tuple[ApplyResult, ...]
    notify: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"head_sha": self.head_sha, "results": [to_json(r) for r in self.results],
                "notify": list(self.notify)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> PrApply:
        return cls(doc["head_sha"], tuple(apply_from_json(r) for r in doc.get("results", ())),
                   tuple(int(n) for n in doc.get("notify", ())))


@dataclass(frozen=True, slots=True)
class CommentResult(JobResult):
    """A comment command: the reply, the command word, and what ``apply``/``unlock`` did."""

    reply: str = ""
    command: str = ""
    pr_apply: PrApply | None = None
    released: tuple[Released, ...] = ()
    unmet: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        doc = {**JobResult.to_json(self), "reply": self.reply, "command": self.command}
        if self.pr_apply is not None:
            doc["pr_apply"] = self.pr_apply.to_json()
        if self.released:
            doc["released"] = [r.to_json() for r in self.released]
        if self.unmet:
            doc["unmet"] = list(self.unmet)
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Self:
        pr_apply = doc.get("pr_apply")
        return cls(**_base(doc), reply=str(doc.get("reply", "")), command=str(doc.get("command", "")),
                   pr_apply=PrApply.from_json(pr_apply) if pr_apply else None,
                   released=tuple(Released.from_json(r) for r in doc.get("released", ())),
                   unmet=tuple(doc.get("unmet", ())))


@dataclass(frozen=True, slots=True)
class ReadyCheck:
    """The ``kilolock/apply`` check a review leaves on the head: whether a comment apply may run now."""

    sha: str
    title: str
    summary: str


@dataclass(frozen=True, slots=True)
class ReviewResult(JobResult):
    ready_check: ReadyCheck | None = None

    def to_json(self) -> dict[str, Any]:
        doc = JobResult.to_json(self)
        if self.ready_check is not None:
            c = self.ready_check
            doc["ready_check"] = {"sha": c.sha, "title": c.title, "summary": c.summary}
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Self:
        c = doc.get("ready_check")
        return cls(**_base(doc), ready_check=ReadyCheck(c["sha"], c["title"], c["summary"]) if c else None)


@dataclass(frozen=True, slots=True)
class DriftResult(JobResult):
    """A scheduled drift check: the outcome ``runner.bot.drifttext`` renders (names only, never values)
    and the issue it keeps in sync."""

    drift: Mapping[str, Any] = field(default_factory=dict)
    issue_number: int | None = None

    def to_json(self) -> dict[str, Any]:
        doc = {**JobResult.to_json(self), "drift": dict(self.drift)}
        if self.issue_number is not None:
            doc["issue_number"] = self.issue_number
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Self:
        number = doc.get("issue_number")
        return cls(**_base(doc), drift=dict(doc.get("drift", {})), issue_number=int(number) if number else None)


RESULTS: dict[JobKind, type[JobResult]] = {
    JobKind.PULL_REQUEST: FootprintResult,
    JobKind.PLAN_PREVIEW: PreviewResult,
    JobKind.PULL_REQUEST_CLOSED: ClosedResult,
    JobKind.MERGE: FanOutResult,
    JobKind.PUSH: FanOutResult,
    JobKind.APPLY_PROJECT: ApplyProjectResult,
    JobKind.COMMENT: CommentResult,
    JobKind.PULL_REQUEST_REVIEW: ReviewResult,
    JobKind.DRIFT_CHECK: DriftResult,
}


def result_of(row: BotJob) -> JobResult:
    """The row's stored result, as the type of its kind."""
    return RESULTS.get(row.kind, JobResult).from_json(row.result)


def footprint_of(row: BotJob) -> FootprintOutcome | None:
    result = result_of(row)
    return result.footprint if isinstance(result, FootprintResult | FanOutResult) else None


def results_of(rows: Sequence[BotJob], kind: type[JobResult]) -> list[Any]:
    """The typed results of those rows whose result is of ``kind``."""
    return [r for r in (result_of(row) for row in rows) if isinstance(r, kind)]
