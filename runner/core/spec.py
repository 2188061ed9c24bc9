"""kl-plan.json: what ``kl plan`` predicted and ``kl apply`` must reproduce.

Holds addresses, actions, hashes and non-sensitive variable values — never attribute values, and
never the value of a sensitive variable (only its hash, so ``kl apply`` can check it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from analyzer.globs import Reservation, footprint_reservations
from app.wire import ReadError, read, write

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


class PinKind(StrEnum):
    """Where a pinned input came from."""

    VAR = "var"  # -var NAME=VALUE
    VAR_FILE = "var-file"  # -var-file PATH
    AUTO_VAR_FILE = "auto-var-file"  # terraform.tfvars, *.auto.tfvars…: loaded by Terraform itself
    ENV = "env"  # TF_VAR_NAME


class PlanMode(StrEnum):
    """What a plan covers: the whole configuration, or the files ``kl plan -f`` selected."""

    FULL = "full"
    FILES = "files"


# pydantic's configuration of the plan file's dataclasses: a field the plan file does not know is refused
# (a file from a newer kl). A plain dict, so importing this module does not import pydantic.
_STRICT_FIELDS = {"extra": "forbid"}


@dataclass(frozen=True, slots=True)
class PinnedVar:
    """One ``-var``/``-var-file``/``TF_VAR_`` input. ``value`` is None for sensitive variables."""

    __pydantic_config__ = _STRICT_FIELDS

    kind: PinKind
    name: str  # variable name, or the var file's path
    sha256: str
    value: str | None = None


@dataclass(frozen=True, slots=True)
class PlanSpec:
    __pydantic_config__ = _STRICT_FIELDS

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
    mode: PlanMode = PlanMode.FULL
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
    def reservations(self) -> tuple[Reservation, ...]:
        return footprint_reservations(self.write_globs, self.read_globs)

    def to_json(self) -> str:
        doc: dict[str, Any] = {"kilolock_plan": SPEC_VERSION, **write(self)}
        doc["reservations"] = [r.to_json() for r in self.reservations]
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
        doc.pop("reservations", None)  # derived from the globs
        try:
            return read(PlanSpec, doc)
        except ReadError as exc:
            raise SpecError(f"{path} is missing fields or has malformed ones ({exc.summary('the document')}); "
                            "re-run kl plan") from exc
