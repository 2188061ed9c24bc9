"""The outcomes the bot's jobs store in ``bot_jobs.result``: frozen dataclasses with their JSON form.

Owns the shape of what a job computed (the predicted footprint per project, the plan preview, the apply
results, overlaps with other pull requests, a scheduled drift check) and its round trip through JSON.
Must not: render text (``runner.bot.render`` does), talk to GitHub, the database or the server. Outcomes hold addresses,
actions, globs, file names and error messages only — never attribute values or variable values — so
nothing sensitive can reach a comment.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from analyzer.globs import Mode
from analyzer.plan_drift import DriftedInstance
from app.wire import read, write


@dataclass(frozen=True, slots=True)
class LiveConflict:
    """A live reservation on the trunk that one of the predicted reservations conflicts with."""

    glob: str
    mode: Mode
    theirs: str
    their_mode: Mode
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
    # Per write glob, the owner groups it needs ("@acme/payments or @alice", "" when unowned), and the
    # groups no member of which had approved the head when the footprint was computed.
    owners: tuple[tuple[str, str], ...] = ()
    owners_missing: tuple[str, ...] = ()


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
    withheld: str | None = None  # why no Terraform ran for this head (untrusted code), and how to enable it

    @property
    def failed(self) -> bool:
        return bool(self.config_errors) or any(p.error for p in self.projects)


class ApplyStatus(StrEnum):
    """How one project's apply after a merge ended; a StrEnum, so stored results keep the same text."""

    COMMITTED = "committed"
    NO_CHANGES = "no_changes"
    FAILED = "failed"
    SKIPPED = "skipped"  # apply on merge is off
    OTHER_BRANCH = "other_branch"  # merged into a branch that is not applied
    PENDING = "pending"  # not finished yet
    APPLIED_BEFORE_MERGE = "applied_before_merge"  # a comment apply of the same files; not applied again


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """One project's apply after a merge (or a push to the default branch), ended as ``status`` says."""

    project: str
    state: str
    sha: str
    status: ApplyStatus
    serial: int | None = None
    run_id: str | None = None
    actions: tuple[tuple[str, str], ...] = ()
    error: str | None = None
    hint: str | None = None
    waited_seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.status == ApplyStatus.FAILED


@dataclass(frozen=True, slots=True)
class Overlap:
    """Another open pull request whose predicted footprint intersects this project's."""

    number: int
    globs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DriftTarget:
    """What a scheduled drift check read of its project at the branch head: the state, the project's
    directory as shown, the window length in seconds and whether an issue is kept in sync."""

    state: str
    dir: str
    every: int
    issue: bool


@dataclass(frozen=True, slots=True)
class DriftOutcome:
    """One project's scheduled drift check in one window (``runner.bot.drift_schedule``); addresses and attribute
    names only. ``target`` is None when the check stopped before it read the project's schedule;
    ``error`` says why a check could not run, ``skipped`` why it did not; ``run_id`` is set once it ran."""

    project: str
    sha: str
    branch: str
    window: int
    drifted: tuple[DriftedInstance, ...] = ()
    checked: int = 0
    serial: int = 0
    target: DriftTarget | None = None
    error: str | None = None
    skipped: str | None = None
    run_id: str | None = None

    @property
    def state(self) -> str:
        return self.target.state if self.target is not None else ""

    @property
    def shown_dir(self) -> str:
        return (self.target.dir if self.target is not None else "") or "."

    @property
    def keeps_issue(self) -> bool:
        return self.target is not None and self.target.issue

    def to_json(self) -> dict[str, Any]:
        """The JSON rows were always written in: the target's fields inline, absent ones left out."""
        doc: dict[str, Any] = {"project": self.project, "sha": self.sha, "branch": self.branch,
                               "window": self.window, "drifted": [_drifted_json(d) for d in self.drifted],
                               "checked": self.checked, "serial": self.serial}
        if self.target is not None:
            doc.update(asdict(self.target))
        for key, value in (("error", self.error), ("skipped", self.skipped), ("run_id", self.run_id)):
            if value is not None:
                doc[key] = value
        return doc


def compact_shared(globs: Sequence[str]) -> tuple[str, ...]:
    """The shared globs worth naming: a ``mine ∩ theirs`` pair is left out when both sides are shared as
    they are (``a.*`` and ``a``, each shared, need no ``a ∩ a.*``)."""
    exact = {g for g in globs if " ∩ " not in g}
    return tuple(g for g in globs if " ∩ " not in g or not set(g.split(" ∩ ")) <= exact)


def to_json(outcome: Any) -> dict[str, Any]:
    """An outcome as stored: its fields in order, through the serialisation layer (``app.wire``)."""
    doc: dict[str, Any] = write(outcome)
    return doc


def footprint_from_json(doc: Mapping[str, Any]) -> FootprintOutcome:
    return read(FootprintOutcome, doc)


def preview_from_json(doc: Mapping[str, Any]) -> PreviewOutcome:
    return read(PreviewOutcome, doc)


def apply_from_json(doc: Mapping[str, Any]) -> ApplyResult:
    return read(ApplyResult, doc)


def drift_from_json(doc: Mapping[str, Any]) -> DriftOutcome:
    """A stored drift outcome; rows written by older versions may lack any key."""
    target = (DriftTarget(str(doc["state"]), str(doc.get("dir", "")), int(doc.get("every", 0)),
                          bool(doc.get("issue"))) if "state" in doc else None)
    drifted = tuple(DriftedInstance(str(i.get("address", "")), tuple(str(a) for a in i.get("attributes", ())),
                                    bool(i.get("gone")), str(i.get("last_change") or ""))
                    for i in doc.get("drifted", ()))
    return DriftOutcome(str(doc.get("project", "")), str(doc.get("sha", "")), str(doc.get("branch", "")),
                        int(doc.get("window", 0)), drifted, int(doc.get("checked", 0)), int(doc.get("serial", 0)),
                        target, doc.get("error"), doc.get("skipped"), doc.get("run_id"))


def _drifted_json(d: DriftedInstance) -> dict[str, Any]:
    """A drifted instance as stored, with the last change the server named when there was one."""
    return {**d.to_json(), **({"last_change": d.last_change} if d.last_change else {})}
