"""The reservation conflict matrix as the store applies it (``find_conflicts``, ``blocks``), without a database:
read/read never conflicts, a write meets every intersecting read or write, ``*`` (Terraform's own lock) meets
everything, outputs only meet outputs, and expired holdings never block."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from analyzer.globs import READ, WRITE, conflicts, parse_glob
from app.domain.reservations import (
    Held,
    Mode,
    Wanted,
    blocks,
    find_conflicts,
    glob_root,
    lease_for,
    parse_wanted,
    shown_conflicts,
)
from app.errors import BadRequestError

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def held(glob: str, mode: str = "write", *, run: str = "ar_1",
         expires: timedelta | None = timedelta(minutes=5)) -> Held:
    return Held(glob=glob, mode=Mode(mode), holder="alice", run_id=run, acquired_at=NOW - timedelta(seconds=30),
                expires_at=None if expires is None else NOW + expires)


def wanted(glob: str, mode: str = "write") -> Wanted:
    return Wanted(glob=parse_glob(glob), mode=Mode(mode))


# (requested glob, held glob, whether they intersect)
PAIRS = [
    ("*", "*", True),
    ("*", "aws_s3_bucket.logs", True),
    ("*", "output.url", True),
    ("*", "data.aws_ami.base", True),
    ("module.web.*", "module.web.aws_instance.app[0]", True),
    ("module.web.*", "module.web[1].aws_instance.app", True),
    ("module.web.*", "module.webapp.aws_instance.app", False),  # a string prefix is not a module prefix
    ('module.net["a"].*', 'module.net["b"].x.y', False),
    ('module.net["a"].*', "module.net.*", True),
    ("module.a.module.b.*", 'module.a["k"].module.b["x"].t.n', True),
    ("aws_instance.web.*", "aws_instance.web[3]", True),
    ("aws_instance.web.*", "aws_instance.webs[3]", False),
    ("aws_instance.web.*", "module.m.aws_instance.web[3]", False),
    ("aws_instance.web[0]", "aws_instance.web[1]", False),
    ('aws_instance.web["a"]', 'aws_instance.web["a"]', True),
    ("data.aws_ami.base", "aws_ami.base", False),  # a data source is not the managed resource of that name
    ("data.aws_ami.base.*", "data.aws_ami.base", True),
    ("module.m.*", "module.m.data.aws_ami.base", True),
    ("output.url", "output.url", True),
    ("output.url", "output.other", False),
    ("output.*", "output.url", True),
    ("output.*", "aws_instance.web.*", False),  # outputs and instances never share an address
    ("output.url", "module.output.x.y", False),
]


@pytest.mark.parametrize(("a", "b", "meet"), PAIRS)
def test_write_meets_read_and_write_exactly_when_the_globs_intersect(a: str, b: str, meet: bool) -> None:
    for held_mode in ("read", "write"):
        found = find_conflicts([wanted(a, "write")], [held(b, held_mode)], NOW)
        assert bool(found) is meet, (a, held_mode, b)
        assert conflicts(WRITE, parse_glob(a), held_mode, parse_glob(b)) is meet
        # symmetric: the same answer with the sides swapped
        assert bool(find_conflicts([wanted(b, "write")], [held(a, held_mode)], NOW)) is meet


@pytest.mark.parametrize(("a", "b", "meet"), PAIRS)
def test_read_meets_only_held_writes(a: str, b: str, meet: bool) -> None:
    assert find_conflicts([wanted(a, "read")], [held(b, "read")], NOW) == []
    assert not conflicts(READ, parse_glob(a), READ, parse_glob(b))
    assert bool(find_conflicts([wanted(a, "read")], [held(b, "write")], NOW)) is meet


def test_terraforms_own_lock_is_a_write_on_everything() -> None:
    lock = held("*", "write", run="", expires=None)
    for glob in ("aws_instance.web[0]", "output.url", "module.x.*", "data.a.b"):
        for mode in ("read", "write"):
            [conflict] = find_conflicts([wanted(glob, mode)], [lock], NOW)
            assert conflict.held is lock and conflict.wanted.text == glob


def test_expired_holdings_never_block_unless_expiry_is_ignored() -> None:
    lapsed = held("module.web.*", expires=timedelta(seconds=-1))
    at_the_second = held("module.web.*", run="ar_2", expires=timedelta(0))
    ask = [wanted("module.web.x.y")]
    assert find_conflicts(ask, [lapsed, at_the_second], NOW) == []
    assert [c.held.run_id for c in find_conflicts(ask, [lapsed, at_the_second], None)] == ["ar_1", "ar_2"]
    assert find_conflicts(ask, [held("module.web.*", expires=None)], NOW) != []  # no lease: never lapses


def test_conflicts_come_in_request_order_and_stop_at_the_limit() -> None:
    holdings = [held("a.b[0]", run="ar_a"), held("c.d.*", "read", run="ar_c"), held("*", "read", run="ar_all")]
    ask = [wanted("c.d[1]"), wanted("x.y", "read"), wanted("a.b.*")]
    found = find_conflicts(ask, holdings, NOW)
    assert [c.wanted.text for c in found] == ["c.d[1]", "c.d[1]", "a.b.*", "a.b.*"]
    assert {c.held.run_id for c in found[:2]} == {"ar_c", "ar_all"}
    assert {c.held.run_id for c in found[2:]} == {"ar_a", "ar_all"}
    assert len(find_conflicts(ask, holdings, NOW, limit=2)) == 2
    shown, left_out = shown_conflicts(found, limit=3)
    assert len(shown) == 3 and left_out == 1
    assert shown_conflicts(found[:1], limit=3) == (found[:1], 0)


def test_an_earlier_waiter_blocks_only_a_competing_request() -> None:
    earlier = [[wanted("module.db.*", "read")], [wanted("output.url", "write")]]
    assert blocks([wanted("module.db.x.y", "write")], earlier)
    assert not blocks([wanted("module.db.x.y", "read")], earlier)  # read/read: no queue
    assert blocks([wanted("output.*", "read")], earlier)
    assert not blocks([wanted("module.web.*", "write")], earlier)
    assert not blocks([wanted("*", "read")], [[wanted("*", "read")]])
    assert blocks([wanted("*", "read")], [[wanted("a.b", "write")]])
    assert not blocks([wanted("*", "write")], [])


def test_parse_wanted_collapses_duplicates_and_reads_under_a_write_of_the_same_glob() -> None:
    parsed = parse_wanted([("a.b.*", "write"), ("a.b.*", "read"), ("c.d", "read"), ("c.d", "read"),
                           ("output.x", "read")])
    assert [(w.text, w.mode) for w in parsed] == [("a.b.*", Mode.WRITE), ("c.d", Mode.READ),
                                                  ("output.x", Mode.READ)]


@pytest.mark.parametrize(("items", "message"), [
    ([("a.b", "exclusive")], "unknown reservation mode 'exclusive'"),
    ([("module.web*", "write")], "invalid reservation glob 'module.web*'"),
    ([("", "read")], "invalid reservation glob ''"),
    ([("a.b", "read")] * 4, "at most 3 reservation globs"),
])
def test_parse_wanted_refuses_bad_requests_naming_the_problem(items: list[tuple[str, str]], message: str) -> None:
    with pytest.raises(BadRequestError, match=re.escape(message)):
        parse_wanted(items, limit=3)


def test_parse_wanted_counts_duplicates_against_the_limit() -> None:
    assert len(parse_wanted([("a.b", "read")] * 3, limit=3)) == 1


@pytest.mark.parametrize(("glob", "root"), [
    ("*", "*"), ("output.x", "output"), ("output.*", "output"), ("module.web.*", "module.web"),
    ('module.web["a"].module.x.t.n', "module.web"), ("aws_instance.web[2]", "aws_instance.web"),
    ("aws_instance.web.*", "aws_instance.web"), ("data.aws_ami.base", "data.aws_ami.base"),
])
def test_glob_root_is_the_first_step(glob: str, root: str) -> None:
    assert glob_root(glob) == root


def test_globs_with_different_roots_never_intersect() -> None:
    globs = [a for a, _, _ in PAIRS] + [b for _, b, _ in PAIRS]
    for a in globs:
        for b in globs:
            ra, rb = glob_root(a), glob_root(b)
            if "*" not in (ra, rb) and ra != rb:
                assert not conflicts(WRITE, parse_glob(a), WRITE, parse_glob(b)), (a, b)


@pytest.mark.parametrize(("seconds", "expected"), [(None, timedelta(minutes=15)), (1, timedelta(seconds=1)),
                                                   (43200, timedelta(hours=12)), (90.5, timedelta(seconds=90.5))])
def test_lease_for_accepts_one_second_to_twelve_hours(seconds: float | None, expected: timedelta) -> None:
    assert lease_for(seconds) == expected


@pytest.mark.parametrize("seconds", [0, 0.5, 43201, -1, 1e300])
def test_lease_for_refuses_leases_out_of_range(seconds: float) -> None:
    with pytest.raises(BadRequestError, match="lease_seconds must be between 1 and 43200"):
        lease_for(seconds)
