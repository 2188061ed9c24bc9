"""Reservation globs: parsing, matching, intersection and the conflict matrix.

Intersection is checked against brute force over address universes built to contain a witness for every
intersecting pair, and matching against the addresses real Terraform printed in a plan.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.addresses import (
    AddressError,
    InstanceAddress,
    ModuleStep,
    parse_instance_address,
    resource_address,
)
from analyzer.globs import (
    Glob,
    GlobError,
    GlobKind,
    canonical,
    conflicts,
    covers,
    intersects,
    matches,
    matches_output,
    parse_glob,
)

PLANS = Path(__file__).resolve().parent.parent / "fixtures" / "plans"

Key = int | str | None
Resource = tuple[str, str, str]


# --- parsing -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("*", GlobKind.EVERYTHING),
        ("aws_vpc.main", GlobKind.EXACT),
        ("aws_instance.web[0]", GlobKind.EXACT),
        ('module.net["a"].aws_subnet.private[0]', GlobKind.EXACT),
        ("data.x.y", GlobKind.EXACT),
        ("module.m.data.x.y[2]", GlobKind.EXACT),
        ('module.m["a.b"].x.y', GlobKind.EXACT),
        ("module.web.*", GlobKind.MODULE),
        ('module.net["a"].*', GlobKind.MODULE),
        ("module.a.module.b.*", GlobKind.MODULE),
        ("module.data.*", GlobKind.MODULE),
        ('module.m["q\\"].*"].*', GlobKind.MODULE),
        ("aws_instance.web.*", GlobKind.RESOURCE),
        ("module.x.aws_instance.web.*", GlobKind.RESOURCE),
        ("data.aws_ami.x.*", GlobKind.RESOURCE),
        ("fakecloud_queue.*", GlobKind.TYPE),
        ("data.aws_ami.*", GlobKind.TYPE),
        ("module.x.aws_iam_role.*", GlobKind.TYPE),
        ('module.x["k"].data.aws_ami.*', GlobKind.TYPE),
        ("module.data.aws_iam_role.*", GlobKind.TYPE),  # the managed type in the module call named 'data'
        ("module.x.output.*", GlobKind.TYPE),
        ("output.o1", GlobKind.OUTPUT),
        ("output.db_password", GlobKind.OUTPUT),
        ("output.*", GlobKind.OUTPUTS),
        ("output.payments_*", GlobKind.OUTPUT_PREFIX),
        ("output.o*", GlobKind.OUTPUT_PREFIX),
        ("output._*", GlobKind.OUTPUT_PREFIX),
        ("module.x.output.y", GlobKind.EXACT),  # a resource of type "output" inside a module
    ],
)
def test_parse_glob_accepts_each_form_and_canonical_gives_the_text_back(text: str, kind: GlobKind) -> None:
    glob = parse_glob(text)
    assert glob.kind is kind
    assert canonical(glob) == text
    assert str(glob) == text
    assert glob.is_exact is (kind is GlobKind.EXACT)
    assert glob.is_everything is (kind is GlobKind.EVERYTHING)


@pytest.mark.parametrize(
    ("text", "normal"),
    [
        ('module.m["\\u0061"].*', 'module.m["a"].*'),
        ("aws_instance.web[007]", "aws_instance.web[7]"),
        ('aws_instance.web["\t"]', 'aws_instance.web["\\t"]'),
        ('aws_instance.web["\\u0009"]', 'aws_instance.web["\\t"]'),
    ],
)
def test_canonical_normalizes_key_spellings_terraform_would_print_differently(text: str, normal: str) -> None:
    assert canonical(parse_glob(text)) == normal


def test_parse_glob_keeps_a_doubled_dollar_as_a_literal_dollar_brace_and_refuses_a_template() -> None:
    glob = parse_glob('aws_instance.web["$${x}"]')
    assert glob.key == "${x}"
    assert canonical(glob) == 'aws_instance.web["$${x}"]'
    with pytest.raises(GlobError, match="would start a template"):
        parse_glob('aws_instance.web["${x}"]')


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "it is empty"),
        ("module.web*", "'*' at character 11 is not allowed there"),
        ("*.foo", "'*' at character 1 is not allowed there"),
        ("*.*", "'*' at character 1 is not allowed there"),
        ("module.*.x.y", "'*' at character 8 is not allowed there"),
        ("module.web.*.*", "'*' at character 12 is not allowed there"),
        ("aws_instance.web*", "'*' at character 17 is not allowed there"),
        ("**", "'*' at character 1 is not allowed there"),
        ("module.*", "'module' has no module name: write 'module.NAME.*'"),
        ("module.x.module.*", "has no module name: write 'module.x.module.NAME.*'"),
        ("data.*", "'data' has no data source type and name: write 'data.TYPE.NAME.*'"),
        ("a.b.c.*", "'a.b.c' before '.*' is neither a module path nor a resource"),
        ("a.b.c", "expected the end of the address after the resource"),
        (".*", "'.*' must follow a module path or a resource"),
        ("module.web", "'module.web' names a module, not a resource instance; write 'module.web.*'"),
        ('module.net["a"]', "write 'module.net[\"a\"].*' for every address inside it"),
        ("aws_instance.web[0].*", "single instance with nothing inside it; write 'aws_instance.web[0]'"),
        ("aws_instance.web[0].*", "or 'aws_instance.web.*' for every instance of the resource"),
        ("aws_instance", "expected '.' between resource type and name"),
        (" aws_vpc.main", "expected a module step or a resource type"),
        ("aws_vpc.main ", "expected the end of the address"),
        ('module.m["a].*', "never closed"),
        ("output.", "an output glob is 'output.NAME' with NAME an identifier, 'output.PREFIX*' or 'output.*'"),
        ("output.o1[0]", "write 'output.o1' for the whole output"),
        ('output.o1["a"]', "write 'output.o1' for the whole output"),
        ("output.o1.value", "write 'output.o1' for the whole output"),
        ("output.o1.*", "write 'output.o1' for the whole output"),
        ("output.*o", "the only wildcard is one final '*'"),
        ("output.o**", "the only wildcard is one final '*'"),
        ("output.o*x", "the only wildcard is one final '*'"),
        ("output.9*", "the only wildcard is one final '*'"),
        ("output.*.*", "an output glob is 'output.NAME'"),
        ("aws_instance.web_*", "there are no partial names"),
        ("module.pay*.*", "there are no partial names"),
        ("aws_*.*", "there are no partial names"),
        ("output.9x", "an output glob is 'output.NAME'"),
        ("output.a b", "an output glob is 'output.NAME'"),
    ],
)
def test_parse_glob_rejects_malformed_globs_saying_what_is_wrong_and_what_is_accepted(
    text: str, problem: str
) -> None:
    with pytest.raises(GlobError) as excinfo:
        parse_glob(text)
    message = str(excinfo.value)
    assert problem in message
    assert "module prefix ('module.web.*'" in message
    assert "resource prefix ('aws_instance.web.*'" in message
    assert isinstance(excinfo.value, ValueError)


def test_glob_constructor_refuses_shapes_that_have_no_text_form() -> None:
    with pytest.raises(ValueError, match="module glob"):
        Glob(GlobKind.MODULE)
    with pytest.raises(ValueError, match="resource glob"):
        Glob(GlobKind.RESOURCE, resource=("managed", "a", "b"), key=0)
    with pytest.raises(ValueError, match="not a valid identifier"):
        Glob.module_prefix((ModuleStep("web app"),))
    with pytest.raises(ValueError, match="cannot be 'module'"):
        Glob.resource_prefix((), "managed", "module", "x")
    with pytest.raises(TypeError, match="instance key"):
        Glob.exact(InstanceAddress((), "managed", "a", "b", True))
    with pytest.raises(ValueError, match="is an output"):
        Glob.exact(InstanceAddress((), "managed", "output", "x", None))
    with pytest.raises(ValueError, match="output name"):
        Glob.root_output("not an identifier")
    with pytest.raises(ValueError, match="output glob"):
        Glob(GlobKind.OUTPUT)
    with pytest.raises(ValueError, match="outputs glob"):
        Glob(GlobKind.OUTPUTS, output="x")
    with pytest.raises(ValueError, match="exact glob"):
        Glob(GlobKind.EXACT, resource=("managed", "a", "b"), output="x")
    assert Glob.exact(InstanceAddress((ModuleStep("m"),), "managed", "output", "x", None)).kind is GlobKind.EXACT


def test_output_globs_are_outputs_and_name_no_address() -> None:
    assert parse_glob("output.o1") == Glob.root_output("o1")
    assert parse_glob("output.*") == Glob.all_outputs()
    assert parse_glob("output.o1").is_output and parse_glob("output.*").is_output
    assert not parse_glob("*").is_output and not parse_glob("aws_vpc.main").is_output
    with pytest.raises(ValueError, match="not an exact address"):
        _ = parse_glob("output.o1").address


@pytest.mark.parametrize(
    ("glob", "name", "expected"),
    [
        ("*", "o1", True),
        ("output.*", "o1", True),
        ("output.o1", "o1", True),
        ("output.o1", "o10", False),
        ("output.o10", "o1", False),
        ("output.o1", "O1", False),
        ("module.output.*", "o1", False),
        ("output.a", "output.a", False),
        ("aws_vpc.main", "main", False),
        ("output.payments_*", "payments_url", True),
        ("output.payments_*", "payments_", True),
        ("output.payments_*", "payments", False),
        ("output.payments_*", "Payments_url", False),
        ("output.payments_*", "search_payments_url", False),
    ],
)
def test_matches_output_covers_root_outputs_by_name(glob: str, name: str, expected: bool) -> None:
    assert matches_output(parse_glob(glob), name) is expected


@pytest.mark.parametrize("address", ["output.o1", "aws_vpc.main", "module.output.output.o1", "data.output.o1"])
def test_output_globs_match_no_instance_address(address: str) -> None:
    for glob in ("output.o1", "output.o*", "output.*"):
        assert not matches(parse_glob(glob), address)


def test_exact_glob_gives_back_its_address_and_other_kinds_refuse() -> None:
    address = parse_instance_address('module.net["a"].aws_subnet.private[0]')
    assert Glob.exact(address).address == address
    assert Glob.exact(str(address)) == parse_glob(str(address))
    with pytest.raises(ValueError, match="not an exact address"):
        _ = parse_glob("module.net.*").address


# --- matches -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("glob", "address", "expected"),
    [
        ("*", "aws_vpc.main", True),
        ("*", 'module.a["k"].module.b[0].data.x.y["z"]', True),
        # exact
        ("aws_vpc.main", "aws_vpc.main", True),
        ("aws_vpc.main", "aws_vpc.main[0]", False),
        ("aws_vpc.main[0]", "aws_vpc.main", False),
        ("aws_vpc.main", "aws_vpc.mainly", False),
        ("data.x.y", "data.x.y", True),
        ("data.x.y", "x.y", False),
        ("x.y", "data.x.y", False),
        ('module.net["a"].aws_subnet.private[0]', 'module.net["a"].aws_subnet.private[0]', True),
        ('module.net["a"].aws_subnet.private[0]', 'module.net["b"].aws_subnet.private[0]', False),
        ("module.net.aws_subnet.private[0]", 'module.net["a"].aws_subnet.private[0]', False),
        ('module.m["a.b"].x.y', 'module.m["a.b"].x.y', True),
        ('module.m["a.b"].x.y', 'module.m["a"].x.y', False),
        # module prefix, keyless last step: any key or none
        ("module.web.*", "module.web.x.y", True),
        ("module.web.*", 'module.web["a"].x.y', True),
        ("module.web.*", "module.web[0].x.y", True),
        ("module.web.*", "module.web.data.d.n[3]", True),
        ("module.web.*", 'module.web.module.inner["i"].x.y', True),
        ("module.web.*", "module.webapp.x.y", False),
        ("module.web.*", "module.we.x.y", False),
        ("module.web.*", "module.other.module.web.x.y", False),
        ("module.web.*", "x.y", False),
        ("module.web.*", "web.x", False),
        # module prefix with a key: that instance only
        ('module.net["a"].*', 'module.net["a"].x.y', True),
        ('module.net["a"].*', 'module.net["a"].module.deep.x.y', True),
        ('module.net["a"].*', 'module.net["b"].x.y', False),
        ('module.net["a"].*', "module.net.x.y", False),
        ('module.net["a"].*', "module.net[0].x.y", False),
        ("module.net[0].*", 'module.net["0"].x.y', False),
        ('module.m["a.b"].*', 'module.m["a.b"].x.y', True),
        ('module.m["a"].*', 'module.m["a.b"].x.y', False),
        ('module.m["]"].*', 'module.m["]"].x.y', True),
        ('module.m["q\\"].*"].*', 'module.m["q\\"].*"].x.y', True),
        ('module.m["q\\"].*"].*', 'module.m["q"].x.y', False),
        ("module.m.*", 'module.m["x.y[0]"].a.b', True),
        # nested module prefixes: every keyless step is "any key" (the conservative rule)
        ("module.a.module.b.*", "module.a.module.b.x.y", True),
        ("module.a.module.b.*", 'module.a["k"].module.b.x.y', True),
        ("module.a.module.b.*", "module.a[0].module.b[1].x.y", True),
        ("module.a.module.b.*", "module.a.x.y", False),
        ("module.a.module.b.*", "module.b.x.y", False),
        ("module.a.module.b.*", "module.a.module.bc.x.y", False),
        ("module.a.module.b.*", "module.ab.module.b.x.y", False),
        ('module.a["k"].module.b.*', 'module.a["k"].module.b[2].x.y', True),
        ('module.a["k"].module.b.*', 'module.a["j"].module.b.x.y', False),
        ('module.a["k"].module.b.*', "module.a.module.b.x.y", False),
        # resource prefix: every instance, keyed or not, never a longer name
        ("aws_instance.web.*", "aws_instance.web", True),
        ("aws_instance.web.*", "aws_instance.web[0]", True),
        ("aws_instance.web.*", 'aws_instance.web["a.b"]', True),
        ("aws_instance.web.*", "aws_instance.webapp", False),
        ("aws_instance.web.*", "aws_instance.webapp[0]", False),
        ("aws_instance.web.*", "aws_instance.we", False),
        ("aws_instance.web.*", "aws_instance_x.web", False),
        ("aws_instance.web.*", "data.aws_instance.web", False),
        ("aws_instance.web.*", "module.m.aws_instance.web", False),
        ("module.x.aws_instance.web.*", "module.x.aws_instance.web[1]", True),
        ("module.x.aws_instance.web.*", 'module.x["k"].aws_instance.web', True),
        ("module.x.aws_instance.web.*", "aws_instance.web", False),
        ("module.x.aws_instance.web.*", "module.x.module.y.aws_instance.web", False),
        ("module.x.aws_instance.web.*", "module.xy.aws_instance.web", False),
        ('module.x["k"].aws_instance.web.*', "module.x[0].aws_instance.web", False),
        ("data.aws_ami.x.*", "data.aws_ami.x", True),
        ("data.aws_ami.x.*", "data.aws_ami.x[0]", True),
        ("data.aws_ami.x.*", "aws_ami.x", False),
    ],
)
def test_matches_compares_parsed_steps_never_string_prefixes(glob: str, address: str, expected: bool) -> None:
    parsed = parse_glob(glob)
    assert matches(parsed, address) is expected
    assert matches(parsed, parse_instance_address(address)) is expected


def test_matches_raises_address_error_for_text_that_is_not_an_instance_address() -> None:
    with pytest.raises(AddressError):
        matches(parse_glob("*"), "module.web")


# --- intersects ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("*", "*", True),
        ("*", "aws_vpc.main", True),
        ("*", "module.web.*", True),
        ("*", "aws_instance.web.*", True),
        # exact vs exact
        ("aws_vpc.main", "aws_vpc.main", True),
        ("aws_vpc.main", "aws_vpc.main[0]", False),
        ("data.x.y", "x.y", False),
        ('module.m["a.b"].x.y', 'module.m["a.b"].x.y', True),
        # exact vs prefix
        ("module.web[0].x.y", "module.web.*", True),
        ("module.webapp.x.y", "module.web.*", False),
        ("aws_instance.web[3]", "aws_instance.web.*", True),
        ("aws_instance.webapp", "aws_instance.web.*", False),
        ('module.a["k"].module.b.x.y', "module.a.module.b.*", True),
        # module vs module
        ("module.web.*", "module.web.*", True),
        ("module.web.*", "module.webapp.*", False),
        ("module.web.*", 'module.web["a"].*', True),
        ('module.web["a"].*', 'module.web["b"].*', False),
        ('module.web["a"].*', "module.web[0].*", False),
        ("module.a.*", "module.a.module.b.*", True),
        ("module.a.module.b.*", 'module.a["k"].*', True),
        ('module.a["j"].module.b.*', 'module.a["k"].*', False),
        ('module.a.module.b["x"].*', 'module.a["k"].module.b.*', True),
        ('module.a.module.b["x"].*', 'module.a["k"].module.b["y"].*', False),
        ("module.a.module.b.*", "module.b.*", False),
        # resource vs resource
        ("aws_instance.web.*", "aws_instance.web.*", True),
        ("aws_instance.web.*", "aws_instance.webapp.*", False),
        ("aws_instance.web.*", "data.aws_instance.web.*", False),
        ("aws_instance.web.*", "module.m.aws_instance.web.*", False),
        ("module.x.aws_instance.web.*", 'module.x["k"].aws_instance.web.*', True),
        ('module.x["j"].aws_instance.web.*', 'module.x["k"].aws_instance.web.*', False),
        # module vs resource
        ("module.x.aws_instance.web.*", 'module.x["k"].*', True),
        ("module.x.aws_instance.web.*", "module.y.*", False),
        ("module.x.aws_instance.web.*", "module.x.module.z.*", False),
        ("module.x.module.z.aws_instance.web.*", "module.x.module.z.*", True),
        ("module.x.module.z.aws_instance.web.*", "module.x.*", True),
        ("aws_instance.web.*", "module.web.*", False),
        # root outputs: their own space, covered by '*'
        ("*", "output.o1", True),
        ("*", "output.*", True),
        ("output.*", "output.*", True),
        ("output.*", "output.o1", True),
        ("output.o1", "output.o1", True),
        ("output.o1", "output.o2", False),
        ("output.o1", "output.o10", False),
        ("output.o1", "module.output.*", False),
        ("output.*", "module.output.*", False),
        ("output.*", "output.x", True),
        ("output.o1", "aws_vpc.main", False),
        ("output.*", "aws_instance.web.*", False),
        ("output.*", "module.m.output.o1", False),
        ("output.*", "data.output.o1", False),
    ],
)
def test_intersects_is_true_exactly_when_some_address_matches_both(a: str, b: str, expected: bool) -> None:
    ga, gb = parse_glob(a), parse_glob(b)
    assert intersects(ga, gb) is expected
    assert intersects(gb, ga) is expected


# --- conflicts -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode_a", "mode_b", "expected"),
    [("read", "read", False), ("read", "write", True), ("write", "read", True), ("write", "write", True)],
)
def test_conflicts_follows_the_matrix_when_globs_intersect(mode_a: str, mode_b: str, expected: bool) -> None:
    assert conflicts(mode_a, parse_glob("module.web.*"), mode_b, parse_glob("module.web[0].x.y")) is expected


@pytest.mark.parametrize(("mode_a", "mode_b"), [("read", "write"), ("write", "read"), ("write", "write")])
def test_conflicts_is_false_for_disjoint_globs_whatever_the_modes(mode_a: str, mode_b: str) -> None:
    assert not conflicts(mode_a, parse_glob("module.web.*"), mode_b, parse_glob("module.webapp.*"))


@pytest.mark.parametrize(
    ("mode_a", "a", "mode_b", "b", "expected"),
    [
        ("read", "output.o1", "read", "output.o1", False),
        ("read", "output.o1", "write", "output.*", True),
        ("write", "output.o1", "write", "output.o1", True),
        ("write", "output.o1", "write", "output.o2", False),
        ("write", "*", "read", "output.o1", True),
        ("write", "output.*", "write", "module.web.*", False),
        ("write", "output.*", "write", "terraform_data.a", False),
        ("write", "output.pay_*", "read", "output.pay_url", True),
        ("write", "output.pay_*", "write", "output.pay_*", True),
        ("write", "output.pay_*", "write", "output.pay_eu_*", True),
        ("write", "output.pay_*", "write", "output.p*", True),
        ("write", "output.pay_*", "write", "output.pay", False),
        ("write", "output.pay_*", "write", "output.search_*", False),
        ("write", "output.pay_*", "write", "pay_url.x", False),
        ("read", "output.pay_*", "read", "output.pay_url", False),
    ],
)
def test_output_globs_follow_the_same_conflict_matrix(
    mode_a: str, a: str, mode_b: str, b: str, expected: bool
) -> None:
    assert conflicts(mode_a, parse_glob(a), mode_b, parse_glob(b)) is expected
    assert conflicts(mode_b, parse_glob(b), mode_a, parse_glob(a)) is expected


@pytest.mark.parametrize(("mode_a", "mode_b"), [("lock", "read"), ("write", "READ"), ("", "write")])
def test_conflicts_refuses_unknown_modes_even_for_disjoint_globs(mode_a: str, mode_b: str) -> None:
    with pytest.raises(ValueError, match="unknown reservation mode"):
        conflicts(mode_a, parse_glob("a.b"), mode_b, parse_glob("c.d"))


# --- intersects against brute force --------------------------------------------------------------------
#
# A universe is the full product of its ingredients: every module path of depth <= 2 over its module
# names and keys, times its resources, times its keys. Globs are derived from universe addresses, so they
# only use those names, keys and resources. Then every intersecting pair has a witness in the universe:
# unify the two module paths step by step (take the key one of them gives, or any universe key where both
# are keyless), keep the longer path (depth <= 2), and add the resource and key from the glob that has one
# (or any universe resource and key). Each of those choices is in the product.

MODULE_NAMES = ("web", "webapp", "net")
KEYS: tuple[Key, ...] = (None, 0, 1, "a", "a.b", 'q"].*')
RESOURCES: tuple[Resource, ...] = (
    ("managed", "aws_instance", "web"),
    ("managed", "aws_instance", "webapp"),
    ("data", "aws_instance", "web"),
    ("managed", "aws_vpc", "main"),
)


def build_universe(
    names: Iterable[str], keys: Iterable[Key], resources: Iterable[Resource]
) -> tuple[InstanceAddress, ...]:
    keys = tuple(keys)
    steps = [ModuleStep(name, key) for name in names for key in keys]
    paths = [path for depth in range(3) for path in itertools.product(steps, repeat=depth)]
    return tuple(
        InstanceAddress(path, mode, type_, name, key)
        for path in paths
        for mode, type_, name in resources
        for key in keys
    )


def without_keys(steps: tuple[ModuleStep, ...], drop: tuple[bool, ...]) -> tuple[ModuleStep, ...]:
    return tuple(ModuleStep(s.name, None if d else s.key) for s, d in zip(steps, drop, strict=True))


def globs_from(address: InstanceAddress) -> list[Glob]:
    """Every glob that can be derived from one address: itself, its resource and module prefixes with
    each module step keyed or keyless, and ``*``."""
    found = [Glob.everything(), Glob.exact(address)]
    for depth in range(len(address.module) + 1):
        for drop in itertools.product((False, True), repeat=depth):
            module = without_keys(address.module[:depth], drop)
            if depth:
                found.append(Glob.module_prefix(module))
            if depth == len(address.module):
                found.append(Glob.resource_prefix(module, address.mode, address.type, address.name))
                found.append(Glob.type_prefix(module, address.mode, address.type))
    return found


def match_mask(glob: Glob, universe: tuple[InstanceAddress, ...]) -> int:
    return sum(1 << i for i, address in enumerate(universe) if matches(glob, address))


@st.composite
def universe_and_globs(draw: st.DrawFn) -> tuple[tuple[InstanceAddress, ...], list[Glob]]:
    names = draw(st.lists(st.sampled_from(MODULE_NAMES), min_size=1, max_size=2, unique=True))
    keys = draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True))
    resources = draw(st.lists(st.sampled_from(RESOURCES), min_size=1, max_size=2, unique=True))
    universe = build_universe(names, keys, resources)
    sources = draw(st.lists(st.sampled_from(universe), min_size=1, max_size=6))
    globs = [draw(st.sampled_from(globs_from(address))) for address in sources]
    return universe, globs


@settings(max_examples=300, deadline=None)
@given(universe_and_globs())
def test_intersects_agrees_with_brute_force_over_a_closed_universe(
    case: tuple[tuple[InstanceAddress, ...], list[Glob]],
) -> None:
    universe, globs = case
    masks = [match_mask(glob, universe) for glob in globs]
    for mask in masks:
        assert mask, "every derived glob matches at least its source address"
    for (a, mask_a), (b, mask_b) in itertools.product(zip(globs, masks, strict=True), repeat=2):
        assert intersects(a, b) == bool(mask_a & mask_b), (canonical(a), canonical(b))
        assert intersects(a, b) == intersects(b, a)
    for glob in globs:
        for address in universe:
            if matches(glob, address):
                assert intersects(glob, Glob.exact(address)), (canonical(glob), str(address))


def test_intersects_agrees_with_brute_force_for_every_pair_of_globs_in_a_fixed_universe() -> None:
    universe = build_universe(("web", "webapp"), (None, 0, "a.b"), RESOURCES[:2])
    globs = list(dict.fromkeys(glob for address in universe for glob in globs_from(address)))
    masks = {glob: match_mask(glob, universe) for glob in globs}
    disagreements = [
        (canonical(a), canonical(b))
        for a, b in itertools.combinations_with_replacement(globs, 2)
        if intersects(a, b) != bool(masks[a] & masks[b]) or intersects(a, b) != intersects(b, a)
    ]
    assert disagreements == []
    assert len(globs) > 300  # the check is not vacuous: exact, module and resource globs at every depth


# Outputs join the universe as names: a glob's mask is the instances it matches plus the outputs it
# covers. An output glob is derived from a universe name (or is ``output.*``), so every intersecting pair
# again has a witness: the shared name, any universe name for ``output.*``, any member for ``*``.

OUTPUT_NAMES = ("o1", "o10", "output", "module")


def output_prefixes(names: Iterable[str]) -> list[Glob]:
    """``output.PREFIX*`` for every prefix of the names: each such glob has a witness in the names (the name
    it was cut from), and two of them meet exactly when one starts the other (the longer one's name)."""
    return [Glob.output_prefix(name[:end]) for name in names for end in range(1, len(name) + 1)]


def coverage_mask(glob: Glob, universe: tuple[InstanceAddress, ...], outputs: tuple[str, ...]) -> int:
    outputs_mask = sum(1 << i for i, name in enumerate(outputs) if matches_output(glob, name))
    return match_mask(glob, universe) | (outputs_mask << len(universe))


@st.composite
def universe_outputs_and_globs(
    draw: st.DrawFn,
) -> tuple[tuple[InstanceAddress, ...], tuple[str, ...], list[Glob]]:
    universe, globs = draw(universe_and_globs())
    outputs = tuple(draw(st.lists(st.sampled_from(OUTPUT_NAMES), min_size=1, max_size=3, unique=True)))
    output_globs = [Glob.all_outputs(), *(Glob.root_output(name) for name in outputs),
                    *output_prefixes(outputs)]
    extra = draw(st.lists(st.sampled_from(output_globs), min_size=1, max_size=4))
    return universe, outputs, [*globs, *extra]


@settings(max_examples=200, deadline=None)
@given(universe_outputs_and_globs())
def test_intersects_agrees_with_brute_force_over_instances_and_outputs(
    case: tuple[tuple[InstanceAddress, ...], tuple[str, ...], list[Glob]],
) -> None:
    universe, outputs, globs = case
    masks = [coverage_mask(glob, universe, outputs) for glob in globs]
    for mask in masks:
        assert mask
    for (a, mask_a), (b, mask_b) in itertools.product(zip(globs, masks, strict=True), repeat=2):
        assert intersects(a, b) == bool(mask_a & mask_b), (canonical(a), canonical(b))
        for mode_a, mode_b in itertools.product(("read", "write"), repeat=2):
            expected = bool(mask_a & mask_b) and "write" in (mode_a, mode_b)
            assert conflicts(mode_a, a, mode_b, b) is expected


# --- round trip ----------------------------------------------------------------------------------------

identifiers = st.from_regex(r"[a-z_][a-z0-9_-]{0,6}", fullmatch=True).filter(
    lambda s: s not in ("module", "data", "output")
)
output_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,8}", fullmatch=True)
keys = st.one_of(st.none(), st.integers(-5, 10**6), st.text(max_size=8))
module_steps = st.builds(ModuleStep, identifiers, keys)
module_paths = st.lists(module_steps, max_size=3).map(tuple)
modes = st.sampled_from(("managed", "data"))

