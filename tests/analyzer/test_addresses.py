"""Instance address formatting, parsing and prefix matching, checked against Terraform's own rules."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.addresses import (
    AddressError,
    InstanceAddress,
    ModuleStep,
    format_index_key,
    format_module_path,
    has_prefix,
    instance_address,
    parse_instance_address,
    parse_module_path,
    quote_hcl_string,
    resource_address,
)


@pytest.mark.parametrize(
    ("raw", "quoted"),
    [
        ("", '""'),
        ("a", '"a"'),
        ('a"b', '"a\\"b"'),
        ("back\\slash", '"back\\\\slash"'),
        ("${x}", '"$${x}"'),
        ("%{y}", '"%%{y}"'),
        ("$x %y $ %", '"$x %y $ %"'),
        ("$${", '"$$${"'),
        ("a\nb\rc\td", '"a\\nb\\rc\\td"'),
        ("a.b[c]", '"a.b[c]"'),
        ("héllo wörld", '"héllo wörld"'),
        ("😀", '"😀"'),
        ("\x00\x7f", '"\\u0000\\u007f"'),
        ("\u200b", '"\\u200b"'),
        ("\u00a0", '"\\u00a0"'),
        ("\U000e0001", '"\\U000e0001"'),
    ],
)
def test_quote_hcl_string_matches_terraforms_to_hcl_quoted_string(raw: str, quoted: str) -> None:
    assert quote_hcl_string(raw) == quoted


@pytest.mark.parametrize(
    ("key", "text"), [(None, ""), (0, "[0]"), (12, "[12]"), ("a", '["a"]'), ("", '[""]')]
)
def test_format_index_key_writes_no_key_int_keys_and_quoted_string_keys(
    key: int | str | None, text: str
) -> None:
    assert format_index_key(key) == text


def test_format_index_key_refuses_a_boolean_because_json_true_is_not_a_key() -> None:
    with pytest.raises(TypeError, match="instance key"):
        format_index_key(True)


def test_resource_and_instance_addresses_follow_terraforms_canonical_form() -> None:
    assert resource_address("", "managed", "terraform_data", "web") == "terraform_data.web"
    assert resource_address("", "data", "terraform_remote_state", "o") == "data.terraform_remote_state.o"
    assert (
        instance_address('module.each["a"]', "managed", "terraform_data", "inner", 0)
        == 'module.each["a"].terraform_data.inner[0]'
    )
    assert instance_address("module.c", "data", "x", "y", "k") == 'module.c.data.x.y["k"]'
    assert instance_address("", "managed", "terraform_data", "cbd", None) == "terraform_data.cbd"


def test_resource_address_rejects_an_unknown_mode() -> None:
    with pytest.raises(ValueError, match="'ephemeral'"):
        resource_address("", "ephemeral", "x", "y")


def test_parse_instance_address_splits_module_steps_mode_type_name_and_key() -> None:
    parsed = parse_instance_address('module.a["x"].module.b[2].data.aws_ami.u["k.1"]')
    assert parsed == InstanceAddress(
        module=(ModuleStep("a", "x"), ModuleStep("b", 2)), mode="data", type="aws_ami", name="u", key="k.1"
    )
    assert parsed.module_path == 'module.a["x"].module.b[2]'
    assert parsed.resource_address == 'module.a["x"].module.b[2].data.aws_ami.u'


@pytest.mark.parametrize(
    "address",
    [
        "terraform_data.cbd",
        "terraform_data.web[0]",
        'terraform_data.item["a"]',
        "data.terraform_remote_state.other",
        "module.child.terraform_data.inner[0]",
        'module.each["a"].terraform_data.inner[0]',
        'module.a["x"].module.b.aws_instance.web-1["k"]',
        'terraform_data.item["a\\"b"]',
        'terraform_data.item["$${x}"]',
        'terraform_data.item["%%{y}"]',
        'terraform_data.item["line\\nbreak\\ttab\\r"]',
        'terraform_data.item["héllo 😀"]',
        'terraform_data.item["\\u200b\\U000e0001"]',
        'terraform_data.item["a.b[c]"]',
        'module.m["].x["].terraform_data.item["]"]',
        'terraform_data.item["back\\\\slash"]',
        'terraform_data.item[""]',
    ],
)
def test_addresses_terraform_prints_round_trip_through_parse_and_format(address: str) -> None:
    assert str(parse_instance_address(address)) == address


@pytest.mark.parametrize(
    "key", ['a"b', "${x}", "%{y}", "a\nb", "héllo\u200b😀", "a.b[c]", '"]', "\\", "$${", "%%{", "$", "%"]
)
def test_tricky_string_keys_survive_format_then_parse(key: str) -> None:
    address = instance_address('module.m["k"]', "managed", "terraform_data", "item", key)
    assert parse_instance_address(address).key == key


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "it is empty"),
        ("terraform_data", "at character 15: expected '.' between resource type and name"),
        ("terraform_data.web.extra", "at character 19: expected the end of the address"),
        (
            "terraform_data.web[x]",
            'at character 20: expected an instance key: an integer or a "quoted string"',
        ),
        ('terraform_data.web["a]', "at character 20: this string key is never closed"),
        ("terraform_data.web[0", "at character 21: expected ']'"),
        ('terraform_data.web["${x}"]', "at character 21: '${' would start a template; write '$${'"),
        ('terraform_data.web["%{x}"]', "at character 21: '%{' would start a template; write '%%{'"),
        ('terraform_data.web["\\q"]', "at character 21: expected an escape"),
        ('terraform_data.web["\\u12"]', "at character 21: expected \\u followed by 4 hex digits"),
        ('terraform_data.web["a\nb"]', "at character 22: a string key cannot contain a line break"),
        ("module.child", "names the module module.child but no resource"),
        ("module..x.y", "at character 8: expected a module name"),
        ("1abc.x", "at character 1: expected a module step or a resource type"),
        ("terraform_data .x", "at character 15"),
    ],
)
def test_parse_instance_address_says_what_is_wrong_and_where(text: str, message: str) -> None:
    with pytest.raises(AddressError) as caught:
        parse_instance_address(text)
    assert message in str(caught.value)


def test_parse_module_path_reads_canonical_module_strings_and_the_root() -> None:
    assert parse_module_path("") == ()
    steps = parse_module_path('module.each["a"].module.inner[0]')
    assert steps == (ModuleStep("each", "a"), ModuleStep("inner", 0))
    assert format_module_path(steps) == 'module.each["a"].module.inner[0]'
    with pytest.raises(AddressError, match="names a resource"):
        parse_module_path("module.a.terraform_data.x")


@pytest.mark.parametrize(
    ("address", "prefix", "covered"),
    [
        ("module.web.x.y", "module.web", True),
        ('module.web["a"].x.y', "module.web", True),
        ("module.web[3].x.y", "module.web", True),
        ("module.webapp.x.y", "module.web", False),
        ('module.web["a"].x.y', 'module.web["a"]', True),
        ('module.web["b"].x.y', 'module.web["a"]', False),
        ("module.web.x.y", 'module.web["a"]', False),
        ("module.web.module.db.x.y", "module.web", True),
        ('module.web["a"].module.db[0].x.y', 'module.web["a"].module.db', True),
        ('module.web["a"].module.db.x.y', "module.web.module.db", False),
        ("x.y", "module.web", False),
        ('terraform_data.item["a"]', "terraform_data.item", True),
        ("terraform_data.item", "terraform_data.item", True),
        ("terraform_data.item[0]", "terraform_data.item", True),
        ("terraform_data.items", "terraform_data.item", False),
        ("data.terraform_data.item", "terraform_data.item", False),
        ("module.web.terraform_data.item", "terraform_data.item", False),
        ('module.web["a"].terraform_data.item', "module.web.terraform_data.item", False),
        ('terraform_data.item["a"]', 'terraform_data.item["a"]', True),
        ('terraform_data.item["b"]', 'terraform_data.item["a"]', False),
        ("terraform_data.item[1]", 'terraform_data.item["1"]', False),
        ('module.m["a.b"].x.y', 'module.m["a.b"]', True),
        ("module.web.x.y", "module.we", False),
    ],
)
def test_has_prefix_compares_parsed_steps_not_strings(address: str, prefix: str, covered: bool) -> None:
    assert has_prefix(address, prefix) is covered


@pytest.mark.parametrize(
    "prefix", ["", "module.", "terraform_data", 'module.web["a"', "module.web.", "x.y.z"]
)
def test_has_prefix_rejects_an_invalid_prefix(prefix: str) -> None:
    with pytest.raises(AddressError):
        has_prefix("module.web.x.y", prefix)


def test_has_prefix_rejects_an_address_that_is_not_an_instance() -> None:
    with pytest.raises(AddressError, match="no resource"):
        has_prefix("module.web", "module.web")


_identifiers = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,8}", fullmatch=True)
# Surrogates and other non-printables are included on purpose: they take the \u escape path.
_keys = (
    st.none()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.text(st.characters(exclude_categories=()))
)
_addresses = st.builds(
    InstanceAddress,
    module=st.lists(st.builds(ModuleStep, _identifiers, _keys), max_size=3).map(tuple),
    mode=st.sampled_from(["managed", "data"]),
    type=_identifiers.filter(lambda word: word not in ("module", "data")),
    name=_identifiers,
    key=_keys,
)


@settings(database=None)  # nothing to replay across runs, and no .hypothesis directory in the tree
@given(_addresses)
def test_every_formatted_address_parses_back_to_the_same_steps(address: InstanceAddress) -> None:
    text = str(address)
    assert parse_instance_address(text) == address
    assert has_prefix(text, text)
    assert has_prefix(text, address.resource_address)
    if address.module:
        last = address.module[-1]
        assert has_prefix(text, address.module_path)
        assert has_prefix(text, format_module_path((*address.module[:-1], ModuleStep(last.name))))
