"""The lifecycle delta: which live resource rows a new state version closes and opens."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from analyzer.state import InstanceRow


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


def lifecycle_delta(
    open_rows: Mapping[tuple[str, str], OpenRow], instances: Iterable[InstanceRow]
) -> LifecycleDelta:
    """Compare the live rows, keyed by (address, deposed), with the instances of a new version.

    Unchanged instances keep their row; changed ones close the old row and open a new one;
    instances absent from the new version close; new ones open.
    """
    close: list[int] = []
    inserts: list[InstanceRow] = []
    seen: set[tuple[str, str]] = set()
    for row in instances:
        key = (row.address, row.deposed)
        seen.add(key)
        current = open_rows.get(key)
        if current is None:
            inserts.append(row)
        elif current.attributes_hash != row.attributes_hash:
            close.append(current.id)
            inserts.append(row)
    close.extend(r.id for key, r in open_rows.items() if key not in seen)
    return LifecycleDelta(close_ids=tuple(sorted(close)), inserts=tuple(inserts))
