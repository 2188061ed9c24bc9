"""The accelerated parse (orjson writing the canonical dumps) against the pure-json one.

``attributes_hash`` is stored and compared across versions, so the two paths must give the same rows
for every body, byte for byte: these tests generate arbitrary JSON values, put them in states, and parse
each body both ways. They also pin where orjson's text differs from json's (tiny floats) and that those
values take the json path.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from analyzer import state
from analyzer.state import ParsedState, StateFormatError, parse_state

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "states"

_SPECIAL_TEXT = ["<", ">", "&", "\u2028", "\u2029", "\x00", "\x1f", "\x7f", '"', "\\", "/", "\t", "\n", "é",
                 "\u00ff", "\uffff", "\U0001f600", "\U0010ffff"]
_SPECIAL_FLOATS = [0.0, -0.0, 1e-4, 9.999999999999999e-05, 1e-5, 2.5e-05, 1e-7, 1.2345e-9, 1e-10, 5e-324,
                   2.2250738585072014e-308, 0.1, 1.0, 1e15, 1e16, 1.2345678901234568e17, 1e22, 1.5e300,
                   1.7976931348623157e308]
_SPECIAL_INTS = [0, -1, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**30, -(10**40)]

# Number-like text ("1e-5", "0.00001") inside strings must not be mistaken for numbers by either path.
_text = st.text(st.sampled_from(_SPECIAL_TEXT) | st.characters(exclude_categories=("Cs",)), max_size=12) | \
    st.sampled_from(["1e-5", "0.00001", "e-7", "12345678901234567890"])
_floats = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(_SPECIAL_FLOATS)
_ints = st.integers() | st.integers(min_value=-(2**70), max_value=2**70) | st.sampled_from(_SPECIAL_INTS)
_scalars = st.none() | st.booleans() | _ints | _floats | _text
json_values = st.recursive(
    _scalars,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(_text, children, max_size=5),
    max_leaves=30,
)


def _floats_in(value: Any) -> list[float]:
    if isinstance(value, float):
        return [value]
    if isinstance(value, list):
        return [f for item in value for f in _floats_in(item)]
    if isinstance(value, dict):
        return [f for item in value.values() for f in _floats_in(item)]
    return []


def _float_check_passes(value: Any) -> bool:
    """What ``_load`` concludes about a body holding ``value``."""
    check = state._FloatCheck()
    json.loads(json.dumps(value), parse_float=check)
    return check.orjson_safe


def _both_ways(raw: bytes) -> tuple[object, object]:
    """Each path's rows, or the error it raised (as type and message)."""
    results = []
    for accelerated in (True, False):
        try:
            results.append(state._parse_state(raw, accelerated=accelerated))
        except StateFormatError as exc:
            results.append((type(exc), str(exc)))
    return results[0], results[1]


def _body(value: Any, *, ensure_ascii: bool = True, indent: int | None = 2) -> bytes:
    doc = {
        "version": 4, "terraform_version": "1.15.5", "serial": 3, "lineage": "l",
        "outputs": {"out": {"value": value, "type": "dynamic"}},
        "resources": [{
            "mode": "managed", "type": "terraform_data", "name": "a", "provider": "p",
            "instances": [
                {"index_key": 0, "schema_version": 0, "attributes": {"input": value, "id": "x"}},
                {"index_key": 1, "schema_version": 0, "attributes": {"id": "y", "nested": [value, {"v": value}]},
                 "private": "", "sensitive_attributes": []},
            ],
        }],
    }
    return json.dumps(doc, ensure_ascii=ensure_ascii, indent=indent).encode()


@settings(max_examples=600, deadline=None, database=None)
@given(json_values)
@example([1e-5, 2**64, "\u2028<>&"])
@example({"é": 1, "\U0001f600": 2, "\uffff": 3, "z": 4, "": 5})
def test_orjson_writes_json_s_canonical_text_for_every_value_the_float_check_lets_through(value: Any) -> None:
    if _float_check_passes(value):
        assert state._canonical_accelerated(value) == state._canonical(value)


@settings(max_examples=600, deadline=None, database=None)
@given(json_values)
def test_the_float_check_stops_every_float_orjson_writes_differently(value: Any) -> None:
    # It also stops some that orjson writes alike (below 1e-9, say): a conservative check only costs speed.
    differs = [f for f in _floats_in(value) if orjson.dumps(f).decode() != json.dumps(f)]
    if differs:
        assert not _float_check_passes(value)


@pytest.mark.parametrize("value", [1e-5, 2.5e-05, 1e-7, -3.25e-8, 1.2345e-9])
def test_orjson_writes_tiny_floats_differently_so_they_take_the_json_path(value: float) -> None:
    assert orjson.dumps(value).decode() != json.dumps(value)
    assert not _float_check_passes({"a": [value]})


