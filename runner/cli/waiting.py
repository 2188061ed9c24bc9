"""What ``kl apply --wait`` (and the other commands that wait for reservations) shows while the server
keeps its request queued: that it waits, on whom, and for how long — one line rewritten in place on a
terminal, a line every ``_LOG_EVERY`` seconds (and the first at once) otherwise, on stderr."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import TextIO

from app.domain.durations import format_duration
from runner.core.engine_client import Waiting

_LOG_EVERY = 15.0
_SHOWN = 2  # conflicts named on the line; the rest are counted


def describe_wait(waiting: Waiting) -> str:
    """``waiting for module.web.* (write, held by carol, run ar_…) and 1 more: 12s of 5m``."""
    held = [f"{c.glob} ({c.mode}, held by {c.holder}" + (f", run {c.run_id}" if c.run_id else "") + ")"
            for c in waiting.conflicts[:_SHOWN]]
    more = len(waiting.conflicts) - _SHOWN
    whom = ", ".join(held) + (f" and {more} more" if more > 0 else "") if held else "other runs' reservations"
    return (f"waiting for {whom}: {format_duration(timedelta(seconds=int(waiting.waited)))} of "
            f"{format_duration(timedelta(seconds=int(waiting.limit)))}")


class WaitProgress:
    """An ``EngineClient.on_wait`` that writes ``describe_wait`` lines to ``stream``."""

    def __init__(self, stream: TextIO, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.stream, self.clock = stream, clock
        self.tty = stream.isatty()
        self.last: float | None = None

    def __call__(self, waiting: Waiting) -> None:
        if waiting.done:
            self.done()
            return
        now = self.clock()
        if self.tty:
            self.stream.write("\r\033[K" + describe_wait(waiting))
        elif self.last is None or now - self.last >= _LOG_EVERY:
            self.stream.write(describe_wait(waiting) + "\n")
        else:
            return
        self.last = now
        self.stream.flush()

    def done(self) -> None:
        """End the rewritten line, if one was written, so what follows starts on its own line."""
        if self.tty and self.last is not None:
            self.stream.write("\n")
            self.stream.flush()
        self.last = None