all_globs = st.one_of(
    st.just(Glob.everything()),
    st.builds(
        lambda module, mode, type_, name, key: Glob.exact(InstanceAddress(module, mode, type_, name, key)),
        module_paths,
        modes,
        identifiers,
        identifiers,
        keys,
    ),
    st.lists(module_steps, min_size=1, max_size=3).map(lambda steps: Glob.module_prefix(tuple(steps))),
    st.builds(Glob.resource_prefix, module_paths, modes, identifiers, identifiers),
    st.builds(Glob.type_prefix, module_paths, modes, identifiers),
    st.just(Glob.all_outputs()),
    st.builds(Glob.root_output, output_names),
    st.builds(Glob.output_prefix, output_names),
)


@given(all_globs)
def test_parse_glob_reads_canonical_text_back_to_the_same_glob(glob: Glob) -> None:
    assert parse_glob(canonical(glob)) == glob


@given(all_globs)
def test_every_glob_intersects_itself(glob: Glob) -> None:
    assert intersects(glob, glob)


# --- Terraform's own addresses -------------------------------------------------------------------------


def _plan_changes(name: str) -> list[dict[str, Any]]:
    plan: dict[str, Any] = json.loads((PLANS / name).read_text())
    changes: list[dict[str, Any]] = plan["resource_changes"]
    return changes


