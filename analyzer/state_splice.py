"""The next version's state file from an earlier one's bytes and the rows that changed in between.

``stream_state`` writes each resource's core and each instance item from that resource's or that
instance's rows alone, so a file assembled for an earlier serial already holds, byte for byte, the text
of every resource and instance whose rows did not change since. ``splice`` keeps that text and writes
only the header (the new version's serial, lineage, outputs) and what changed: the cores of new
resources, the items of new or changed instances; removed instances and emptied resources are left out.

The earlier file is found in, not parsed: a JSON string never holds a raw newline, so a line that starts
with exactly four spaces and ``{`` opens a resource, one with exactly six spaces and ``]`` closes its
instances array (the resource closes on the next line), one with exactly eight spaces and ``{`` (or ``}``)
opens (or closes) an instance, and nothing else does. Resources and instances are in ``row_order``, so a
changed one is found by bisecting the bytes, reading only the resource head (or the instance's first
lines, where its ``index_key`` and ``deposed`` are) at each probe, after trying the one where the search
starts; a changed resource's end is found by one scan for the close of its instances array. Any text
that is not where the layout puts it raises ``SpliceError``: the caller assembles from all rows instead.
The base must be a file ``stream_state`` wrote under the same ``ASSEMBLY_FORMAT``; a file Terraform
wrote is laid out by Terraform and is never a base. Must not do I/O.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from analyzer.state import InstanceRow
from analyzer.state_assembly import (
    CLOSE_TAIL,
    EMPTY_TAIL,
    RESOURCE_SEP,
    RESOURCES_OPEN,
    resource_core,
)

__all__ = ["InstanceOrder", "Part", "ResourceChange", "ResourceKey", "SpliceError", "instance_order", "pieces",
           "splice"]

ResourceKey = tuple[str, str, str, str]  # module, mode, type, name
InstanceOrder = tuple[int, int, str, str]  # row_order's instance part

_RESOURCE = b"\n    {"
_ITEM = b"\n        {"
_ITEM_END = b"\n        }"
_RESOURCE_CLOSE = RESOURCE_SEP[:-1]  # the end of a resource's instances array and of the resource
_INSTANCES = b'\n      "instances": ['
_FIELD = b'\n          "'
_INDEX_KEY = b'\n          "index_key": '
_STATUS = b'\n          "status": '
_DEPOSED = b'\n          "deposed": '
_HEAD_LIMIT = 1 << 16  # a resource head is its module, type, name and provider
_FIELD_LIMIT = 1 << 16  # an instance's index_key and deposed lines


class SpliceError(ValueError):
    """The base is not laid out as an assembled state: assemble from the rows instead."""


@dataclass(frozen=True, slots=True)
class ResourceChange:
    """One resource whose rows changed: the instance objects that changed (present in the base, in the
    new version, or in both) and the new version's rows among them, in ``row_order``."""

    changed: frozenset[InstanceOrder]
    rows: tuple[InstanceRow, ...]


def instance_order(index_key: Any, deposed: str) -> InstanceOrder:
    """``row_order``'s instance part for an index key and deposed key."""
    if index_key is None:
        return (0, 0, "", deposed)
    if isinstance(index_key, bool) or not isinstance(index_key, int | str):
        raise SpliceError(f"index key {index_key!r} is neither an integer nor a string")
    if isinstance(index_key, int):
        return (1, index_key, "", deposed)
    return (2, 0, index_key, deposed)


# A part of a spliced file: new text, or the base's bytes [start, end).
Part = bytes | tuple[int, int]


def splice(base: bytes | bytearray, header: bytes, changes: Mapping[ResourceKey, ResourceChange], *,
           plain_numbers: bool = False) -> list[Part]:
    """The new file as parts to write in order (ranges of ``base`` and new text), given the new version's
    ``header`` (``header_prefix``) and the changes by resource. Raises SpliceError when the base is not
    an assembled state's layout, ValueError as ``stream_state`` does for the new rows."""
    parts = _Splicer(base, plain_numbers).splice(header, changes)
    merged: list[Part] = []
    for part in parts:  # adjacent ranges of the base as one
        if isinstance(part, tuple) and merged and isinstance(merged[-1], tuple) and merged[-1][1] == part[0]:
            merged[-1] = (merged[-1][0], part[1])
        elif isinstance(part, bytes) and merged and isinstance(merged[-1], bytes) and len(merged[-1]) < 1 << 16:
            merged[-1] += part
        elif not isinstance(part, tuple) or part[1] > part[0]:
            merged.append(part)
    return merged


