"""The lifecycle delta: which live resource rows a new state version closes and opens."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from operator import attrgetter
from typing import TypeVar

from analyzer.state import InstanceRow

Key = tuple[str, str]  # (address, deposed)
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class OpenRow:
    """A live resource row as loaded from the store: its id and content hash."""

    id: int
    attributes_hash: str


@dataclass(frozen=True, slots=True)
class LifecycleDelta:
    close_ids: tuple[int, ...]
    inserts: tuple[InstanceRow, ...]

    @property
    def is_empty(self) -> bool:
        return not self.close_ids and not self.inserts


def changed_instances(
    known: Mapping[Key, V], instances: Iterable[InstanceRow], hash_of: Callable[[V], str] | None = None
) -> tuple[list[tuple[InstanceRow, V | None]], set[Key]]:
    """The instance objects that are new or changed next to ``known`` (keyed by (address, deposed)), in
    order, each with the known entry it replaces (None for a new one), and every key the instances have.
    An object changed when its content hash differs from the known one's (``hash_of`` of the entry; the
    entry itself when it is a hash)."""
    changed: list[tuple[InstanceRow, V | None]] = []
    seen: set[Key] = set()
    for row in instances:
        key = (row.address, row.deposed)
        seen.add(key)
        before = known.get(key)
        if before is None or (before if hash_of is None else hash_of(before)) != row.attributes_hash:
            changed.append((row, before))
    return changed, seen


def lifecycle_delta(open_rows: Mapping[Key, OpenRow], instances: Iterable[InstanceRow]) -> LifecycleDelta:
    """Compare the live rows, keyed by (address, deposed), with the instances of a new version.

    Unchanged instances keep their row; changed ones close the old row and open a new one;
    instances absent from the new version close; new ones open.
    """
    changed, seen = changed_instances(open_rows, instances, _HASH)
    close = [current.id for _, current in changed if current is not None]
    close.extend(r.id for key, r in open_rows.items() if key not in seen)
    return LifecycleDelta(close_ids=tuple(sorted(close)), inserts=tuple(row for row, _ in changed))


_HASH: Callable[[OpenRow], str] = attrgetter("attributes_hash")
