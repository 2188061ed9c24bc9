"""The Gantt layout is pure geometry: overlapping windows give overlapping bars."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from app.web.timeline import AXIS_HEIGHT, MIN_WIDTH, ROW_HEIGHT, layout

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@dataclass(frozen=True)
class FakeRun:
    id: str
    status: str
    created_at: datetime
    finished_at: datetime | None = None
    actor: str = "someone"
    committed_serial: int | None = None
    info: dict[str, object] = field(default_factory=dict)


def minutes_ago(m: float) -> datetime:
    return NOW - timedelta(minutes=m)


def test_overlapping_windows_give_overlapping_bars_on_separate_rows():
    chart = layout([FakeRun("b", "running", minutes_ago(6)),
                    FakeRun("a", "committed", minutes_ago(10), minutes_ago(2), committed_serial=7)], NOW)
    a, b = chart.bars
    assert (a.run_id, b.run_id) == ("a", "b")  # oldest first
    assert a.x == 0 and a.x < b.x < a.x + a.width < b.x + b.width
    assert a.y < b.y and b.y - a.y == ROW_HEIGHT and a.y >= AXIS_HEIGHT
    assert b.live and not a.live and a.committed_serial == 7


def test_disjoint_windows_do_not_overlap_and_widths_are_proportional():
    chart = layout([FakeRun("old", "failed", minutes_ago(20), minutes_ago(15)),
                    FakeRun("new", "aborted", minutes_ago(10), minutes_ago(0))], NOW)
    old, new = chart.bars
    assert old.x + old.width < new.x
    assert abs(new.width - 2 * old.width) < 0.01


def test_live_runs_reach_now_whatever_their_finished_at_says():
    chart = layout([FakeRun("a", "committed", minutes_ago(10), minutes_ago(5)),
                    FakeRun("live", "reserved", minutes_ago(8))], NOW)
    live = chart.bars[1]
    assert live.end == NOW and live.x + live.width > 97


def test_an_instant_run_still_shows_and_no_bar_leaves_the_chart():
    chart = layout([FakeRun("a", "committed", minutes_ago(60), minutes_ago(0)),
                    FakeRun("blink", "failed", minutes_ago(0), minutes_ago(0))], NOW)
    blink = chart.bars[1]
    assert blink.width >= min(MIN_WIDTH, 100 - blink.x) and blink.x + blink.width <= 100
    assert all(0 <= b.x <= 100 and b.x + b.width <= 100.001 for b in chart.bars)


def test_ticks_fall_inside_the_window_with_readable_steps():
    chart = layout([FakeRun("a", "committed", minutes_ago(30), minutes_ago(0))], NOW)
    assert 3 <= len(chart.ticks) <= 8
    assert all(0 <= t.x <= 100 for t in chart.ticks)
    assert [t.label for t in chart.ticks][:2] == ["11:35:00", "11:40:00"]
    days = layout([FakeRun("a", "committed", NOW - timedelta(days=3), NOW)], NOW)
    assert all(len(t.label) == len("03-01 12:00") for t in days.ticks)


def test_no_runs_is_an_empty_chart():
    assert layout([], NOW).bars == ()


def test_a_dry_run_reads_as_a_dry_run_not_as_an_abort():
    chart = layout([FakeRun("d", "aborted", minutes_ago(3), minutes_ago(2), info={"dry_run": True}),
                    FakeRun("a", "aborted", minutes_ago(5), minutes_ago(4))], NOW)
    assert {b.run_id: b.status for b in chart.bars} == {"d": "dry-run", "a": "aborted"}
