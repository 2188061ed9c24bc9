"""Row-level commit rules without a database: the commit delta, writes outside the reservations, stale reads,
data sources Terraform re-read, and how root outputs merge into the trunk."""

from __future__ import annotations

import pytest

from analyzer.addresses import AddressError
from analyzer.state import InstanceRow, OutputRow
from app.domain.commit import (
    GlobCoverage,
    changed_outputs,
    check_addresses,
    commit_delta,
    is_data_source,
    merge_outputs,
    outputs_outside,
    outside,
    parse_globs,
    stale,
    stale_outputs,
    unreserved_read,
)
from app.errors import BadRequestError


def row(address: str, digest: str, deposed: str = "") -> InstanceRow:
    return InstanceRow(address=address, resource_address=address.split("[")[0], module="", mode="managed",
                       type="t", name="n", index_key=None, deposed=deposed, provider="p", instance_json="{}",
                       attributes_hash=digest, dependencies=(), status="")


def out(name: str, value: str = '"v"', *, sensitive: bool = False) -> OutputRow:
    return OutputRow(name=name, value_json=value, type_json='"string"', sensitive=sensitive)


BASE = {("a.x[0]", ""): "h0", ("a.x[1]", ""): "h1", ("a.x[1]", "dead0001"): "hd", ("b.y", ""): "hb",
        ("c.z", ""): "hc"}


def test_the_delta_is_what_changed_was_created_or_was_destroyed_within_the_slice() -> None:
    result = [row("a.x[0]", "h0"), row("a.x[1]", "h1-new"), row("a.x[2]", "h2"), row("b.y", "hb")]
    delta = commit_delta(BASE, result, ["a.x[0]", "a.x[1]", "b.y"])
    assert [(r.address, r.attributes_hash) for r in delta.upserts] == [("a.x[1]", "h1-new"), ("a.x[2]", "h2")]
    assert (delta.created, delta.updated) == (1, 1)
    # the deposed object of a.x[1] vanished; c.z is outside the slice, so its absence is no delete
    assert delta.deletes == (("a.x[1]", "dead0001"),)
    assert delta.addresses == ("a.x[1]", "a.x[2]")
    assert not delta.is_empty


def test_an_unchanged_slice_is_an_empty_delta() -> None:
    delta = commit_delta(BASE, [row("a.x[0]", "h0"), row("b.y", "hb")], ["a.x[0]", "b.y"])
    assert delta.is_empty and delta.addresses == () and (delta.created, delta.updated) == (0, 0)


def test_a_slice_address_the_result_lacks_is_destroyed_with_its_deposed_objects() -> None:
    delta = commit_delta(BASE, [], ["a.x[1]", "missing.one"])
    assert delta.deletes == (("a.x[1]", ""), ("a.x[1]", "dead0001"))
    assert delta.upserts == () and delta.addresses == ("a.x[1]",)


def test_an_address_only_in_the_result_still_counts_as_in_the_slice() -> None:
    # a.x[1] is not listed in the slice, but the apply returned its current object: its deposed one went away
    delta = commit_delta(BASE, [row("a.x[1]", "h1")], [])
    assert delta.deletes == (("a.x[1]", "dead0001"),) and delta.upserts == ()


def test_skipped_addresses_are_left_out_on_both_sides() -> None:
    delta = commit_delta(BASE, [row("b.y", "changed"), row("new.one", "n")], ["b.y", "c.z"],
                         skip=lambda address: address in ("b.y", "c.z"))
    assert [r.address for r in delta.upserts] == ["new.one"] and delta.deletes == ()


@pytest.mark.parametrize(("address", "data"), [
    ("data.aws_ami.base", True), ("module.m.data.aws_ami.base[0]", True), ("module.data.x.y", False),
    ('x.y["bucket.data.eu"]', False), ("aws_ami.data", False),
])
def test_a_data_source_is_told_by_its_parsed_mode(address: str, data: bool) -> None:
    assert is_data_source(address) is data


def test_unreserved_data_sources_are_skipped_and_managed_resources_never() -> None:
    skip = unreserved_read(parse_globs(["module.app.*", "data.aws_ami.pinned"]))
    assert skip("data.aws_ami.base")
    assert not skip("data.aws_ami.pinned")  # reserved for writing: its new read is committed
    assert not skip("module.app.data.aws_ami.base")
    assert not skip("aws_instance.outside")  # managed: ``outside`` refuses it instead


