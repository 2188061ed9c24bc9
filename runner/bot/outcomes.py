"""The outcomes the bot's jobs store in ``bot_jobs.result``: frozen dataclasses with their JSON form.

Owns the shape of what a job computed (the predicted footprint per project, the plan preview, the apply
results, overlaps with other pull requests) and its round trip through JSON. Must not: render text
(``runner.bot.render`` does), talk to GitHub, the database or the server. Outcomes hold addresses,
actions, globs, file names and error messages only — never attribute values or variable values — so
nothing sensitive can reach a comment.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class LiveConflict:
    """A live reservation on the trunk that one of the predicted reservations conflicts with."""

    glob: str
    mode: str
    theirs: str
    their_mode: str
    holder: str
    run_id: str | None = None


@dataclass(frozen=True, slots=True)
class ProjectFootprint:
    """The predicted footprint of one project: ``changed`` are the repository paths that triggered it,
    ``files`` the configuration files selected (after widening), ``error`` why it cannot be scoped."""

    name: str
    dir: str
    state: str
    changed: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    write_globs: tuple[str, ...] = ()
    read_globs: tuple[str, ...] = ()
    diagnostics: tuple[str, ...] = ()
    conflicts: tuple[LiveConflict, ...] = ()
    error: str | None = None


@dataclass(frozen=True, slots=True)
class FootprintOutcome:
    head_sha: str
    base_sha: str = ""
    projects: tuple[ProjectFootprint, ...] = ()
    config_errors: tuple[str, ...] = ()
    config_source: str = ""
    skipped: str | None = None  # a late delivery: the PR's head moved on

    @property
    def failed(self) -> bool:
        return bool(self.config_errors) or any(p.error for p in self.projects)


@dataclass(frozen=True, slots=True)
class ProjectPreview:
    name: str
    state: str
    base_serial: int | None = None
    actions: tuple[tuple[str, str], ...] = ()  # (address, action), sorted by address
    output_changes: tuple[tuple[str, str], ...] = ()
    warnings: tuple[str, ...] = ()
    error: str | None = None


@dataclass(frozen=True, slots=True)
class PreviewOutcome:
    head_sha: str
    projects: tuple[ProjectPreview, ...] = ()
    config_errors: tuple[str, ...] = ()
    skipped: str | None = None

    @property
    def failed(self) -> bool:
        return bool(self.config_errors) or any(p.error for p in self.projects)


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """One project's apply after a merge (or a push to the default branch). ``status`` is ``committed``,
    ``no_changes``, ``failed``, ``skipped`` (apply on merge is off), ``pending`` (not finished yet) or
    ``applied_before_merge`` (a comment apply of the same files; not applied again)."""

    project: str
    state: str
    sha: str
    status: str
    serial: int | None = None
    run_id: str | None = None
    actions: tuple[tuple[str, str], ...] = ()
    error: str | None = None
    hint: str | None = None
    waited_seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.status == "failed"


@dataclass(frozen=True, slots=True)
class Overlap:
    """Another open pull request whose predicted footprint intersects this project's."""

    number: int
    globs: tuple[str, ...]


def compact_shared(globs: Sequence[str]) -> tuple[str, ...]:
    """The shared globs worth naming: a ``mine ∩ theirs`` pair is left out when both sides are shared as
    they are (``a.*`` and ``a``, each shared, need no ``a ∩ a.*``)."""
    exact = {g for g in globs if " ∩ " not in g}
    return tuple(g for g in globs if " ∩ " not in g or not set(g.split(" ∩ ")) <= exact)


def to_json(outcome: Any) -> dict[str, Any]:
    doc: dict[str, Any] = asdict(outcome)
    return doc


def footprint_from_json(doc: Mapping[str, Any]) -> FootprintOutcome:
    projects = tuple(
        ProjectFootprint(**{**p, **{k: tuple(p.get(k, ())) for k in ("changed", "files", "write_globs",
                                                                       "read_globs", "diagnostics")},
                            "conflicts": tuple(LiveConflict(**c) for c in p.get("conflicts", ()))})
        for p in doc.get("projects", ()))
    return FootprintOutcome(head_sha=doc["head_sha"], base_sha=doc.get("base_sha", ""), projects=projects,
                            config_errors=tuple(doc.get("config_errors", ())),
                            config_source=doc.get("config_source", ""), skipped=doc.get("skipped"))


def preview_from_json(doc: Mapping[str, Any]) -> PreviewOutcome:
    projects = tuple(
        ProjectPreview(**{**p, "actions": _pairs(p.get("actions", ())),
                          "output_changes": _pairs(p.get("output_changes", ())),
                          "warnings": tuple(p.get("warnings", ()))})
        for p in doc.get("projects", ()))
    return PreviewOutcome(head_sha=doc["head_sha"], projects=projects,
                          config_errors=tuple(doc.get("config_errors", ())), skipped=doc.get("skipped"))


def apply_from_json(doc: Mapping[str, Any]) -> ApplyResult:
    return ApplyResult(**{**doc, "actions": _pairs(doc.get("actions", ()))})


def _pairs(items: Iterable[Sequence[str]]) -> tuple[tuple[str, str], ...]:
    return tuple((str(a), str(b)) for a, b in items)
