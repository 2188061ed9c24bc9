"""What each kind of bot job stores in ``bot_jobs.result``: one frozen result type per kind, with its JSON form.

Every result may say why the job did nothing (``skipped``), why it crashed (``crashed``) and which other pull
requests' comments must re-render (``notify``); each kind adds its own outcome (``runner.bot.outcomes``).
The JSON is the one rows were always written in, so rows stored before read back unchanged; each field goes
through the serialisation layer (``app.wire``) by its type, and says where it is stored otherwise.
:func:`result_of` reads a row into the type of its kind. Must not: render, post or compute anything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, Self, get_type_hints

from app.domain.jobs import JobKind
from app.store.bot import BotJob
from app.wire import read_as, write
from runner.bot.outcomes import ApplyResult, DriftOutcome, FootprintOutcome, PreviewOutcome, drift_from_json

_META = "stored"


@dataclass(frozen=True, slots=True)
class _Stored:
    """How one result field is written to the row's JSON and read back from it: through the serialisation
    layer (``app.wire``, by the field's type) unless ``dump``/``load`` say otherwise."""

    dump: Callable[[Any], Any] | None
    load: Callable[[Any], Any] | None
    key: str  # the stored name, when it is not the field's
    always: bool  # written even when it holds its default
    empty_is_none: bool  # a stored empty value (``{}``, ``0``) reads back as None
    lists_only: bool  # anything but a list stored there reads back as ()


_PLAIN = _Stored(None, None, "", False, False, False)


def _stored(default: Any = MISSING, *, default_factory: Any = MISSING, dump: Callable[[Any], Any] | None = None,
            load: Callable[[Any], Any] | None = None, key: str = "", always: bool = False,
            empty_is_none: bool = False, lists_only: bool = False) -> Any:
    """A result field: written under ``key`` (its name by default) unless it holds its default and is not
    ``always`` written; read back when the stored JSON has it, else its default."""
    return field(default=default, default_factory=default_factory,
                 metadata={_META: _Stored(dump, load, key, always, empty_is_none, lists_only)})


def _outcome() -> Any:
    """An optional nested outcome; an empty one reads back as None."""
    return _stored(None, empty_is_none=True)


def _outcomes(**how: Any) -> Any:
    """A tuple of nested outcomes, stored as a list; anything else stored there reads back as none."""
    return _stored((), lists_only=True, **how)


def _default(f: Field[Any]) -> Any:
    return f.default_factory() if f.default is MISSING and f.default_factory is not MISSING else f.default


_HOW: dict[type[Any], tuple[tuple[Field[Any], _Stored, Any], ...]] = {}


def _how_stored(cls: type[Any]) -> tuple[tuple[Field[Any], _Stored, Any], ...]:
    """Each field of ``cls`` with how it is stored and its type, read once per class."""
    found = _HOW.get(cls)
    if found is None:
        hints = get_type_hints(cls)
        found = _HOW[cls] = tuple((f, f.metadata.get(_META, _PLAIN), hints[f.name]) for f in fields(cls))
    return found


def _dumped(how: _Stored, hint: Any, value: Any) -> Any:
    return how.dump(value) if how.dump is not None else write(value, hint)


def _loaded(how: _Stored, hint: Any, value: Any) -> Any:
    if how.load is not None:
        return how.load(value)
    if how.empty_is_none and not value:
        return None
    if how.lists_only and not isinstance(value, list):
        return ()
    return read_as(hint, value)


@dataclass(frozen=True, slots=True)
class JobResult:
    """What any job may store: why it did nothing, why it crashed, whom to notify. Each kind's fields say
    how they are stored (:func:`_stored`); ``to_json``/``from_json`` read those declarations."""

    # a fan-out keeps the projects it did not apply under "skipped" too: only a string is the reason
    skipped: str | None = _stored(None, load=lambda v: v if isinstance(v, str) else None)
    crashed: str | None = None
    notify: tuple[int, ...] = _stored((), dump=sorted)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {}
        for f, how, hint in _how_stored(type(self)):
            value = getattr(self, f.name)
            if how.always or value != _default(f):
                doc[how.key or f.name] = _dumped(how, hint, value)
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Self:
        return cls(**{f.name: _loaded(how, hint, doc[how.key or f.name])
                      for f, how, hint in _how_stored(cls) if (how.key or f.name) in doc})


@dataclass(frozen=True, slots=True)
class FootprintResult(JobResult):
    footprint: FootprintOutcome | None = _outcome()


@dataclass(frozen=True, slots=True)
class PreviewResult(JobResult):
    preview: PreviewOutcome | None = _outcome()


@dataclass(frozen=True, slots=True)
class Released:
    """A pull-request hold that a job ended."""

    project: str
    state: str
    serial: int | None = None
    run_id: str | None = None
    head_sha: str = ""
    write_globs: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AppliedBefore:
    """The latest commit a comment apply of a pull request made on one project."""

    project: str
    serial: int | None = None
    state: str = ""


@dataclass(frozen=True, slots=True)
class ClosedResult(JobResult):
    released: tuple[Released, ...] = _outcomes(always=True)
    applied_before: tuple[AppliedBefore, ...] = _outcomes(always=True)


@dataclass(frozen=True, slots=True)
class FanOutResult(JobResult):
    """A merge or a push: the projects it enqueued an apply for (``children``), the ones it did not apply
    and why (``not_applied``), the commit the change is measured from; a push's footprint too."""

    base: str = ""
    before: str = ""
    children: tuple[str, ...] = ()
    # stored as "skipped" (its name in rows written before), beside the string a skipped job keeps there
    not_applied: tuple[ApplyResult, ...] = _outcomes(key="skipped")
    config_errors: tuple[str, ...] = ()
    footprint: FootprintOutcome | None = _outcome()

    @property
    def has_config_errors(self) -> bool:
        return bool(self.config_errors)

    def to_json(self) -> dict[str, Any]:
        doc = JobResult.to_json(self)
        if self.children or self.not_applied or self.base:  # a fan-out that ran keeps both lists, even empty
            doc["children"] = list(self.children)
            doc["skipped"] = write(self.not_applied)
        return doc


@dataclass(frozen=True, slots=True)
class ApplyProjectResult(JobResult):
    apply: ApplyResult | None = _outcome()


@dataclass(frozen=True, slots=True)
class PrApply:
    """What a ``kilolock apply`` comment applied on the head, and whose comments show its new holds."""

    head_sha: str
    results: tuple[ApplyResult, ...] = ()
    notify: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class CommentResult(JobResult):
    """A comment command: the reply, the command word, and what ``apply``/``unlock`` did."""

    reply: str = _stored("", load=str, always=True)
    command: str = _stored("", load=str, always=True)
    pr_apply: PrApply | None = _outcome()
    released: tuple[Released, ...] = _outcomes()
    unmet: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ReadyCheck:
    """The ``kilolock/apply`` check a review leaves on the head: whether a comment apply may run now."""

    sha: str
    title: str
    summary: str


@dataclass(frozen=True, slots=True)
class ReviewResult(JobResult):
    ready_check: ReadyCheck | None = _outcome()


@dataclass(frozen=True, slots=True)
class DriftResult(JobResult):
    """A scheduled drift check: the outcome ``runner.bot.drifttext`` renders (names only, never values)
    and the issue it keeps in sync."""

    drift: DriftOutcome | None = _stored(None, dump=lambda o: o.to_json() if o is not None else {},
                                         load=lambda doc: drift_from_json(doc) if doc else None, always=True)
    issue_number: int | None = _stored(None, empty_is_none=True)


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
