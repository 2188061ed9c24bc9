"""The footprint's index of top-level block declarations, merged from small per-file indexes.

Owns which address each top-level block declares for the footprint (``classify``), the per-file index of a
prescanned text (``FileIndex``, kept in the parse cache under the text's content hash) and the whole
configuration's index (``DefinitionIndex``: address -> definitions, in file and position order).

A footprint looks up a handful of addresses, but the index must know every declaration so a duplicate is
never missed. ``FileIndex`` holds, per text, the address -> position table and the positions of the blocks
the footprint collects whatever they name (``locals``, ``terraform``, labelled ``provider``, ``moved``/
``removed``/``import``), so building the whole index is one dictionary merge per file; the headers are
stored packed (compressed JSON), decoded, and each file's definitions made, only for the files a footprint
visits. A ``FileIndex`` pickles as plain strings, bytes and numbers, so loading a parse cache of many files
unpickles no header objects.

Must not do I/O or import hcl2.
"""

from __future__ import annotations

import json
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar

from analyzer.addresses import declared_address
from analyzer.footprint_checks import NAMED, labels_valid
from analyzer.prescan import BlockHeader

__all__ = ["COLLECTED", "MIGRATIONS", "Declared", "DefinitionIndex", "FileIndex", "classify", "file_index"]

MIGRATIONS = frozenset({"moved", "removed", "import"})
COLLECTED = "collected"  # classify(): the footprint keeps every such block, whatever it names

D = TypeVar("D")
# How ``Declared`` packs a file's names: the addresses joined by a character no address holds (a header's
# labels never span lines), their positions as unsigned 32-bit integers.
_SEPARATOR = "\n"
_POSITIONS_TYPE = "I"
_POSITIONS_ITEMSIZE = array(_POSITIONS_TYPE).itemsize


def classify(type_: str, labels: tuple[str, ...]) -> str | None:
    """``COLLECTED`` for a block the footprint collects (locals, terraform, a labelled provider, a migration),
    the address a named block declares, or None for a block nothing looks up by name."""
    if type_ in ("locals", "terraform") or type_ in MIGRATIONS or (type_ == "provider" and labels):
        return COLLECTED
    if type_ in NAMED and len(labels) == NAMED[type_]:
        return declared_address(type_, labels)
    return None


class FileIndex:
    """One prescanned text as the footprint indexes it.

    ``complete`` is the prescan's; ``bad`` the positions (in the scan) of headers whose labels Terraform
    rejects; the *kept* headers are the others, in order. ``names`` maps each declared address to the
    position (among the kept headers) of its first declaration, ``repeats`` holds later declarations of an
    address in the same text, ``collected`` the positions of the blocks ``classify`` collects.
    """

    __slots__ = ("_headers", "_kept", "_packed", "bad", "collected", "complete", "names", "repeats")

    def __init__(self, complete: bool, bad: frozenset[int], names: Mapping[str, int],
                 repeats: tuple[tuple[str, int], ...], collected: tuple[int, ...], packed: bytes,
                 headers: tuple[BlockHeader, ...] | None = None) -> None:
        self.complete, self.bad, self.names, self.repeats, self.collected = complete, bad, names, repeats, collected
        self._packed, self._headers = packed, headers
        self._kept: list[BlockHeader] | None = None

    @property
    def headers(self) -> tuple[BlockHeader, ...]:
        """Every header the scan found, decoded on first use."""
        if self._headers is None:
            self._headers = tuple(BlockHeader(t, tuple(labels), line, start, end)
                                  for t, labels, line, start, end in json.loads(zlib.decompress(self._packed)))
        return self._headers

    def kept(self) -> list[BlockHeader]:
        """The headers whose labels are valid, in order (the positions of ``names`` and ``collected``)."""
        if self._kept is None:
            self._kept = [h for i, h in enumerate(self.headers) if i not in self.bad]
        return self._kept

    def __reduce__(self) -> tuple[Callable[..., FileIndex], tuple[Any, ...]]:
        return (FileIndex, (self.complete, self.bad, Declared.of(self.names), self.repeats, self.collected,
                            self._packed))


