"""Row-level commit rules: what a sliced apply changed, whether it stayed inside its write
reservations, whether its plan went stale, and how outputs merge into the trunk.

Every rule reads parsed addresses (``analyzer.addresses``) and globs (``analyzer.globs``): a data
source is one whose parsed mode is ``data``, never an address that happens to contain ``.data.``.
Root outputs are reserved like instances, with ``output.NAME`` / ``output.*`` (and ``*``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from analyzer.addresses import AddressError, parse_instance_address
from analyzer.globs import Glob, matches_output, parse_glob
from analyzer.state import InstanceRow, OutputRow
from analyzer.values import same_json
from app.domain.globindex import GlobIndex
from app.domain.lifecycle import Key, changed_instances
from app.errors import BadRequestError


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
    changed, seen = changed_instances(base, result)
    created = sum(1 for _, before in changed if before is None)
    in_slice = set(slice_addresses) | {address for address, _ in seen}
    deletes = tuple(sorted(k for k in base if k not in seen and k[0] in in_slice))
    return CommitDelta(upserts=tuple(row for row, _ in changed), deletes=deletes, created=created,
                       updated=len(changed) - created)


class GlobCoverage:
    """Which instance addresses and root outputs a set of globs covers, through one ``GlobIndex``
    (a lookup per address, never a loop over every glob)."""

    def __init__(self, globs: Iterable[Glob]) -> None:
        self._index: GlobIndex[None] = GlobIndex((g, None) for g in globs)
        self._globs = tuple(g for g, _ in self._index.meeting(parse_glob("*")))

    def covers(self, address: str) -> bool:
        """Whether a glob covers the instance ``address``; raises AddressError for text that is not one."""
        try:
            exact = Glob.exact(parse_instance_address(address))
        except ValueError as exc:
            if isinstance(exc, AddressError):
                raise
            # A root resource of type "output" has no exact glob; only '*' covers it.
            return any(g.is_everything for g in self._globs)
        return self._index.any_meeting(exact)

    def covers_output(self, name: str) -> bool:
        return any(matches_output(g, name) for g, _ in self._index.meeting(Glob.all_outputs()))


def is_data_source(address: str) -> bool:
    """Whether ``address`` is a data source instance, by its parsed mode (``module.data.x.y`` and
    ``x.y["bucket.data.eu"]`` are managed resources)."""
    return parse_instance_address(address).mode == "data"


def unreserved_read(write_globs: Sequence[Glob]) -> Callable[[str], bool]:
    """A predicate for data-source addresses no write reservation covers. Terraform re-reads data
    sources on every run and stores what it read: that is a read, not a write, so a commit keeps
    the trunk's copy of them instead of being refused. Managed resources are never skipped: one
    outside the write reservations makes the commit fail (``outside``)."""
    coverage = GlobCoverage(write_globs)

    def skip(address: str) -> bool:
        return is_data_source(address) and not coverage.covers(address)

    return skip


def outside(addresses: Iterable[str], globs: Sequence[Glob]) -> list[str]:
    """The addresses no glob covers (a commit writing any of them is refused)."""
    coverage = GlobCoverage(globs)
    return sorted(a for a in set(addresses) if not coverage.covers(a))


def stale(changed_since_base: Iterable[tuple[str, int]], globs: Sequence[Glob]) -> list[tuple[str, int]]:
    """Rows of reserved addresses that changed after the base serial: (address, serial)."""
    coverage = GlobCoverage(globs)
    return sorted({(a, s) for a, s in changed_since_base if coverage.covers(a)})


def parse_globs(texts: Iterable[str]) -> list[Glob]:
    return [parse_glob(t) for t in texts]


def check_addresses(addresses: Iterable[str], what: str) -> list[str]:
    """Validate client-sent instance addresses; raise BadRequestError naming the first bad one."""
    checked: list[str] = []
    for address in addresses:
        try:
            parse_instance_address(address)
        except AddressError as exc:
            raise BadRequestError(f"{what}: {address[:200]!r} is not an instance address ({exc})") from exc
        checked.append(address)
    return checked


# Which base outputs an apply's state may remove by leaving them out: all (True: the workspace held the whole
# configuration), none (False), or these names (the outputs a partial workspace declares: one it declares but
# its state lacks evaluated to null, and Terraform keeps no null output).
Prune = bool | frozenset[str]


def _removed(before: Mapping[str, OutputRow], after: Mapping[str, OutputRow], prune: Prune) -> set[str]:
    gone = before.keys() - after.keys()
    if isinstance(prune, bool):
        return set(gone) if prune else set()
    return gone & prune


def changed_outputs(base: Iterable[OutputRow], result: Iterable[OutputRow], *, prune: Prune = True) -> list[str]:
    """Names of the root outputs the apply added, changed or removed (as ``prune`` allows) relative to
    its base: exactly the outputs ``merge_outputs`` takes from it, so exactly what it must reserve."""
    before = {o.name: o for o in base}
    after = {o.name: o for o in result}
    changed = {n for n, o in after.items() if n not in before or not same_output(before[n], o)}
    return sorted(changed | _removed(before, after, prune))


def outputs_outside(names: Iterable[str], write_globs: Sequence[Glob]) -> list[str]:
    """The output names no write glob covers (``output.NAME``, ``output.*`` or ``*``)."""
    coverage = GlobCoverage(write_globs)
    return sorted(n for n in set(names) if not coverage.covers_output(n))


def stale_outputs(base: Iterable[OutputRow], head: Iterable[OutputRow], globs: Sequence[Glob]) -> list[str]:
    """Names of reserved root outputs whose trunk value now differs from the one at the base serial
    (added, changed or removed since): the run planned against a value that is gone."""
    before = {o.name: o for o in base}
    now = {o.name: o for o in head}
    moved = [n for n in before.keys() | now.keys()
             if n not in before or n not in now or not same_output(before[n], now[n])]
    coverage = GlobCoverage(globs)
    return sorted(n for n in moved if coverage.covers_output(n))


def same_output(a: OutputRow | None, b: OutputRow | None) -> bool:
    """Whether two root outputs are the same (value, type and sensitivity), compared as JSON values and
    never as text: the trunk's come back from Postgres in jsonb's spelling, an apply's in Terraform's."""
    if a is None or b is None:
        return a is b
    return a.sensitive == b.sensitive and same_json(a.value_json, b.value_json) and same_json(a.type_json,
                                                                                               b.type_json)


def merge_outputs(
    head: Iterable[OutputRow], base: Iterable[OutputRow], result: Iterable[OutputRow], *, prune: Prune = True
) -> tuple[OutputRow, ...]:
    """Keep the trunk's outputs; take from the apply only what it changed relative to its base
    (new or different values), and drop the outputs it no longer has as ``prune`` allows: all of them
    when the workspace held the whole configuration, the named ones for a file-scoped workspace (the
    outputs it declares; the others are simply not its business). An output the apply did not touch
    keeps whatever value a concurrent commit gave it."""
    merged = {o.name: o for o in head}
    before = {o.name: o for o in base}
    after = {o.name: o for o in result}
    for name, output in after.items():
        if name not in before or not same_output(before[name], output):
            merged[name] = output
    for name in _removed(before, after, prune):
        merged.pop(name, None)
    return tuple(merged[n] for n in sorted(merged))