def _resource_glob_text(change: dict[str, Any]) -> str:
    return (
        resource_address(change.get("module_address", ""), change["mode"], change["type"], change["name"])
        + ".*"
    )


PLAN2 = _plan_changes("plan2.json")


@pytest.mark.parametrize("change", PLAN2, ids=[c["address"] for c in PLAN2])
def test_globs_built_from_a_real_plan_match_terraforms_own_addresses(change: dict[str, Any]) -> None:
    address = change["address"]
    assert matches(parse_glob(address), address)
    assert matches(parse_glob("*"), address)
    if "module_address" in change:
        assert matches(parse_glob(change["module_address"] + ".*"), address)
    own = _resource_glob_text(change)
    assert matches(parse_glob(own), address)
    others = {_resource_glob_text(c) for c in PLAN2} - {own}
    assert others, "the plan has other resources to tell apart"
    assert [g for g in sorted(others) if matches(parse_glob(g), address)] == []


def test_the_real_plan_has_keyed_unkeyed_and_module_addresses() -> None:
    addresses = {c["address"] for c in PLAN2}
    assert {"terraform_data.cbd", "terraform_data.web[0]", 'terraform_data.item["a"]'} <= addresses
    assert {"module.child.terraform_data.inner[0]", 'module.each["b"].terraform_data.inner[0]'} <= addresses


