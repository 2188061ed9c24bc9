"""analyzer.jsonfields: the type checks every reader of an outside JSON document shares."""

from __future__ import annotations

import pytest

from analyzer.jsonfields import is_list, is_number, is_object, is_string, is_text, member


class Refused(Exception):
    pass


def _refuse() -> Exception:
    return Refused("no")


@pytest.mark.parametrize(
    ("wanted", "accepted", "refused"),
    [
        (is_text, ["a"], ["", None, 1, ["a"]]),
        (is_string, ["", "a"], [None, 1, b"a"]),
        (is_number, [0, -3, 2**70], [True, False, 1.5, "1", None]),
        (is_object, [{}, {"a": 1}], [[], "x", None]),
        (is_list, [[], [1]], [(), {}, "ab", None]),
    ],
)
def test_each_check_accepts_its_type_and_refuses_the_rest(wanted, accepted, refused) -> None:
    for value in accepted:
        assert member({"k": value}, "k", wanted, _refuse) == value
    for value in refused:
        with pytest.raises(Refused):
            member({"k": value}, "k", wanted, _refuse)


def test_an_absent_member_is_the_default_when_one_is_given() -> None:
    assert member({}, "k", is_string, _refuse, "") == ""
    assert member({}, "k", is_list, _refuse, []) == []
    with pytest.raises(Refused):
        member({}, "k", is_text, _refuse)
