"""Drift report rules: validating a submitted report (bounded, names only) and folding a check of some
globs into a state's outstanding drift. Pure: no I/O, no clock."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from analyzer.addresses import AddressError, parse_instance_address
from analyzer.globs import Glob, GlobError, matches, parse_glob
from app.errors import BadRequestError

MAX_ENTRIES = 10_000
MAX_ATTRIBUTES = 200
MAX_GLOBS = 500
MAX_NAME = 200
MAX_CHECKED = 2**31 - 1  # the column is an integer
MAX_SERIAL = 2**63 - 1


class DriftSource(StrEnum):
    DRIFT = "drift"      # kl drift: a read-only check
    REFRESH = "refresh"  # kl refresh: the drift was committed to the trunk


class DriftVerdict(StrEnum):
    CLEAN = "clean"
    DRIFTED = "drifted"
    REFRESHED = "refreshed"


@dataclass(frozen=True, slots=True)
class DriftEntry:
    address: str
    attributes: tuple[str, ...]
    gone: bool

    def to_json(self) -> dict[str, Any]:
        return {"address": self.address, "attributes": list(self.attributes), "gone": self.gone}


@dataclass(frozen=True, slots=True)
class Submitted:
    """A validated report as a client sent it."""

    source: DriftSource
    globs: tuple[str, ...]
    checked: int
    drifted: tuple[DriftEntry, ...]
    serial: int | None
    run_id: str | None
    actor: str | None


def _attribute_name(value: object) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_NAME or not value.replace("_", "a").isalnum():
        raise BadRequestError("attributes must be top-level attribute names (letters, digits, underscores)")
    return value


def parse_entries(items: object) -> tuple[DriftEntry, ...]:
    """Drifted instances as sent: ``[{"address", "attributes": [names], "gone": bool}]``. Only names cross:
    anything that is not an attribute name is refused, so a buggy client cannot store a value."""
    if not isinstance(items, list) or len(items) > MAX_ENTRIES:
        raise BadRequestError(f"drifted must be a list of at most {MAX_ENTRIES} instances")
    found: dict[str, DriftEntry] = {}
    for item in items:
        if not isinstance(item, dict) or set(item) - {"address", "attributes", "gone"}:
            raise BadRequestError('each drifted instance is {"address": ..., "attributes": [...], "gone": bool}')
        address, attributes, gone = item.get("address"), item.get("attributes", []), item.get("gone", False)
        try:
            parsed = parse_instance_address(address if isinstance(address, str) else "")
        except AddressError as exc:
            raise BadRequestError(f"drifted address {address!r} is not an instance address: {exc}") from exc
        if parsed.mode != "managed":
            raise BadRequestError(f"{address}: data sources are never drift")
        if not isinstance(attributes, list) or len(attributes) > MAX_ATTRIBUTES or not isinstance(gone, bool):
            raise BadRequestError(f"{address}: attributes must be a list of names and gone a boolean")
        names = tuple(sorted({_attribute_name(a) for a in attributes}))
        found[str(parsed)] = DriftEntry(str(parsed), () if gone else names, gone)
    return tuple(found[a] for a in sorted(found))


def parse_globs_checked(items: object) -> tuple[str, ...]:
    if not isinstance(items, list) or not items or len(items) > MAX_GLOBS:
        raise BadRequestError(f"globs must list the 1 to {MAX_GLOBS} address globs the check covered")
    texts: list[str] = []
    for item in items:
        try:
            texts.append(str(parse_glob(item if isinstance(item, str) else "")))
        except GlobError as exc:
            raise BadRequestError(f"glob {item!r}: {exc}") from exc
    return tuple(sorted(set(texts)))


def parse_submitted(doc: dict[str, Any]) -> Submitted:
    try:
        source = DriftSource(str(doc.get("source", "drift")))
    except ValueError as exc:
        raise BadRequestError("source must be drift or refresh") from exc
    checked, serial, run_id = doc.get("checked", 0), doc.get("serial"), doc.get("run_id")
    if not isinstance(checked, int) or isinstance(checked, bool) or not 0 <= checked <= MAX_CHECKED:
        raise BadRequestError("checked must be the number of instances checked")
    if serial is not None and (not isinstance(serial, int) or isinstance(serial, bool)
                               or not 0 <= serial <= MAX_SERIAL):
        raise BadRequestError("serial must be the serial the check read")
    if run_id is not None and (not isinstance(run_id, str) or len(run_id) > 100):
        raise BadRequestError("run_id must be the id of the run that held the reservations")
    actor = doc.get("actor")
    if actor is not None and (not isinstance(actor, str) or not actor or len(actor) > 200):
        raise BadRequestError("actor must name who ran the check (at most 200 characters)")
    drifted = parse_entries(doc.get("drifted", []))
    if source is DriftSource.REFRESH and drifted:
        raise BadRequestError("a refresh report has no outstanding drift inside its globs: it committed it")
    return Submitted(source, parse_globs_checked(doc.get("globs")), checked, drifted, serial, run_id, actor)


def outcome(submitted: Submitted, refreshed_any: bool) -> DriftVerdict:
    if submitted.drifted:
        return DriftVerdict.DRIFTED
    return DriftVerdict.REFRESHED if refreshed_any else DriftVerdict.CLEAN


def outstanding(previous: Iterable[DriftEntry], globs: Sequence[str], found: Iterable[DriftEntry]) -> tuple[
        DriftEntry, ...]:
    """The state's known drift after a check of ``globs``: what the check found, plus earlier findings the
    check did not cover (they were not looked at again, so they still stand)."""
    parsed: list[Glob] = [parse_glob(g) for g in globs]
    kept = {e.address: e for e in previous if not any(matches(g, e.address) for g in parsed)}
    kept.update({e.address: e for e in found})
    return tuple(kept[a] for a in sorted(kept))


def entries_from_json(items: Iterable[dict[str, Any]]) -> tuple[DriftEntry, ...]:
    """Stored entries back into the domain type (the store wrote them, so they are trusted)."""
    return tuple(DriftEntry(str(i["address"]), tuple(i.get("attributes") or ()), bool(i.get("gone"))) for i in items)
