"""One conflict rule for globs read back from storage: reservations, pull-request holds, saved footprints and
the live reservations the bot lists all meet through ``analyzer.globs.texts_conflict``, and a stored glob that
no longer parses counts as ``*`` everywhere (fail closed), never as nothing."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from analyzer.globs import READ, WRITE, Glob, stored_glob, texts_conflict
from app.domain.overlaps import shared_globs
from app.domain.reservations import Held, Mode, Wanted, find_conflicts
from runner.bot.flow import live_conflicts

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
# Texts a grammar change or a damaged row could leave behind: none of them parses today.
UNPARSABLE = ["module..x", "aws_vpc.main[", "*.aws_vpc", "output.", "a b"]


@dataclass(frozen=True)
class Footprint:
    number: int
    state_name: str
    write_globs: tuple[str, ...]
    read_globs: tuple[str, ...] = ()


@pytest.mark.parametrize("text", UNPARSABLE)
def test_a_stored_glob_that_no_longer_parses_counts_as_everything(text: str) -> None:
    assert stored_glob(text) == Glob.everything()
    assert texts_conflict(WRITE, text, READ, "module.payments.aws_sqs_queue.q")
    assert texts_conflict(READ, "output.endpoint", WRITE, text)
    # read/read still never conflicts, whatever the globs are
    assert not texts_conflict(READ, text, READ, "aws_vpc.main")


def test_a_parsable_stored_glob_keeps_its_meaning() -> None:
    assert texts_conflict(WRITE, "module.a.*", WRITE, "module.a.aws_vpc.x")
    assert not texts_conflict(WRITE, "module.a.*", WRITE, "module.b.*")


@pytest.mark.parametrize("text", UNPARSABLE)
def test_every_rule_over_stored_globs_fails_closed(text: str) -> None:
    # a held reservation whose glob no longer parses blocks every request
    held = Held(glob=text, mode=Mode.WRITE, holder="alice", run_id="ar_1", acquired_at=NOW,
                expires_at=NOW + timedelta(minutes=5))
    wanted = [Wanted(glob=stored_glob("aws_vpc.main"), mode=Mode.READ)]
    assert [c.held.holder for c in find_conflicts(wanted, [held], NOW)] == ["alice"]
    # a saved footprint's glob overlaps every other pull request on the state
    mine = Footprint(1, "prod", (text,))
    theirs = Footprint(2, "prod", ("module.db.aws_db_instance.main",))
    assert shared_globs(mine, theirs) == [f"{text} ∩ module.db.aws_db_instance.main"]
    assert shared_globs(theirs, mine) == [f"module.db.aws_db_instance.main ∩ {text}"]
    # a live reservation the bot lists is a conflict, not skipped
    found = live_conflicts(["aws_vpc.main"], [], [{"glob": text, "mode": "write", "holder": "bob", "run_id": "ar_2"}])
    assert [(c.glob, c.theirs, c.holder) for c in found] == [("aws_vpc.main", text, "bob")]