class Declared(Mapping[str, int]):
    """A file's ``names`` as it pickles: the addresses joined into one string and their positions as one array,
    so unpickling a cache of many files makes two objects per file, not two per declaration. Iterating it (what
    ``DefinitionIndex.expect`` and a merge do) splits the string afresh each time and keeps nothing: one pass needs
    the names once, and keeping them would hold every declared name of the configuration as a string of its own
    (half a million at 5,000 files) until the index goes. A lookup by address makes the dictionary, kept."""

    __slots__ = ("_addresses", "_count", "_map", "_positions")

    def __init__(self, addresses: str, positions: bytes) -> None:
        self._addresses, self._positions = addresses, positions
        self._count = len(positions) // _POSITIONS_ITEMSIZE
        self._map: dict[str, int] | None = None

    @staticmethod
    def of(names: Mapping[str, int]) -> Mapping[str, int]:
        """``names`` packed, or as it is when already packed or when an address holds the separator."""
        if isinstance(names, Declared) or any(_SEPARATOR in name for name in names):
            return names
        return Declared(_SEPARATOR.join(names), array(_POSITIONS_TYPE, names.values()).tobytes())

    def _addresses_list(self) -> list[str]:
        return self._addresses.split(_SEPARATOR) if self._count else []

    def _mapping(self) -> dict[str, int]:
        if self._map is None:
            positions = array(_POSITIONS_TYPE)
            positions.frombytes(self._positions)
            self._map = dict(zip(self._addresses_list(), positions, strict=True))
        return self._map

    def __getitem__(self, address: str) -> int:
        return self._mapping()[address]

    def __contains__(self, address: object) -> bool:
        return address in self._mapping()

    def __iter__(self) -> Iterator[str]:
        return iter(self._map if self._map is not None else self._addresses_list())

    def __len__(self) -> int:
        return self._count

    def __reduce__(self) -> tuple[Callable[..., Declared], tuple[Any, ...]]:
        return (Declared, (self._addresses, self._positions))


def file_index(headers: Sequence[BlockHeader], complete: bool) -> FileIndex:
    """The index of one prescanned text (its headers and whether the scan was complete)."""
    bad = frozenset(i for i, h in enumerate(headers) if not labels_valid(h.type, h.labels))
    names, repeats, collected = _placed(classify(h.type, h.labels) for i, h in enumerate(headers) if i not in bad)
    packed = zlib.compress(json.dumps([[h.type, h.labels, h.line, h.start_pos, h.end_pos] for h in headers],
                                      separators=(",", ":")).encode(), 1)
    return FileIndex(complete, bad, names, repeats, collected, packed, tuple(headers))


def _placed(kinds: Iterable[str | None]) -> tuple[dict[str, int], tuple[tuple[str, int], ...], tuple[int, ...]]:
    """Where each position's ``classify`` result goes: the name's first declaration (``names``), a repeat of
    it (``repeats``), or a block the footprint keeps whatever it names (``collected``)."""
    names: dict[str, int] = {}
    repeats: list[tuple[str, int]] = []
    collected: list[int] = []
    for position, kind in enumerate(kinds):
        if kind == COLLECTED:
            collected.append(position)
        elif kind is not None and kind in names:
            repeats.append((kind, position))
        elif kind is not None:
            names[kind] = position
    return names, tuple(repeats), tuple(collected)