# --- type globs and covers -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("glob", "address", "expected"),
    [
        ("fakecloud_queue.*", "fakecloud_queue.a", True),
        ("fakecloud_queue.*", 'fakecloud_queue.b["k"]', True),
        ("fakecloud_queue.*", "fakecloud_queues.a", False),
        ("fakecloud_queue.*", "data.fakecloud_queue.a", False),
        ("fakecloud_queue.*", "module.m.fakecloud_queue.a", False),  # the root module's resources only
        ("module.m.fakecloud_queue.*", 'module.m["x"].fakecloud_queue.a[0]', True),
        ("module.m.fakecloud_queue.*", "module.m.module.n.fakecloud_queue.a", False),
        ('module.m["x"].fakecloud_queue.*', 'module.m["y"].fakecloud_queue.a', False),
        ("data.aws_ami.*", "data.aws_ami.x", True),
        ("data.aws_ami.*", "aws_ami.x", False),
    ],
)
def test_type_globs_match_every_instance_of_one_type_in_one_module(glob: str, address: str, expected: bool) -> None:
    assert matches(parse_glob(glob), address) is expected


def test_a_type_glob_covers_the_resources_of_its_type_and_meets_modules_above_it() -> None:
    queues = parse_glob("fakecloud_queue.*")
    assert covers(queues, parse_glob("fakecloud_queue.jobs.*"))
    assert covers(queues, parse_glob('fakecloud_queue.jobs["a"]'))
    assert not covers(parse_glob("fakecloud_queue.jobs.*"), queues)
    assert not intersects(queues, parse_glob("module.m.*"))
    assert intersects(parse_glob("module.m.x.*"), parse_glob("module.m.*"))
    assert not covers(parse_glob("module.m.x.*"), parse_glob("module.m.*"))
    assert covers(parse_glob("module.m.*"), parse_glob('module.m["k"].x.*'))
    assert not covers(parse_glob('module.m["k"].*'), parse_glob("module.m.x.*"))  # keyless: any key


