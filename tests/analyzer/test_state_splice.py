"""A state spliced from an earlier assembly and the changed rows is byte for byte the state assembled
from all rows, along seeded random walks of every kind of change; a base not laid out by the assembly is
refused, never spliced."""

from __future__ import annotations

import json
from typing import Any

import pytest

from analyzer.state import InstanceRow, ParsedState, parse_state
from analyzer.state_assembly import header_prefix, row_order, stream_state
from analyzer.state_splice import ResourceChange, SpliceError, instance_order, pieces, splice
from tests.random_states import RandomStates

Key = tuple[str, str, str, str]


def _parsed(doc: dict[str, Any]) -> ParsedState:
    parsed = parse_state(json.dumps(doc).encode())
    assert isinstance(parsed, ParsedState)
    return parsed


def _assembled(parsed: ParsedState) -> bytes:
    return b"".join(stream_state(serial=parsed.serial, lineage=parsed.lineage,
                                 terraform_version=parsed.terraform_version,
                                 instances=sorted(parsed.instances, key=row_order), outputs=parsed.outputs))


def _by_object(parsed: ParsedState) -> dict[tuple[Key, Any], InstanceRow]:
    return {((r.module, r.mode, r.type, r.name), instance_order(r.index_key, r.deposed)): r for r in parsed.instances}


def _changes(before: ParsedState, after: ParsedState) -> dict[Key, ResourceChange]:
    old, new = _by_object(before), _by_object(after)
    changed: dict[Key, set[Any]] = {}
    for obj in old.keys() | new.keys():
        a, b = old.get(obj), new.get(obj)
        if a is None or b is None or (a.instance_json, a.provider) != (b.instance_json, b.provider):
            changed.setdefault(obj[0], set()).add(obj[1])
    return {key: ResourceChange(frozenset(orders), tuple(sorted(
        (r for (k, o), r in new.items() if k == key and o in orders), key=row_order)))
        for key, orders in changed.items()}


def _spliced(base: bytes, parsed: ParsedState, changes: dict[Key, ResourceChange]) -> bytes:
    header = header_prefix(serial=parsed.serial, lineage=parsed.lineage,
                           terraform_version=parsed.terraform_version, outputs=parsed.outputs)
    buffer = bytearray(base)
    return b"".join(pieces(buffer, splice(buffer, header, changes), piece_bytes=97))


@pytest.mark.parametrize("seed", range(12))
def test_every_step_of_a_random_walk_splices_to_the_assembled_bytes(seed: int) -> None:
    walk = RandomStates(seed)
    before = _parsed(walk.doc())
    base = _assembled(before)
    spliced = refused = 0
    for _ in range(12):
        walk.step()
        after = _parsed(walk.doc())
        expected = _assembled(after)
        try:
            got = _spliced(base, after, _changes(before, after))
        except SpliceError:
            refused += 1  # a resource whose provider changed: the caller assembles from the rows
        else:
            assert got == expected
            spliced += 1
        before, base = after, expected
    assert spliced >= 6, (spliced, refused)


def test_no_change_and_an_emptied_state_splice_exactly() -> None:
    walk = RandomStates(99)
    parsed = _parsed(walk.doc())
    base = _assembled(parsed)
    assert _spliced(base, parsed, {}) == base
    empty = _parsed({**walk.doc(), "resources": []})
    assert _spliced(base, empty, _changes(parsed, empty)) == _assembled(empty)
    assert _spliced(_assembled(empty), parsed, _changes(empty, parsed)) == base


@pytest.mark.parametrize("mangle", [
    lambda b: b.replace(b'"resources": [', b'"resources":['),
    lambda b: b[:-3],
    lambda b: json.dumps(json.loads(b)).encode(),
    lambda b: b.replace(b'\n      "instances": [', b'\n      "instances":[', 1),
])
def test_a_base_not_laid_out_by_the_assembly_is_refused(mangle: Any) -> None:
    walk = RandomStates(5)
    before = _parsed(walk.doc())
    base = _assembled(before)
    for _ in range(3):
        walk.step()
    after = _parsed(walk.doc())
    changes = _changes(before, after)
    with pytest.raises(SpliceError):
        for key in list(changes):  # every changed resource probes the base
            _spliced(mangle(base), after, {key: changes[key]})
        _spliced(mangle(base), after, changes)
