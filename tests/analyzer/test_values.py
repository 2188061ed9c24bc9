"""analyzer.values: the one semantic comparison of JSON values, whoever spelled them."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from analyzer.state import canonical_json
from analyzer.values import canonical_text, json_number, load_json, same_json, same_value

# Every shape a JSON value takes. Strings leave out NUL and lone surrogates, which the store refuses up front
# (analyzer.jsontext); integers reach far beyond 64 bits, as HCL numbers do.
_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
_SCALARS = (st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30)
            | st.floats(allow_nan=False, allow_infinity=False) | _TEXT)
VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
                      max_leaves=20)


def respell(value: Any, rng: random.Random) -> str:
    """The same value written another way: indentation, key order, \\u escapes, and numbers with a fraction
    or an exponent (``1`` as ``1.0`` or ``10e-1``) the way another JSON writer may."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int):
        if abs(value) < 2**53:  # beyond, a number with a fraction or exponent is read at float64 precision
            return rng.choice([str(value), f"{value}.0", f"{value}0e-1" if value else "0e5", f"{value}E0"])
        return str(value)
    if isinstance(value, float):
        return rng.choice([repr(value), json.dumps(value), f"{value!r}e0" if "e" not in repr(value) else repr(value)])
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=rng.random() < 0.5)
    if isinstance(value, list):
        return "[ " + " ,\n".join(respell(v, rng) for v in value) + " ]"
    items = list(value.items())
    rng.shuffle(items)
    return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=rng.random() < 0.5)} : {respell(v, rng)}"
                           for k, v in items) + "}"


@given(VALUES, st.randoms(use_true_random=False))
def test_a_value_spelled_another_way_is_the_same_and_a_changed_one_is_not(value, rng) -> None:
    text = canonical_text(value)
    assert same_json(respell(value, rng), text)
    assert same_json(json.dumps(value, indent=2, sort_keys=False), text)
    assert canonical_text(load_json(text)) == text  # the canonical form is a fixed point
    assert not same_json(json.dumps([value]), text)
    assert not same_json(json.dumps({"k": value}), text)


@pytest.mark.parametrize(("a", "b"), [
    ("1", "1.0"), ("1000", "1e3"), ("0", "-0"), ("0", "-0.0"), ("0.00000015", "1.5e-07"),
    ("100000000000000000000", "1e20"), ("1" + "0" * 300, "1e300"), ("12345678901234568", "1.2345678901234568e+16"),
    ('["a", "b"]', '["a","b"]'), ('{"b": 1, "aaa": 2}', '{"aaa":2,"b":1}'), ('"\\u00e9\\n"', '"é\\n"'),
    ('{"a": {"n": null, "l": []}}', '{"a":{"l":[],"n":null}}'), ('{"a": 1, "a": 2}', '{"a": 2}'),
])
def test_these_texts_hold_the_same_value(a: str, b: str) -> None:
    assert same_json(a, b)


@pytest.mark.parametrize(("a", "b"), [
    ("true", "1"), ("false", "0"), ("null", "[]"), ("null", "{}"), ("[]", "{}"), ('""', "null"), ("1", '"1"'),
    ("0.1", "0.10000000000000002"), ("12345678901234567890", "12345678901234567891"), ("[1, 2]", "[2, 1]"),
    ('{"a": null}', "{}"), ('[null]', "[]"), ('"e\\u0301"', '"é"'),
])
def test_these_texts_hold_different_values(a: str, b: str) -> None:
    assert not same_json(a, b)


def test_whole_numbers_are_exact_integers_and_fractions_stay_floats() -> None:
    assert json_number("1.0") == 1 and isinstance(json_number("1.0"), int)
    assert json_number("1e300") == 10**300
    assert type(json_number("0.5")) is float
    assert json_number("1e999") == float("inf")  # the state parser refuses it with a message
    with pytest.raises(ValueError):
        load_json("NaN")
    with pytest.raises(ValueError):
        canonical_text(float("inf"))


def test_the_state_parser_writes_the_same_canonical_form() -> None:
    value = {"b": [1.0, 2.5, None, {}], "a": "é", "n": 1e20}
    assert canonical_json(value) == canonical_text(value) == '{"a":"é","b":[1,2.5,null,{}],"n":100000000000000000000}'
    assert same_value(value, json.loads(json.dumps(value)))
    assert not same_value(True, 1) and not same_value(None, [])


def test_a_whole_number_written_as_a_float_is_an_integer_in_values_but_not_where_the_format_wants_one() -> None:
    from analyzer.state import ParsedState, StateFormatError, parse_state

    body = ('{"version": 4, "serial": 3, "lineage": "l", "outputs": {"n": {"value": [1.0, 2e0], "type": '
            '["tuple", ["number", "number"]]}}, "resources": []}')
    parsed = parse_state(body.encode())
    assert isinstance(parsed, ParsedState) and parsed.outputs[0].value_json == "[1,2]"
    for field in ('"serial": 3.0', '"version": 4.0'):
        with pytest.raises(StateFormatError):
            parse_state(body.replace(field.replace(".0", ""), field).encode())


def test_an_instance_whose_dependencies_and_sensitive_paths_come_in_another_order_hashes_the_same() -> None:
    from analyzer.state import ParsedState, parse_state

    def body(deps: list[str], paths: list[object]) -> bytes:
        return json.dumps({"version": 4, "serial": 1, "lineage": "l", "resources": [{
            "mode": "managed", "type": "terraform_data", "name": "x", "provider": "p", "instances": [{
                "attributes": {"id": "x"}, "dependencies": deps, "sensitive_attributes": paths}]}]}).encode()

    a_path, b_path = [{"type": "get_attr", "value": "a"}], [{"type": "get_attr", "value": "b"}]
    first = parse_state(body(["terraform_data.a", "terraform_data.b"], [a_path, b_path]))
    second = parse_state(body(["terraform_data.b", "terraform_data.a"], [b_path, a_path]))
    other = parse_state(body(["terraform_data.a"], [a_path, b_path]))
    assert isinstance(first, ParsedState) and isinstance(second, ParsedState) and isinstance(other, ParsedState)
    assert first.instances[0].attributes_hash == second.instances[0].attributes_hash
    assert first.instances[0].attributes_hash != other.instances[0].attributes_hash
    assert second.instances[0].dependencies == ("terraform_data.b", "terraform_data.a")  # the graph keeps both