def pieces(base: bytes | bytearray, parts: Sequence[Part], piece_bytes: int = 1 << 20) -> Iterator[bytes]:
    """The file the parts make, in pieces of at most about ``piece_bytes``."""
    view = memoryview(base)
    pending = bytearray()
    for part in parts:
        data = view[part[0]:part[1]] if isinstance(part, tuple) else memoryview(part)
        for start in range(0, len(data), piece_bytes):
            pending += data[start:start + piece_bytes]
            if len(pending) >= piece_bytes:
                yield bytes(pending)
                pending.clear()
    if pending:
        yield bytes(pending)


class _Splicer:
    __slots__ = ("base", "plain_numbers", "view")

    def __init__(self, base: bytes | bytearray, plain_numbers: bool) -> None:
        self.base = base
        self.view = memoryview(base)
        self.plain_numbers = plain_numbers

    def splice(self, header: bytes, changes: Mapping[ResourceKey, ResourceChange]) -> list[Part]:
        base = self.base
        opened = base.find(RESOURCES_OPEN)
        if opened < 0:
            raise SpliceError("the base has no resources array")
        start = opened + len(RESOURCES_OPEN)
        if base.endswith(EMPTY_TAIL) and len(base) - len(EMPTY_TAIL) == start:
            end = start
        elif base.endswith(CLOSE_TAIL) and base.startswith(_RESOURCE, start):
            end = len(base) - len(CLOSE_TAIL)
        else:
            raise SpliceError("the base does not end as an assembled state does")
        cores: list[list[Part]] = []
        pos = start
        for key in sorted(changes):
            found = self._first(pos, end, _RESOURCE, self._head_key, key)
            self._run(cores, pos, found, end)
            change = changes[key]
            if found < end and self._head_key(found) == key:
                following = self._following(found, end)
                if following < end and self._head_key(following) <= key:
                    raise SpliceError("resources are not in order")
                core_end = following - len(RESOURCE_SEP) if following < end else end
                core = self._changed_core(found, core_end, change)
                pos = following
            else:
                core = [resource_core(change.rows, plain_numbers=self.plain_numbers)] if change.rows else None
                pos = found
            if core is not None:
                cores.append(core)
        self._run(cores, pos, end, end)
        parts: list[Part] = [header]
        for i, core in enumerate(cores):
            if i:
                parts.append(RESOURCE_SEP)
            parts.extend(core)
        parts.append(CLOSE_TAIL if cores else EMPTY_TAIL)
        return parts

    def _run(self, cores: list[list[Part]], pos: int, upto: int, end: int) -> None:
        """The unchanged resources from ``pos`` to the resource starting at ``upto`` as one part."""
        run_end = upto - len(RESOURCE_SEP) if upto < end else end
        if run_end > pos:
            if upto < end and self.base[run_end:upto] != RESOURCE_SEP:
                raise SpliceError("resources are not separated as an assembled state's are")
            cores.append([(pos, run_end)])

    def _changed_core(self, start: int, end: int, change: ResourceChange) -> list[Part] | None:
        """The parts of a changed resource's new core (its head and items kept from the base, new items
        encoded), or None when no instance is left."""
        base = self.base
        items_at = base.find(_INSTANCES, start, min(end, start + _HEAD_LIMIT))
        if items_at < 0:
            raise SpliceError("a resource head has no instances array")
        items_start = items_at + len(_INSTANCES)
        provider = self._head(start)["provider"]
        new: dict[InstanceOrder, InstanceRow] = {}
        for changed_row in change.rows:
            if changed_row.provider != provider:
                raise SpliceError("a changed instance's provider differs from its resource's")
            order = instance_order(changed_row.index_key, changed_row.deposed)
            if order in new or order not in change.changed:
                raise SpliceError(f"{changed_row.address}: not one row per changed instance object")
            new[order] = changed_row
        items: list[Part] = []
        pos = items_start
        for order in sorted(change.changed):
            found = self._first(pos, end, _ITEM, self._item_order, order)
            run_end = found - 1 if found < end else end
            if run_end > pos:
                if found < end and base[run_end:found] != b",":
                    raise SpliceError("instances are not separated as an assembled state's are")
                items.append((pos, run_end))
            pos = found
            if found < end and self._item_order(found) == order:
                closed = base.find(_ITEM_END, found, end)
                if closed < 0:
                    raise SpliceError("an instance does not close")
                item_end = closed + len(_ITEM_END)
                if item_end == end:
                    pos = end
                elif base[item_end:item_end + 1 + len(_ITEM)] == b"," + _ITEM:
                    pos = item_end + 1
                else:
                    raise SpliceError("an instance does not end where the next begins")
            row = new.get(order)
            if row is not None:
                items.append(self._item(row))
        if end > pos:
            items.append((pos, end))
        if not items:
            return None
        parts: list[Part] = [(start, items_start)]
        for i, item in enumerate(items):
            if i:
                parts.append(b",")
            parts.append(item)
        return parts

    def _item(self, row: InstanceRow) -> bytes:
        core = resource_core((row,), plain_numbers=self.plain_numbers)
        at = core.find(_INSTANCES)
        if at < 0:
            raise SpliceError("an encoded resource has no instances array")
        return core[at + len(_INSTANCES):]

    def _following(self, at: int, end: int) -> int:
        """Where the resource after the one starting at ``at`` starts, or ``end`` when it is the last: one
        scan to the end of its instances array, the only line of six spaces and ``]`` in it."""
        base = self.base
        closed = base.find(_RESOURCE_CLOSE, at, end + len(_RESOURCE_CLOSE))
        if closed == end:
            return end
        following = closed + len(RESOURCE_SEP)
        if closed < 0 or not base.startswith(RESOURCE_SEP, closed) or not base.startswith(_RESOURCE, following):
            raise SpliceError("a resource does not end where the next begins")
        return following

    def _first(self, lo: int, end: int, pattern: bytes, key_at: Callable[[int], Any], target: Any,
               strict: bool = False) -> int:
        """The first position in [lo, end) where ``pattern`` starts an element whose key is at least
        ``target`` (beyond it when ``strict``), or ``end``. The element starting at ``lo``, if any, is
        tried first (the next change is often the next element); then each probe scans only the
        interval left, so a search costs a few probes and at most the interval's length in scanning."""
        base = self.base
        if lo < end and base.startswith(pattern, lo):
            key = key_at(lo)
            if key > target or (not strict and key == target):
                return lo
            lo += 1
        found = end
        hi = end
        while lo < hi:
            mid = (lo + hi) // 2
            at = base.find(pattern, mid, min(len(base), hi + len(pattern) - 1))
            if at < 0 or at >= hi:
                hi = mid
                continue
            key = key_at(at)
            if key < target or (strict and key == target):
                lo = at + 1
            else:
                found = at
                hi = mid
        return found

    def _head(self, at: int) -> dict[str, Any]:
        base = self.base
        items_at = base.find(_INSTANCES, at, at + _HEAD_LIMIT)
        if items_at < 0 or base[items_at - 1:items_at] != b",":
            raise SpliceError("a resource head is not where the layout puts it")
        try:
            head = json.loads(bytes(self.view[at + len(_RESOURCE) - 1:items_at - 1]) + b"}")
        except ValueError as exc:
            raise SpliceError("a resource head does not parse") from exc
        if not isinstance(head, dict) or not all(isinstance(head.get(f), str)
                                                 for f in ("mode", "type", "name", "provider")):
            raise SpliceError("a resource head lacks its fields")
        return head

    def _head_key(self, at: int) -> ResourceKey:
        head = self._head(at)
        module = head.get("module", "")
        if not isinstance(module, str):
            raise SpliceError("a resource head's module is not a string")
        return (module, head["mode"], head["type"], head["name"])

    def _item_order(self, at: int) -> InstanceOrder:
        base = self.base
        pos = at + len(_ITEM)
        if base[pos:pos + len(_FIELD)] != _FIELD:
            raise SpliceError("an instance does not open as the layout says")
        index_key = None
        deposed = ""
        value, pos = self._field(pos, _INDEX_KEY)
        if pos >= 0:
            index_key = value
        else:
            pos = at + len(_ITEM)
        _, skipped = self._field(pos, _STATUS)
        if skipped >= 0:
            pos = skipped
        value, found = self._field(pos, _DEPOSED)
        if found >= 0:
            if not isinstance(value, str):
                raise SpliceError("an instance's deposed key is not a string")
            deposed = value
        return instance_order(index_key, deposed)

    def _field(self, pos: int, prefix: bytes) -> tuple[Any, int]:
        """The value of a one-line field at ``pos`` and where the next line starts; -1 when the line at
        ``pos`` is not that field."""
        base = self.base
        if base[pos:pos + len(prefix)] != prefix:
            return None, -1
        line_end = base.find(b"\n", pos + 1, pos + _FIELD_LIMIT)
        if line_end < 0:
            raise SpliceError("an instance field line does not end")
        text = bytes(self.view[pos + len(prefix):line_end])
        if text.endswith(b","):
            text = text[:-1]
        try:
            return json.loads(text), line_end
        except ValueError as exc:
            raise SpliceError("an instance field does not parse") from exc

