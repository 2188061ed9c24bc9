"""Address scopes as pure rules: parsing, the checks on requests and writes, and that whatever a check
accepts stays inside the scopes (brute force over closed universes of addresses)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.addresses import InstanceAddress
from analyzer.globs import Glob, canonical, matches, matches_output, parse_glob
from app.domain.reservations import Mode
from app.domain.scopes import (
    AddressScope,
    ScopeError,
    ScopeSet,
    check_requested,
    check_whole_state,
    check_written,
    parse_scope,
    parse_scopes,
    readable_event,
    scope_set,
)
from app.errors import AddressScopeError
from tests.analyzer.test_globs import open_universe_and_globs


def scopes(*texts: str) -> ScopeSet:
    found = scope_set(tuple(texts))
    assert found is not None
    return found


def test_a_scope_is_a_glob_and_a_mode_after_the_last_colon() -> None:
    assert parse_scope("module.payments.*:write") == AddressScope(parse_glob("module.payments.*"), Mode.WRITE)
    assert parse_scope('module.m["a:b"].x.y:read').glob == parse_glob('module.m["a:b"].x.y')
    assert str(parse_scope("aws_iam_role.*:write")) == "aws_iam_role.*:write"
    assert str(parse_scope("output.payments_*:write")) == "output.payments_*:write"
    for bad, problem in (("module.payments.*", "GLOB:read or GLOB:write"), ("x.y:admin", "GLOB:read"),
                         ("module.web:write", "names a module"), (":read", "empty"),
                         ("aws_instance.web_*:write", "partial names"), ("output.a_*x:write", "one final")):
        with pytest.raises(ScopeError, match=problem):
            parse_scope(bad)


def test_parse_scopes_is_canonical_sorted_and_drops_reads_a_write_implies() -> None:
    assert parse_scopes(['module.n["k"].x.y:read', "x.y:read", "x.y:write", "*:read", "x.y:write"]) == (
        "*:read", 'module.n["k"].x.y:read', "x.y:write")
    with pytest.raises(ScopeError, match="strings"):
        parse_scopes([1])
    assert scope_set(()) is None  # no scopes: the whole state, never an empty set that refuses everything


def test_requests_need_a_covering_scope_of_at_least_their_mode() -> None:
    held = scopes("module.payments.*:write", "output.payments_url:write", "aws_iam_role.*:read")
    ok = [("module.payments.aws_x.y", Mode.WRITE), ('module.payments["eu"].*', Mode.READ),
          ("aws_iam_role.ci.*", Mode.READ), ("output.payments_url", Mode.WRITE)]
    check_requested(held, "prod", ((parse_glob(g), m) for g, m in ok))
    for glob, mode, nearest in (("aws_iam_role.ci", Mode.WRITE, "aws_iam_role.*:read"),
                                ("module.paymentsx.*", Mode.READ, "module.payments.*:write"),
                                ("*", Mode.READ, "aws_iam_role.*:read"),
                                ("output.*", Mode.WRITE, "output.payments_url:write")):
        with pytest.raises(AddressScopeError) as refused:
            check_requested(held, "prod", [(parse_glob(glob), mode)])
        assert refused.value.data == {"glob": glob, "mode": mode.value, "nearest_scope": nearest, "state": "prod"}
        assert refused.value.status == 403 and refused.value.code == "address_scope"
    check_requested(None, "prod", [(parse_glob("*"), Mode.WRITE)])  # no scopes: nothing to check


def test_whole_state_calls_need_everything_and_writes_need_write_scopes() -> None:
    reader = scopes("*:read")
    check_whole_state(reader, "prod", Mode.READ, "GET")
    with pytest.raises(AddressScopeError, match="LOCK"):
        check_whole_state(reader, "prod", Mode.WRITE, "Terraform's LOCK")
    writer = scopes("terraform_data.search.*:write", "*:read")
    check_written(writer, "prod", ["terraform_data.search[0]"], [])
    with pytest.raises(AddressScopeError) as refused:
        check_written(writer, "prod", ["terraform_data.search[0]"], ["search_ids"])
    assert refused.value.glob == "output.search_ids" and refused.value.nearest_scope == "*:read"


def test_an_output_name_prefix_scope_owns_the_outputs_it_starts_and_nothing_else() -> None:
    held = scopes("module.payments.*:write", "output.payments_*:write", "*:read")
    check_written(held, "prod", ['module.payments["eu"].x.y'], ["payments_url", "payments_eu_arn"])
    check_requested(held, "prod", [(parse_glob("output.payments_eu_*"), Mode.WRITE),
                                   (parse_glob("output.payments_url"), Mode.WRITE)])
    for name in ("payments", "search_payments_url", "Payments_url"):
        with pytest.raises(AddressScopeError) as refused:
            check_written(held, "prod", [], [name])
        assert refused.value.glob == f"output.{name}"
    with pytest.raises(AddressScopeError) as wide:  # a shorter prefix holds names the scope does not
        check_requested(scopes("output.payments_*:write"), "prod", [(parse_glob("output.pay*"), Mode.WRITE)])
    assert wide.value.nearest_scope == "output.payments_*:write"


def test_an_event_is_readable_when_every_address_it_names_is() -> None:
    held = scopes("terraform_data.search.*:write")
    assert readable_event(held, {"addresses": ["terraform_data.search[0]"], "serial": 3})
    assert not readable_event(held, {"addresses": ["terraform_data.search[0]", "module.p.x.y"]})
    assert not readable_event(held, {"wanted": [{"glob": "*", "mode": "read"}]})
    assert not readable_event(held, {"glob": "not a glob ["})  # fails closed
    assert readable_event(held, {"lock_id": "abc"})
    assert readable_event(scopes("*:read"), {"addresses": ["module.p.x.y"]})


@st.composite
def scoped_case(draw: st.DrawFn) -> tuple[tuple[InstanceAddress, ...], tuple[str, ...], list[AddressScope],
                                         list[tuple[Glob, Mode]]]:
    universe, outputs, globs = draw(open_universe_and_globs())
    modes = st.sampled_from((Mode.READ, Mode.WRITE))
    held = [AddressScope(g, draw(modes)) for g in draw(st.lists(st.sampled_from(globs), min_size=1, max_size=4))]
    wanted = [(g, draw(modes)) for g in globs]
    return universe, outputs, held, wanted


@settings(max_examples=60, deadline=None)
@given(scoped_case())
def test_nothing_a_scope_check_accepts_reaches_outside_the_scopes(
    case: tuple[tuple[InstanceAddress, ...], tuple[str, ...], list[AddressScope], list[tuple[Glob, Mode]]],
) -> None:
    """A reservation the check accepts covers only addresses and outputs some scope of its mode covers, so
    no commit it allows can write (or read) outside them; and the write check accepts exactly the addresses
    and outputs inside a write scope."""
    universe, outputs, held, wanted = case
    chosen = ScopeSet(tuple(held))
    for glob, mode in wanted:
        allowed = [s for s in held if s.allows(mode)]
        try:
            check_requested(chosen, "s", [(glob, mode)])
        except AddressScopeError:
            continue
        for address in universe:
            if matches(glob, address):
                assert any(matches(s.glob, address) for s in allowed), (canonical(glob), str(address))
        for name in outputs:
            if matches_output(glob, name):
                assert any(matches_output(s.glob, name) for s in allowed), (canonical(glob), name)
    writable = [s.glob for s in held if s.mode is Mode.WRITE]
    for address in universe:
        inside = any(matches(g, address) for g in writable)
        try:
            check_written(chosen, "s", [str(address)], [])
            accepted = True
        except AddressScopeError:
            accepted = False
        assert accepted is inside, str(address)
    for name in outputs:
        assert chosen.allows_output(name, Mode.WRITE) is any(matches_output(g, name) for g in writable)
