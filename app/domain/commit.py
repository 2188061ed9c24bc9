"""Row-level commit rules: what a sliced apply changed, whether it stayed inside its write
reservations, whether its plan went stale, and how outputs merge into the trunk."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from analyzer.globs import Glob, matches, parse_glob
from analyzer.state import InstanceRow, OutputRow

Key = tuple[str, str]  # (address, deposed)


@dataclass(frozen=True, slots=True)
class CommitDelta:
    """What the apply changed relative to the trunk at its base serial."""

    upserts: tuple[InstanceRow, ...]      # created or changed instance objects
    deletes: tuple[Key, ...]              # instance objects the apply destroyed
    created: int
    updated: int

    @property
    def addresses(self) -> tuple[str, ...]:
        return tuple(sorted({r.address for r in self.upserts} | {address for address, _ in self.deletes}))

    @property
    def is_empty(self) -> bool:
        return not self.upserts and not self.deletes


def commit_delta(
    base: Mapping[Key, str], result: Iterable[InstanceRow], slice_addresses: Iterable[str],
    skip: Callable[[str], bool] | None = None,
) -> CommitDelta:
    """Compare the post-apply slice with the trunk rows (key → hash) of the same addresses at the
    base serial. Hashes are over canonical JSON, so Terraform re-serialising a no-op instance is
    no change. An instance object of a slice address that the result lacks was destroyed.
    Addresses for which ``skip`` is true are left out entirely."""
    if skip is not None:
        base = {k: v for k, v in base.items() if not skip(k[0])}
        result = [r for r in result if not skip(r.address)]
    upserts: list[InstanceRow] = []
    created = updated = 0
    seen: set[Key] = set()
    for row in result:
        key = (row.address, row.deposed)
        seen.add(key)
        before = base.get(key)
        if before is None:
            upserts.append(row)
            created += 1
        elif before != row.attributes_hash:
            upserts.append(row)
            updated += 1
    in_slice = set(slice_addresses) | {address for address, _ in seen}
    deletes = tuple(sorted(k for k in base if k not in seen and k[0] in in_slice))
    return CommitDelta(upserts=tuple(upserts), deletes=deletes, created=created, updated=updated)


def unreserved_read(write_globs: Sequence[Glob]) -> Callable[[str], bool]:
    """A predicate for data-source addresses no write reservation covers. Terraform re-reads data
    sources on every run and stores what it read: that is a read, not a write, so a commit keeps
    the trunk's copy of them instead of being refused."""
    def skip(address: str) -> bool:
        is_data = address.startswith("data.") or ".data." in address
        return is_data and not any(matches(g, address) for g in write_globs)

    return skip


def outside(addresses: Iterable[str], globs: Sequence[Glob]) -> list[str]:
    """The addresses no glob covers (a commit writing any of them is refused)."""
    return sorted(a for a in set(addresses) if not any(matches(g, a) for g in globs))


def stale(changed_since_base: Iterable[tuple[str, int]], globs: Sequence[Glob]) -> list[tuple[str, int]]:
    """Rows of reserved addresses that changed after the base serial: (address, serial)."""
    return sorted({(a, s) for a, s in changed_since_base if any(matches(g, a) for g in globs)})


def parse_globs(texts: Iterable[str]) -> list[Glob]:
    return [parse_glob(t) for t in texts]


def _same(a: OutputRow, b: OutputRow) -> bool:
    return (a.value_json, a.type_json, a.sensitive) == (b.value_json, b.type_json, b.sensitive)


def merge_outputs(
    head: Iterable[OutputRow], base: Iterable[OutputRow], result: Iterable[OutputRow], *, prune: bool = True
) -> tuple[OutputRow, ...]:
    """Keep the trunk's outputs; take from the apply only what it changed relative to its base
    (new or different values), and — when ``prune``, i.e. the workspace held the whole
    configuration — drop the outputs it no longer has. An output the apply did not touch keeps
    whatever value a concurrent commit gave it. A file-scoped workspace holds only some outputs, so
    it never prunes: its missing outputs are simply not its business."""
    merged = {o.name: o for o in head}
    before = {o.name: o for o in base}
    after = {o.name: o for o in result}
    for name, output in after.items():
        if name not in before or not _same(before[name], output):
            merged[name] = output
    for name in before if prune else ():
        if name not in after:
            merged.pop(name, None)
    return tuple(merged[n] for n in sorted(merged))