class DefinitionIndex(Generic[D]):
    """Address -> definitions over the files added, in the order the files were added and then by position.

    A file's definitions are made (``make(path, header)``) only when a lookup or ``defs`` reaches them.
    """

    def __init__(self, make: Callable[[str, BlockHeader], D]) -> None:
        self._make = make
        # address -> the files declaring it, in the order added: merged from the per-file tables only once the
        # lookups have cost as much as the merge would (a few lookups over many files probe each file's table)
        self._merged: dict[str, list[str]] | None = None
        self._probes = 0       # file tables probed by lookups so far
        # address -> the files declaring it, for the addresses ``expect`` looked up in one pass over the tables
        self._found: dict[str, list[str]] = {}
        self._declared = 0     # declarations in the file tables (what a merge costs)
        self._names: dict[str, tuple[Mapping[str, int], tuple[tuple[str, int], ...]]] = {}
        self._defs: dict[str, list[D | None]] = {}
        self._lazy: dict[str, FileIndex] = {}

    def add_defs(self, path: str, definitions: Iterable[tuple[D, str | None]]) -> list[tuple[int, D]]:
        """Add a file whose definitions are made already, each with its ``classify`` result; the collected
        ones (position, definition)."""
        made = list(definitions)
        names, repeats, collected = _placed(kind for _, kind in made)
        self._defs[path] = [definition for definition, _ in made]
        self._merge(path, names, repeats)
        return [(position, made[position][0]) for position in collected]

    def add_index(self, path: str, index: FileIndex) -> list[tuple[BlockHeader, D]]:
        """Add a prescanned file by its index; its collected definitions (made now) with their headers."""
        self._lazy[path] = index
        self._merge(path, index.names, index.repeats)
        if not index.collected:
            return []
        kept = index.kept()
        return [(kept[p], self._at(path, p)) for p in index.collected]

    def _merge(self, path: str, names: Mapping[str, int], repeats: tuple[tuple[str, int], ...]) -> None:
        self._names[path] = (names, repeats)
        self._declared += len(names)
        if self._found:
            for address in self._found.keys() & names.keys():
                self._found[address].append(path)
        if self._merged is not None:
            for address in names:
                self._merged.setdefault(address, []).append(path)

    def expect(self, addresses: Iterable[str]) -> None:
        """Look up ``addresses`` (the ones a footprint is about to ask for) in one pass over the file tables:
        each table is intersected with all of them at once, so a lookup of one of them probes no table."""
        if self._merged is not None:
            return
        wanted = {a for a in addresses if a not in self._found}
        if not wanted:
            return
        found: dict[str, list[str]] = {a: [] for a in wanted}
        for path, (names, _) in self._names.items():
            if not wanted.isdisjoint(names):
                for address in wanted.intersection(names):
                    found[address].append(path)
        self._found.update(found)

    def _files_of(self, address: str) -> list[str]:
        """The files declaring ``address``, in the order they were added."""
        if self._merged is None and address in self._found:
            return self._found[address]
        if self._merged is None and self._probes + len(self._names) > 2 * self._declared:
            merged: dict[str, list[str]] = {}
            for path, (names, _) in self._names.items():
                for name in names:
                    merged.setdefault(name, []).append(path)
            self._merged = merged
        if self._merged is not None:
            return self._merged.get(address, [])
        self._probes += len(self._names)
        return [path for path, (names, _) in self._names.items() if address in names]

    def _at(self, path: str, position: int) -> D:
        defs = self._defs.get(path)
        if defs is None:
            defs = self._defs[path] = [None] * len(self._lazy[path].kept())
        found = defs[position]
        if found is None:
            found = defs[position] = self._make(path, self._lazy[path].kept()[position])
        return found

    def defs(self, path: str) -> list[D]:
        """Every definition of one file (of its kept headers), in position order; empty for a file not added."""
        if path not in self._names:
            return []
        if path in self._lazy:
            return [self._at(path, p) for p in range(len(self._lazy[path].kept()))]
        return [d for d in self._defs[path] if d is not None]

    def get(self, address: str) -> list[D]:
        """The definitions of ``address`` (more than one: it is declared more than once)."""
        out: list[D] = []
        for path in self._files_of(address):
            names, repeats = self._names[path]
            out.append(self._at(path, names[address]))
            out.extend(self._at(path, p) for a, p in repeats if a == address)
        return out
