"""The glob index answers exactly what pairwise ``intersects`` answers, without the pairwise loop."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.addresses import InstanceAddress
from analyzer.globs import Glob, canonical, intersects, parse_glob
from app.domain.globindex import GlobIndex
from tests.analyzer.test_globs import all_globs, build_universe, globs_from, universe_outputs_and_globs


@settings(max_examples=200, deadline=None)
@given(universe_outputs_and_globs(), st.data())
def test_index_finds_exactly_the_intersecting_globs_over_closed_universes(
    case: tuple[tuple[InstanceAddress, ...], tuple[str, ...], list[Glob]], data: st.DataObject
) -> None:
    _, _, globs = case
    held = globs[: len(globs) // 2 + 1]
    index = GlobIndex((g, i) for i, g in enumerate(held))
    assert len(index) == len(held)
    for query in globs:
        found = [i for _, i in index.meeting(query)]
        assert len(found) == len(set(found)), "each entry is met once"
        expected = {i for i, g in enumerate(held) if intersects(query, g)}
        assert set(found) == expected, (canonical(query), [canonical(g) for g in held])
        assert index.any_meeting(query) is bool(expected)


@settings(max_examples=300, deadline=None)
@given(st.lists(all_globs, min_size=1, max_size=8), all_globs)
def test_index_agrees_with_intersects_for_arbitrary_globs(held: list[Glob], query: Glob) -> None:
    index = GlobIndex((g, i) for i, g in enumerate(held))
    found = sorted(i for _, i in index.meeting(query))
    assert found == [i for i, g in enumerate(held) if intersects(query, g)]


def test_index_agrees_with_intersects_for_every_pair_in_a_fixed_universe() -> None:
    universe = build_universe(("web", "webapp"), (None, 0, "a.b"), (("managed", "x", "y"), ("data", "x", "y")))
    globs = list(dict.fromkeys(glob for address in universe for glob in globs_from(address)))
    globs += [parse_glob("output.o1"), parse_glob("output.o2"), parse_glob("output.*")]
    index = GlobIndex((g, i) for i, g in enumerate(globs))
    for query in globs:
        found = sorted(i for _, i in index.meeting(query))
        assert found == [i for i, g in enumerate(globs) if intersects(query, g)], canonical(query)
    assert len(globs) > 300


def test_index_meets_only_its_own_branch_among_many_disjoint_globs() -> None:
    held = [parse_glob(f"terraform_data.r{i}") for i in range(2000)]
    held += [parse_glob(f'module.m["k{i}"].*') for i in range(500)]
    index = GlobIndex((g, canonical(g)) for g in held)
    assert [t for _, t in index.meeting(parse_glob("terraform_data.r7"))] == ["terraform_data.r7"]
    assert [t for _, t in index.meeting(parse_glob("terraform_data.r7.*"))] == ["terraform_data.r7"]
    assert [t for _, t in index.meeting(parse_glob('module.m["k3"].x.y'))] == ['module.m["k3"].*']
    assert len(list(index.meeting(parse_glob("module.m.*")))) == 500
    assert len(list(index.meeting(parse_glob("*")))) == 2500
    assert list(index.meeting(parse_glob("output.*"))) == []
    assert not any(itertools.islice(index.meeting(parse_glob("module.n.*")), 1))


def test_glob_root_reads_the_parsed_first_step() -> None:
    from app.domain.reservations import glob_root

    assert glob_root("*") == "*"
    assert glob_root("output.o1") == glob_root("output.*") == "output"
    assert glob_root('module.web["a.b"].x.y') == "module.web"
    assert glob_root('module.m["module.x"].*') == "module.m"
    assert glob_root('aws_instance.web["data.x"]') == "aws_instance.web"
    assert glob_root("data.aws_ami.x.*") == "data.aws_ami.x"
    assert glob_root("module.data.terraform_data.q") == "module.data"
    assert glob_root("aws_iam_role.*") == glob_root("data.aws_ami.*") == "*"  # meets many TYPE.NAME roots
    assert glob_root("module.m.aws_iam_role.*") == "module.m"


@settings(max_examples=300, deadline=None)
@given(all_globs, all_globs)
def test_intersecting_globs_share_a_root_or_one_is_everything(a: Glob, b: Glob) -> None:
    from app.domain.reservations import glob_root

    ra, rb = glob_root(canonical(a)), glob_root(canonical(b))
    if intersects(a, b):
        assert ra == rb or "*" in (ra, rb)


def test_the_index_keeps_every_payload_and_tells_keyless_steps_apart() -> None:
    held = [("module.web.*", "any-key"), ("module.web.x.y", "no-key"), ('module.web["a"].x.y', "key-a"),
            ("module.web.*", "any-key-again"), ("*", "all"), ("output.url", "out")]
    index = GlobIndex((parse_glob(text), payload) for text, payload in held)
    assert len(index) == 6

    def met(query: str) -> set[str]:
        return {payload for _, payload in index.meeting(parse_glob(query))}

    assert met('module.web["a"].x.y') == {"any-key", "any-key-again", "key-a", "all"}
    assert met("module.web.x.y") == {"any-key", "any-key-again", "no-key", "all"}
    assert met('module.web["b"].x.y') == {"any-key", "any-key-again", "all"}
    assert met("module.webapp.x.y") == {"all"}
    assert met("output.*") == {"out", "all"}
    assert met("output.other") == {"all"}
    assert met("*") == {payload for _, payload in held}
    assert not GlobIndex[str]().any_meeting(parse_glob("*"))
