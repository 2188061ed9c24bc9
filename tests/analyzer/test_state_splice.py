"""A state spliced from an earlier assembly and the changed rows is byte for byte the state assembled
from all rows, along seeded random walks of every kind of change; a base not laid out by the assembly is
refused, never spliced."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from analyzer.state import InstanceRow, ParsedState, parse_state
from analyzer.state_assembly import header_prefix, row_order, stream_state
from analyzer.state_splice import ResourceChange, SpliceError, instance_order, pieces, splice
from bench.states import PROVIDER
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


@pytest.mark.parametrize("seed", range(4))
def test_changes_deep_inside_large_resources_splice_exactly(seed: int) -> None:
    rng = random.Random(seed)
    walk = RandomStates(seed)
    walk.resources = {}
    count = walk.resources[("", "managed", "terraform_data", "many")] = {
        "provider": PROVIDER, "keys": "count", "objects": {(i, ""): walk._attrs() for i in range(0, 3000, 2)}}
    each = walk.resources[('module.m["<&>"]', "managed", "terraform_data", "each")] = {
        "provider": PROVIDER, "keys": "each", "objects": {(f"k{i:04}é", ""): walk._attrs() for i in range(400)}}
    walk.resources[("", "data", "terraform_data", "lone")] = {"provider": PROVIDER, "keys": "none",
                                                              "objects": {(None, ""): walk._attrs()}}
    before = _parsed(walk.doc())
    base = _assembled(before)
    for _ in range(3):
        for _ in range(rng.randrange(1, 40)):
            target = rng.choice([count, each])
            objects = target["objects"]
            key = rng.choice(sorted(objects, key=repr))
            action = rng.random()
            if action < 0.4:
                objects[key] = walk._attrs()
            elif action < 0.6 and len(objects) > 1:
                del objects[key]
            elif action < 0.8:
                objects[(key[0], f"{rng.randrange(16**8):08x}")] = walk._attrs()
            elif target is count:
                objects[(rng.randrange(3000), "")] = walk._attrs()  # odd keys land between even ones
            else:
                objects[(f"k{rng.randrange(400):04}a", "")] = walk._attrs()
        after = _parsed(walk.doc())
        expected = _assembled(after)
        assert _spliced(base, after, _changes(before, after)) == expected
        before, base = after, expected


def _two_resources(changed: str = "alpha") -> tuple[ParsedState, ParsedState, bytes]:
    walk = RandomStates(7)
    walk.resources = {}
    for name in ("alpha", "beta"):
        walk.resources[("", "managed", "terraform_data", name)] = {
            "provider": PROVIDER, "keys": "count", "objects": {(i, ""): walk._attrs() for i in range(40)}}
    before = _parsed(walk.doc())
    objects = walk.resources[("", "managed", "terraform_data", changed)]["objects"]
    objects[(3, "")] = walk._attrs()
    return before, _parsed(walk.doc()), _assembled(before)


def test_a_changed_resource_ends_where_the_next_begins_or_is_refused() -> None:
    before, after, base = _two_resources()
    changes = _changes(before, after)
    assert list(changes) == [("", "managed", "terraform_data", "alpha")]
    assert _spliced(base, after, changes) == _assembled(after)
    between = b"\n      ]\n    },\n    {"
    assert base.count(between) == 1
    for mangled in (base.replace(between, b"\n      ]\n    } ,\n    {"),  # the separator moved
                    base.replace(between, b"\n      ]\n    },\n     {")):  # the next resource is not there
        with pytest.raises(SpliceError):
            _spliced(mangled, after, changes)


def test_a_changed_resource_followed_by_one_that_sorts_before_it_is_refused() -> None:
    before, after, base = _two_resources("beta")
    # The two resources swapped: each is where the layout puts it, but the one after beta sorts before it.
    opened = base.index(b'\n  "resources": [') + len(b'\n  "resources": [')
    closed = len(base) - len(b'\n      ]\n    }\n  ],\n  "check_results": null\n}\n')
    alpha, beta = base[opened:closed].split(b"\n      ]\n    },")
    swapped = base[:opened] + beta + b"\n      ]\n    }," + alpha + base[closed:]
    with pytest.raises(SpliceError):
        _spliced(swapped, after, _changes(before, after))
