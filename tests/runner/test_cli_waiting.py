"""What kl shows while its reservation request waits in the server's queue: on whom and for how long, as one
line rewritten on a terminal and as periodic lines in a log."""

from __future__ import annotations

import io
from dataclasses import replace

from analyzer.globs import Mode
from runner.cli.waiting import WaitProgress, describe_wait
from runner.core.engine_client import HeldBy, Waiting

CAROL = HeldBy(glob="module.web.*", mode=Mode.WRITE, holder="carol", run_id="ar_1")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_line_names_the_holders_and_the_time_waited_of_the_most():
    many = (CAROL, replace(CAROL, glob="module.db.*", holder="dave", run_id=None), CAROL, CAROL)
    assert describe_wait(Waiting((CAROL,), 12.7, 300)) == \
        "waiting for module.web.* (write, held by carol, run ar_1): 12s of 5m00s"
    assert describe_wait(Waiting(many, 75, 600)).endswith(
        "module.db.* (write, held by dave) and 2 more: 1m15s of 10m00s")
    assert describe_wait(Waiting((), 1, 5)) == "waiting for other runs' reservations: 1s of 5s"


def test_off_a_terminal_it_writes_a_line_at_once_then_one_every_fifteen_seconds():
    now = [0.0]
    log = io.StringIO()
    show = WaitProgress(log, clock=lambda: now[0])
    for t in (0, 1, 2, 14, 15, 16, 31):
        now[0] = t
        show(Waiting((CAROL,), t, 60))
    show(Waiting((), 32, 60, done=True))
    assert [line.split(": ")[-1] for line in log.getvalue().splitlines()] == ["0s of 1m00s", "15s of 1m00s",
                                                                              "31s of 1m00s"]


def test_on_a_terminal_it_rewrites_one_line_and_ends_it_when_the_wait_is_over():
    screen = Terminal()
    show = WaitProgress(screen, clock=lambda: 0.0)
    show(Waiting((CAROL,), 1, 60))
    show(Waiting((CAROL,), 2, 60))
    show(Waiting((), 3, 60, done=True))
    text = screen.getvalue()
    assert text.count("\r\033[K") == 2 and text.endswith("2s of 1m00s\n") and text.count("\n") == 1
