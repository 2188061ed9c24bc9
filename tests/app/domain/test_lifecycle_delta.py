"""The lifecycle delta without a database: which live rows a new state version closes and which it opens."""

from __future__ import annotations

from analyzer.state import InstanceRow
from app.domain.lifecycle import LifecycleDelta, OpenRow, lifecycle_delta


def row(address: str, digest: str, deposed: str = "") -> InstanceRow:
    return InstanceRow(address=address, resource_address=address, module="", mode="managed", type="t", name="n",
                       index_key=None, deposed=deposed, provider="p", instance_json="{}", attributes_hash=digest,
                       dependencies=(), status="")


OPEN = {("a.x", ""): OpenRow(11, "ha"), ("b.y", ""): OpenRow(12, "hb"), ("b.y", "dead0001"): OpenRow(13, "hd"),
        ("c.z", ""): OpenRow(14, "hc")}


def test_unchanged_rows_stay_open_changed_ones_close_and_reopen_absent_ones_close() -> None:
    delta = lifecycle_delta(OPEN, [row("c.z", "hc2"), row("a.x", "ha"), row("b.y", "hb"), row("new.q", "hq")])
    # b.y's deposed object is gone; c.z changed
    assert delta.close_ids == (13, 14)
    assert [(r.address, r.attributes_hash) for r in delta.inserts] == [("c.z", "hc2"), ("new.q", "hq")]
    assert not delta.is_empty


def test_the_same_instances_are_an_empty_delta() -> None:
    same = [row(address, r.attributes_hash, deposed) for (address, deposed), r in OPEN.items()]
    assert lifecycle_delta(OPEN, same) == LifecycleDelta(close_ids=(), inserts=())
    assert lifecycle_delta(OPEN, same).is_empty


def test_an_empty_version_closes_every_row_sorted_and_a_first_version_opens_every_instance() -> None:
    assert lifecycle_delta(OPEN, []).close_ids == (11, 12, 13, 14)
    fresh = [row("a.x", "ha"), row("a.x", "hd", "dead0002")]
    delta = lifecycle_delta({}, fresh)
    assert delta.close_ids == () and delta.inserts == tuple(fresh)


def test_a_deposed_object_is_its_own_row() -> None:
    # the current object became deposed: the old current row closes, two rows open
    delta = lifecycle_delta({("a.x", ""): OpenRow(1, "old")}, [row("a.x", "new"), row("a.x", "old", "dead0003")])
    assert delta.close_ids == (1,)
    assert [(r.deposed, r.attributes_hash) for r in delta.inserts] == [("", "new"), ("dead0003", "old")]