def test_outside_lists_the_addresses_no_glob_covers() -> None:
    globs = parse_globs(["module.web.*", "aws_s3_bucket.logs.*", 'aws_instance.db["a"]'])
    addresses = ["module.web[0].x.y", "module.webapp.x.y", "aws_s3_bucket.logs[3]", "aws_s3_bucket.logs2",
                 'aws_instance.db["a"]', 'aws_instance.db["b"]', "module.webapp.x.y"]
    assert outside(addresses, globs) == ['aws_instance.db["b"]', "aws_s3_bucket.logs2", "module.webapp.x.y"]
    assert outside(addresses, parse_globs(["*"])) == []
    assert outside(addresses, []) == sorted(set(addresses))
    assert outside(["aws_s3_bucket.logs[3]"], parse_globs(["output.*"])) == ["aws_s3_bucket.logs[3]"]


def test_a_root_resource_of_type_output_is_covered_by_star_only() -> None:
    assert not GlobCoverage(parse_globs(["output.*", "output.x"])).covers("output.x")
    assert GlobCoverage(parse_globs(["*"])).covers("output.x")
    with pytest.raises(AddressError):
        GlobCoverage(parse_globs(["*"])).covers("not an address")


def test_stale_lists_reserved_rows_changed_after_the_base_serial() -> None:
    changed = [("module.db.x.y", 7), ("module.db.x.y", 7), ("module.web.x.y", 8), ("data.a.b", 9)]
    assert stale(changed, parse_globs(["module.db.*", "data.a.b"])) == [("data.a.b", 9), ("module.db.x.y", 7)]
    assert stale(changed, parse_globs(["output.*"])) == []


def test_check_addresses_names_the_first_bad_address() -> None:
    assert check_addresses(["a.b", "module.m.c.d[0]"], "write_set") == ["a.b", "module.m.c.d[0]"]
    with pytest.raises(BadRequestError, match=r"write_set: 'a\.b\.\*' is not an instance address"):
        check_addresses(["a.b", "a.b.*", "nope"], "write_set")


def test_changed_outputs_are_added_changed_and_when_pruning_removed() -> None:
    base = [out("same"), out("changed"), out("gone"), out("secret")]
    result = [out("same"), out("changed", '"w"'), out("new"), out("secret", sensitive=True)]
    assert changed_outputs(base, result) == ["changed", "gone", "new", "secret"]
    assert changed_outputs(base, result, prune=False) == ["changed", "new", "secret"]
    assert changed_outputs(base, base) == []


def test_outputs_outside_the_write_globs() -> None:
    names = ["url", "id", "url"]
    assert outputs_outside(names, parse_globs(["output.url", "module.x.*"])) == ["id"]
    assert outputs_outside(names, parse_globs(["output.*"])) == []
    assert outputs_outside(names, parse_globs(["*"])) == []
    assert outputs_outside(names, parse_globs(["aws_instance.url"])) == ["id", "url"]


def test_stale_outputs_are_reserved_outputs_whose_trunk_value_moved() -> None:
    base = [out("url"), out("id"), out("gone"), out("free")]
    head = [out("url", '"new"'), out("id"), out("added"), out("free", '"x"')]
    assert stale_outputs(base, head, parse_globs(["output.url", "output.id", "output.gone", "output.added"])) == [
        "added", "gone", "url"]
    assert stale_outputs(base, head, parse_globs(["*"])) == ["added", "free", "gone", "url"]
    assert stale_outputs(base, head, parse_globs(["module.x.*"])) == []


def test_merge_takes_only_what_the_apply_changed_and_keeps_concurrent_commits() -> None:
    head = [out("mine", '"trunk"'), out("theirs", '"concurrent"'), out("dropped")]
    base = [out("mine", '"base"'), out("theirs", '"base"'), out("dropped")]
    result = [out("mine", '"applied"'), out("theirs", '"base"'), out("added")]
    merged = merge_outputs(head, base, result)
    assert [(o.name, o.value_json) for o in merged] == [
        ("added", '"v"'), ("mine", '"applied"'), ("theirs", '"concurrent"')]
    kept = merge_outputs(head, base, result, prune=False)
    assert [o.name for o in kept] == ["added", "dropped", "mine", "theirs"]
    assert merge_outputs(head, base, base) == tuple(sorted(head, key=lambda o: o.name))


def test_a_commit_that_does_not_prune_drops_exactly_the_removed_outputs_the_result_lacks() -> None:
    head = [out("deleted"), out("theirs"), out("kept"), out("back")]
    base = [out("deleted"), out("theirs"), out("kept"), out("back")]
    result = [out("kept"), out("back")]
    removed = frozenset({"deleted", "back", "never_there"})
    assert changed_outputs(base, result, prune=removed) == ["deleted"]
    merged = merge_outputs(head, base, result, prune=removed)
    assert [o.name for o in merged] == ["back", "kept", "theirs"]