@settings(max_examples=300, deadline=None, database=None)
@given(json_values, st.booleans(), st.sampled_from([None, 0, 2]))
def test_both_paths_parse_every_body_to_the_same_rows(value: Any, ensure_ascii: bool, indent: int | None) -> None:
    accelerated, plain = _both_ways(_body(value, ensure_ascii=ensure_ascii, indent=indent))
    assert accelerated == plain


@pytest.mark.parametrize("literal", [
    b"1e999", b"-1e400",  # infinities: both refuse them with the same message
    b"123456789012345678901234567890", b"-9223372036854775809", b"18446744073709551616",  # beyond 64 bits
    b'"\\ud800 lone surrogate"', b'"\\udfff"', b'"pair \\ud83d\\ude00"',
    b"0.00001", b"1E-7", b"0.0001", b"1e16", b"-0.0", b"-0", b"1.0", b"5e-324",
])
def test_both_paths_agree_on_literals_orjson_cannot_write_like_json(literal: bytes) -> None:
    raw = _body("PLACEHOLDER", indent=None).replace(b'"PLACEHOLDER"', literal)
    accelerated, plain = _both_ways(raw)
    assert accelerated == plain


def test_a_big_integer_keeps_its_exact_digits_and_hash_on_both_paths() -> None:
    raw = _body(2**64 + 1, indent=None)
    accelerated, plain = _both_ways(raw)
    assert isinstance(accelerated, ParsedState)
    assert accelerated == plain
    assert str(2**64 + 1) in accelerated.instances[0].instance_json


def test_nesting_deeper_than_orjson_writes_takes_the_json_path() -> None:
    deep: Any = "leaf"
    for _ in range(400):
        deep = [deep]
    accelerated, plain = _both_ways(_body(deep, indent=None))
    assert isinstance(accelerated, ParsedState)
    assert accelerated == plain


@pytest.mark.parametrize("name", ["state1.tfstate", "state2.tfstate"])
def test_terraform_written_states_parse_the_same_on_both_paths(name: str) -> None:
    accelerated, plain = _both_ways((FIXTURES / name).read_bytes())
    assert isinstance(accelerated, ParsedState)
    assert accelerated == plain


def test_without_orjson_parse_state_runs_on_json_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = _body({"k": [1, 2.5, "x"]})
    with_orjson = parse_state(raw)
    monkeypatch.setattr(state, "orjson", None)
    assert parse_state(raw) == with_orjson


def test_the_float_check_keeps_fractions_as_json_does_and_makes_whole_numbers_exact_integers() -> None:
    check = state._FloatCheck()
    for text in ["0.1", "1e-7", "1e999", "123456789.123456789", "-2.5e-3"]:
        converted = check(text)
        assert type(converted) is float
        assert converted == float(text) or (math.isinf(converted) and math.isinf(float(text)))
        assert math.copysign(1, converted) == math.copysign(1, float(text))
    # The canonical form of analyzer.values: whole numbers are integers, -0 is 0, and a float beyond 2**53 is
    # the integer its decimal names (what Postgres keeps), not the binary float's expansion.
    check = state._FloatCheck()
    for text, expected in [("-0.0", 0), ("2.5E+3", 2500), ("1.0", 1), ("1e300", 10**300),
                           ("12345678901234567.5", 12345678901234568)]:
        converted = check(text)
        assert isinstance(converted, int) and type(converted) is not float and converted == expected, text
    assert check.orjson_safe


def _normalize_reference(instance: dict[str, Any]) -> dict[str, Any]:
    """``normalize_instance`` as first written (comprehensions): the rewrite must drop the same keys."""
    drop = [k for k, empty in state._EMPTY_METADATA.items() if k in instance and instance[k] in empty]
    if "identity_schema_version" in instance and not instance.get("identity") \
            and instance["identity_schema_version"] in (0, None):
        drop.append("identity_schema_version")
    if not drop:
        return instance
    return {k: v for k, v in instance.items() if k not in drop}


_metadata_values = st.sampled_from([[], [[]], "", "x", None, False, True, 0, 0.0, 1, {}, {"a": 1}, ["a.b"]])
_metadata_keys = st.sampled_from([*state._EMPTY_METADATA, "identity_schema_version", "schema_version", "attributes"])


@settings(max_examples=500, deadline=None, database=None)
@given(st.dictionaries(_metadata_keys, _metadata_values, max_size=9))
def test_normalize_instance_drops_exactly_what_its_first_definition_dropped(instance: dict[str, Any]) -> None:
    expected = _normalize_reference(dict(instance))
    got = state.normalize_instance(instance)
    assert got == expected and list(got) == list(expected)
    assert (got is instance) == (expected == instance and len(expected) == len(instance))
