"""The Gantt layout of apply runs: pure geometry for the dashboard's SVG timeline.

Runs in, bars out: one row per run (oldest first), each bar spanning opened → closed (live runs
reach ``now``) as percentages of the chart's time window, so two runs whose windows overlap get
bars whose horizontal extents overlap. Time is a parameter; nothing here touches Flask or SQL.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from app.domain.reservations import LIVE_STATUSES

ROW_HEIGHT = 26
BAR_HEIGHT = 18
AXIS_HEIGHT = 24
MIN_WIDTH = 0.6  # percent: a run that lasted a blink still shows
_STEPS = tuple(timedelta(seconds=s) for s in (
    1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800))
_MAX_TICKS = 8


class RunWindow(Protocol):
    """What the layout reads from an apply run (``app.store.runs.Run`` fits)."""

    @property
    def id(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def actor(self) -> str: ...
    @property
    def created_at(self) -> datetime: ...
    @property
    def finished_at(self) -> datetime | None: ...
    @property
    def committed_serial(self) -> int | None: ...
    @property
    def info(self) -> dict[str, object]: ...


def shown_status(status: str, info: dict[str, object] | None) -> str:
    """The status as an operator should read it: a ``kl apply --dry-run`` ends its run as aborted, but
    it is a rehearsal, not an abort, so it shows as ``dry-run``."""
    return "dry-run" if status == "aborted" and (info or {}).get("dry_run") else status


@dataclass(frozen=True, slots=True)
class Bar:
    run_id: str
    status: str
    actor: str
    row: int
    x: float
    width: float
    y: int
    start: datetime
    end: datetime
    live: bool
    committed_serial: int | None

    @property
    def label_inside(self) -> bool:
        """Whether the serial label goes inside the bar's right end (no room after it)."""
        return self.x + self.width > 90


@dataclass(frozen=True, slots=True)
class Tick:
    x: float
    label: str


@dataclass(frozen=True, slots=True)
class Chart:
    start: datetime
    end: datetime
    bars: tuple[Bar, ...]
    ticks: tuple[Tick, ...]
    height: int


def _step(span: timedelta) -> timedelta:
    for step in _STEPS:
        if span / step <= _MAX_TICKS:
            return step
    return _STEPS[-1]


def _label(at: datetime, span: timedelta) -> str:
    return at.strftime("%H:%M:%S") if span < timedelta(days=1) else at.strftime("%m-%d %H:%M")


def layout(runs: Sequence[RunWindow], now: datetime) -> Chart:
    """Place each run on a shared time axis: ``x`` and ``width`` are percentages of the window."""
    ordered = sorted(runs, key=lambda r: (r.created_at, r.id))
    if not ordered:
        return Chart(start=now, end=now, bars=(), ticks=(), height=AXIS_HEIGHT)
    ends = [(r.finished_at or now) if r.status not in LIVE_STATUSES else now for r in ordered]
    start = min(r.created_at for r in ordered)
    end = max(max(ends), start + timedelta(seconds=1))
    span = (end - start) * 1.02  # a little room after the last bar
    bars = []
    for row, (run, finish) in enumerate(zip(ordered, ends, strict=True)):
        x = (run.created_at - start) / span * 100
        width = min(max((max(finish, run.created_at) - run.created_at) / span * 100, MIN_WIDTH), 100 - x)
        bars.append(Bar(
            run_id=run.id, status=shown_status(run.status, run.info), actor=run.actor, row=row, x=round(x, 3),
            width=round(width, 3),
            y=AXIS_HEIGHT + row * ROW_HEIGHT + (ROW_HEIGHT - BAR_HEIGHT) // 2, start=run.created_at, end=finish,
            live=run.status in LIVE_STATUSES, committed_serial=run.committed_serial,
        ))
    step = _step(span)
    first = datetime.fromtimestamp((start.timestamp() // step.total_seconds() + 1) * step.total_seconds(), start.tzinfo)
    ticks = []
    at = first
    while at < start + span:
        ticks.append(Tick(x=round((at - start) / span * 100, 3), label=_label(at, span)))
        at += step
    return Chart(start=start, end=end, bars=tuple(bars), ticks=tuple(ticks),
                 height=AXIS_HEIGHT + len(bars) * ROW_HEIGHT + 4)