def test_covers_between_outputs_and_everything() -> None:
    assert covers(parse_glob("*"), parse_glob("output.x"))
    assert covers(parse_glob("output.*"), parse_glob("output.x"))
    assert not covers(parse_glob("output.x"), parse_glob("output.*"))
    assert not covers(parse_glob("output.*"), parse_glob("*"))
    assert not covers(parse_glob("module.m.*"), parse_glob("output.x"))
    assert not covers(parse_glob("output.*"), parse_glob("x.y"))
    assert covers(parse_glob("output.pay_*"), parse_glob("output.pay_url"))
    assert covers(parse_glob("output.pay_*"), parse_glob("output.pay_eu_*"))
    assert covers(parse_glob("output.*"), parse_glob("output.pay_*"))
    assert not covers(parse_glob("output.pay_eu_*"), parse_glob("output.pay_*"))
    assert not covers(parse_glob("output.pay_url"), parse_glob("output.pay_*"))
    assert not covers(parse_glob("output.pay_*"), parse_glob("output.*"))
    assert not covers(parse_glob("output.pay_*"), parse_glob("output.pay"))


FRESH_KEY = "fresh"
FRESH_NAME = "fresh_name"
FRESH_OUTPUT = "fresh_output"


@st.composite
def open_universe_and_globs(
    draw: st.DrawFn,
) -> tuple[tuple[InstanceAddress, ...], tuple[str, ...], list[Glob]]:
    """Globs derived from a closed universe, and a wider universe to test them over: it adds no key, a key,
    a resource name of each type and a resource type that no glob names, an output no glob names and, for
    each output name prefix, a name it starts that no exact glob names. Where ``b`` has an
    address ``a`` lacks, one of these is a witness (a keyless step, a type glob or a module prefix covers
    more than any keyed step, resource name or type), so containment of masks over it is ``covers``."""
    names = draw(st.lists(st.sampled_from(MODULE_NAMES), min_size=1, max_size=2, unique=True))
    keys = draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True))
    resources = draw(st.lists(st.sampled_from(RESOURCES), min_size=1, max_size=2, unique=True))
    sources = draw(st.lists(st.sampled_from(build_universe(names, keys, resources)), min_size=1, max_size=6))
    globs = [draw(st.sampled_from(globs_from(address))) for address in sources]
    outputs = tuple(draw(st.lists(st.sampled_from(OUTPUT_NAMES), min_size=1, max_size=2, unique=True)))
    output_globs = [Glob.all_outputs(), *map(Glob.root_output, outputs), *output_prefixes(outputs)]
    globs += draw(st.lists(st.sampled_from(output_globs), max_size=3))
    # A name each prefix starts that no exact glob names: the witness that a prefix holds more than names.
    fresh_outputs = tuple(str(g.output) + "_fresh" for g in globs if g.kind is GlobKind.OUTPUT_PREFIX)
    wide_keys = tuple(dict.fromkeys((*keys, None, FRESH_KEY)))
    fresh = [(m, t, FRESH_NAME) for m, t, _ in resources] + [("managed", "fresh_type", FRESH_NAME)]
    wide_resources = tuple(dict.fromkeys((*resources, *fresh)))
    return (build_universe(names, wide_keys, wide_resources),
            tuple(dict.fromkeys((*outputs, *fresh_outputs, FRESH_OUTPUT))), globs)


@settings(max_examples=100, deadline=None)
@given(open_universe_and_globs())
def test_covers_agrees_with_brute_force_and_with_the_conflict_matrix(
    case: tuple[tuple[InstanceAddress, ...], tuple[str, ...], list[Glob]],
) -> None:
    """``covers(a, b)`` holds exactly when every address and output of ``b`` is one of ``a``; then every
    glob that meets ``b`` meets ``a``, so whatever conflicts with ``b`` conflicts with ``a``."""
    universe, outputs, globs = case
    masks = [coverage_mask(glob, universe, outputs) for glob in globs]
    for (a, mask_a), (b, mask_b) in itertools.product(zip(globs, masks, strict=True), repeat=2):
        assert covers(a, b) is (mask_b & ~mask_a == 0), (canonical(a), canonical(b))
        if covers(a, b):
            for c in globs:
                for mode_b, mode_c in itertools.product(("read", "write"), repeat=2):
                    assert not conflicts(mode_b, b, mode_c, c) or conflicts(mode_b, a, mode_c, c)


@given(all_globs)
def test_every_glob_covers_itself_and_everything_covers_it(glob: Glob) -> None:
    assert covers(glob, glob)
    assert covers(Glob.everything(), glob)
