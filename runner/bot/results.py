"""What each kind of bot job stores in ``bot_jobs.result``: one frozen result type per kind, with its JSON form.

Every result may say why the job did nothing (``skipped``), why it crashed (``crashed``) and which other pull
requests' comments must re-render (``notify``); each kind adds its own outcome (``runner.bot.outcomes``).
The JSON is the one rows were always written in, so rows stored before read back unchanged.
:func:`result_of` reads a row into the type of its kind. Must not: render, post or compute anything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, Self

from app.domain.jobs import JobKind
from app.store.bot import BotJob
from runner.bot.outcomes import (
    ApplyResult,
    DriftOutcome,
    FootprintOutcome,
    PreviewOutcome,
    apply_from_json,
    drift_from_json,
    footprint_from_json,
    preview_from_json,
    to_json,
)

_META = "stored"


@dataclass(frozen=True, slots=True)
class _Stored:
    """How one result field is written to the row's JSON and read back from it."""

    dump: Callable[[Any], Any]
    load: Callable[[Any], Any]
    key: str  # the stored name, when it is not the field's
    always: bool  # written even when it holds its default


def _same(value: Any) -> Any:
    return value


_PLAIN = _Stored(_same, _same, "", False)


def _stored(default: Any = MISSING, *, default_factory: Any = MISSING, dump: Callable[[Any], Any] = _same,
           load: Callable[[Any], Any] = _same, key: str = "", always: bool = False) -> Any:
    """A result field: written under ``key`` (its name by default) unless it holds its default and is not
    ``always`` written; read back with ``load`` when the stored JSON has it, else its default."""
    return field(default=default, default_factory=default_factory,
                 metadata={_META: _Stored(dump, load, key, always)})


def _texts(**how: Any) -> Any:
    return _stored((), dump=list, load=tuple, **how)


def _outcome(load: Callable[[Any], Any]) -> Any:
    """An optional nested outcome, stored in its ``asdict`` form; an empty one reads back as None."""
    return _stored(None, dump=to_json, load=lambda doc: load(doc) if doc else None)


def _outcomes(load: Callable[[Any], Any], **how: Any) -> Any:
    """A tuple of nested outcomes, stored as a list; anything else stored there reads back as none."""
    return _stored((), dump=lambda items: [to_json(i) for i in items],
                  load=lambda docs: tuple(map(load, docs)) if isinstance(docs, list) else (), **how)


def _default(f: Field[Any]) -> Any:
    return f.default_factory() if f.default is MISSING and f.default_factory is not MISSING else f.default


def _how_stored(cls: type[Any]) -> list[tuple[Field[Any], _Stored]]:
    return [(f, f.metadata.get(_META, _PLAIN)) for f in fields(cls)]


@dataclass(frozen=True, slots=True)
class JobResult:
    """What any job may store: why it did nothing, why it crashed, whom to notify. Each kind's fields say
    how they are stored (:func:`_stored`); ``to_json``/``from_json`` read those declarations."""

    skipped: str | None = _stored(None, load=lambda v: v if isinstance(v, str) else None)
    crashed: str | None = None
    notify: tuple[int, ...] = _stored((), dump=sorted, load=lambda ns: tuple(int(n) for n in ns))

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {}
        for f, how in _how_stored(type(self)):
            value = getattr(self, f.name)
            if how.always or value != _default(f):
                doc[how.key or f.name] = how.dump(value)
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Self:
        return cls(**{f.name: how.load(doc[how.key or f.name])
                      for f, how in _how_stored(cls) if (how.key or f.name) in doc})


@dataclass(frozen=True, slots=True)
class FootprintResult(JobResult):
    footprint: FootprintOutcome | None = _outcome(footprint_from_json)


@dataclass(frozen=True, slots=True)
class PreviewResult(JobResult):
    preview: PreviewOutcome | None = _outcome(preview_from_json)


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


@dataclass(frozen=True, slots=True)
class AppliedBefore:
    """The latest commit a comment apply of a pull request made on one project."""

    project: str
    serial: int | None
    state: str

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> AppliedBefore:
        return cls(doc["project"], doc.get("serial"), doc.get("state", ""))


@dataclass(frozen=True, slots=True)
class ClosedResult(JobResult):
    released: tuple[Released, ...] = _outcomes(Released.from_json, always=True)
    applied_before: tuple[AppliedBefore, ...] = _outcomes(AppliedBefore.from_json, always=True)


@dataclass(frozen=True, slots=True)
class FanOutResult(JobResult):
    """A merge or a push: the projects it enqueued an apply for (``children``), the ones it did not apply
    and why (``not_applied``), the commit the change is measured from; a push's footprint too."""

    base: str = ""
    before: str = ""
    children: tuple[str, ...] = _texts()
    # stored as "skipped" (its name in rows written before), beside the string a skipped job keeps there
    not_applied: tuple[ApplyResult, ...] = _outcomes(apply_from_json, key="skipped")
    config_errors: tuple[str, ...] = _texts()
    footprint: FootprintOutcome | None = _outcome(footprint_from_json)

    @property
    def has_config_errors(self) -> bool:
        return bool(self.config_errors)

    def to_json(self) -> dict[str, Any]:
        doc = JobResult.to_json(self)
        if self.children or self.not_applied or self.base:  # a fan-out that ran keeps both lists, even empty
            doc["children"] = list(self.children)
            doc["skipped"] = [to_json(r) for r in self.not_applied]
        return doc


@dataclass(frozen=True, slots=True)
class ApplyProjectResult(JobResult):
    apply: ApplyResult | None = _outcome(apply_from_json)


@dataclass(frozen=True, slots=True)
class PrApply:
    """What a ``kilolock apply`` comment applied on the head, and whose comments show its new holds."""

    head_sha: str
    results: tuple[ApplyResult, ...]
    notify: tuple[int, ...] = ()

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> PrApply:
        return cls(doc["head_sha"], tuple(apply_from_json(r) for r in doc.get("results", ())),
                   tuple(int(n) for n in doc.get("notify", ())))


@dataclass(frozen=True, slots=True)
class CommentResult(JobResult):
    """A comment command: the reply, the command word, and what ``apply``/``unlock`` did."""

    reply: str = _stored("", load=str, always=True)
    command: str = _stored("", load=str, always=True)
    pr_apply: PrApply | None = _outcome(PrApply.from_json)
    released: tuple[Released, ...] = _outcomes(Released.from_json)
    unmet: tuple[str, ...] = _texts()


@dataclass(frozen=True, slots=True)
class ReadyCheck:
    """The ``kilolock/apply`` check a review leaves on the head: whether a comment apply may run now."""

    sha: str
    title: str
    summary: str


@dataclass(frozen=True, slots=True)
class ReviewResult(JobResult):
    ready_check: ReadyCheck | None = _outcome(lambda c: ReadyCheck(c["sha"], c["title"], c["summary"]))


@dataclass(frozen=True, slots=True)
class DriftResult(JobResult):
    """A scheduled drift check: the outcome ``runner.bot.drifttext`` renders (names only, never values)
    and the issue it keeps in sync."""

    drift: DriftOutcome | None = _stored(None, dump=lambda o: o.to_json() if o is not None else {},
                                         load=lambda doc: drift_from_json(doc) if doc else None, always=True)
    issue_number: int | None = _stored(None, load=lambda n: int(n) if n else None)


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
