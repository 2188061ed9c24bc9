"""kl-plan.json: what ``kl plan`` predicted and ``kl apply`` must reproduce.

Holds addresses, actions, hashes and non-sensitive variable values — never attribute values, and
never the value of a sensitive variable (only its hash, so ``kl apply`` can check it).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SPEC_VERSION = 1


# A plan file larger than this is not recognised as one by change detection (it then counts as a change).
_ARTIFACT_MAX_BYTES = 64 * 1024 * 1024


def is_plan_file(path: Path) -> bool:
    """Whether ``path`` is a plan file ``kl plan`` wrote: a JSON object carrying the ``kilolock_plan`` version
    marker (recognised by structure, whatever the file is called). Unreadable files are not."""
    try:
        if not path.is_file() or path.stat().st_size > _ARTIFACT_MAX_BYTES:
            return False
        with path.open("rb") as handle:
            if handle.read(1) != b"{":
                return False
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("kilolock_plan") == SPEC_VERSION and isinstance(doc.get("state"), str)


class SpecError(Exception):
    """The plan file is missing, unreadable or not a kl-plan.json."""


@dataclass(frozen=True, slots=True)
class PinnedVar:
    """One ``-var``/``-var-file``/``TF_VAR_`` input. ``value`` is None for sensitive variables."""

    kind: str  # "var" | "var-file" | "env"
    name: str  # variable name, or the var file's path
    sha256: str
    value: str | None = None


@dataclass(frozen=True, slots=True)
class PlanSpec:
    state: str
    address: str
    lineage: str | None
    base_serial: int | None
    terraform_version: str
    config_dir: str
    config_hash: str
    created_at: str
    write_set: tuple[str, ...]
    read_set: tuple[str, ...]
    write_globs: tuple[str, ...]
    read_globs: tuple[str, ...]
    actions: dict[str, str]
    described_resources: tuple[str, ...]
    orphans: tuple[str, ...]
    warnings: tuple[str, ...]
    variables: tuple[PinnedVar, ...] = ()
    targets: tuple[str, ...] = ()
    output_changes: dict[str, str] = field(default_factory=dict)
    # File-scoped plans (kl plan -f) only:
    mode: str = "full"                                    # "full" | "files"
    selected_files: tuple[str, ...] = ()
    files: dict[str, str] = field(default_factory=dict)   # every file the workspace was cut from -> sha256
    deleted_files: dict[str, str] = field(default_factory=dict)  # deleted at REF -> sha256 of the old text
    deleted_globs: tuple[str, ...] = ()                   # addresses the deleted files declared (destroyed)
    validation_globs: tuple[str, ...] = ()
    slice_globs: tuple[str, ...] = ()
    diagnostics: tuple[dict[str, Any], ...] = ()
    refresh: bool = False                                 # kl plan --refresh: the slice was refreshed
    seed_variables: tuple[str, ...] = ()                   # var.NAME whose values changed (--changed-from)
    removed_outputs: tuple[str, ...] = ()                  # root outputs whose blocks the change deleted

    @property
    def reservations(self) -> list[tuple[str, str]]:
        return [(g, "write") for g in self.write_globs] + [(g, "read") for g in self.read_globs]

    def to_json(self) -> str:
        doc: dict[str, Any] = {"kilolock_plan": SPEC_VERSION, **asdict(self)}
        doc["reservations"] = [{"glob": g, "mode": m} for g, m in self.reservations]
        return json.dumps(doc, indent=2, sort_keys=True) + "\n"

    @classmethod
    def load(cls, path: Path) -> PlanSpec:
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise SpecError(f"{path} does not exist: run kl plan first") from exc
        except ValueError as exc:
            raise SpecError(f"{path} is not JSON: it should be the file kl plan wrote") from exc
        if not isinstance(doc, dict) or doc.get("kilolock_plan") != SPEC_VERSION:
            raise SpecError(f"{path} is not a kl-plan.json (version {SPEC_VERSION}); re-run kl plan")
        doc.pop("kilolock_plan")
        doc.pop("reservations", None)
        try:
            doc["variables"] = tuple(PinnedVar(**v) for v in doc.get("variables", ()))
            for key in ("write_set", "read_set", "write_globs", "read_globs", "described_resources", "orphans",
                        "warnings", "targets", "selected_files", "deleted_globs", "validation_globs", "slice_globs",
                        "diagnostics", "seed_variables", "removed_outputs"):
                doc[key] = tuple(doc.get(key, ()))
            return cls(**doc)
        except TypeError as exc:
            raise SpecError(f"{path} is missing fields ({exc}); re-run kl plan") from exc
