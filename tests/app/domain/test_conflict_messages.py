"""What a conflict says to a person and to Terraform, without a database."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from analyzer.globs import parse_glob
from app.domain.reservations import (
    HOLD_LEASE,
    Conflict,
    Held,
    Mode,
    Wanted,
    describe,
    format_duration,
    synthesize_lock_info,
)

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def held(glob: str, *, run: str = "ar_4f2a", lease: timedelta | None = timedelta(minutes=14, seconds=48),
         holder: str = "alice", mode: Mode = Mode.WRITE) -> Held:
    return Held(glob=glob, mode=mode, holder=holder, run_id=run, acquired_at=NOW - timedelta(seconds=12),
                expires_at=None if lease is None else NOW + lease)


def test_durations_read_at_a_glance() -> None:
    assert [format_duration(timedelta(seconds=s)) for s in (0, 12, 60, 888, 3599, 3600, 7380, -5)] == [
        "0s", "12s", "1m00s", "14m48s", "59m59s", "1h00m", "2h03m", "0s"]
    assert [format_duration(timedelta(hours=h)) for h in (23, 24, 26, 24 * 30 + 5)] == [
        "23h00m", "1d00h", "1d02h", "30d05h"]


def test_a_conflict_on_the_same_glob_names_run_age_and_lease() -> None:
    conflict = Conflict(Wanted(parse_glob("module.web.*"), Mode.WRITE), held("module.web.*"))
    assert describe(conflict, NOW) == ("reservation conflict on module.web.*: held by alice "
                                       "(run ar_4f2a, acquired 12s ago, expires in 14m48s)")


def test_a_conflict_on_another_glob_names_the_held_one_and_terraforms_lock_has_no_lease() -> None:
    conflict = Conflict(Wanted(parse_glob("module.web.x.y"), Mode.READ), held("*", run="", lease=None))
    assert describe(conflict, NOW) == ("reservation conflict on module.web.x.y (write *): held by alice "
                                       "(Terraform state lock, acquired 12s ago, no lease)")


def test_a_pull_request_hold_reads_as_one() -> None:
    conflict = Conflict(Wanted(parse_glob("a.b"), Mode.WRITE), held("a.b", lease=HOLD_LEASE))
    assert "a pull-request hold, no lease" in describe(conflict, NOW)
    assert "no lease)" in describe(Conflict(Wanted(parse_glob("a.b"), Mode.WRITE), held("a.b", lease=None)), NOW)


def test_the_synthesized_lock_info_lists_holders_runs_and_the_earliest_acquisition() -> None:
    holdings = [held(f"t.r{i}", run=f"ar_{i:02d}", holder="bob" if i % 2 else "alice") for i in range(12)]
    holdings[3] = Held(glob="t.r3", mode=Mode.READ, holder="carol", run_id="ar_03",
                       acquired_at=NOW - timedelta(hours=1), expires_at=None)
    doc = json.loads(synthesize_lock_info(holdings, NOW))
    assert doc["ID"] == "kilolock-reservations:ar_00"
    assert doc["Who"] == "alice, bob, carol"
    assert doc["Created"] == "2026-12-01T11:00:00.000000Z"
    assert doc["Operation"] == "OperationTypeApply"
    assert doc["Info"].startswith("resources reserved by Kilolock apply runs: write t.r0 (run ar_00, alice, "
                                  "expires in 14m48s); ")
    assert "read t.r3 (run ar_03, carol); " in doc["Info"]
    assert doc["Info"].endswith("; and 2 more") and "t.r10" not in doc["Info"]


def test_a_lock_info_for_terraforms_lock_alone_is_live() -> None:
    doc = json.loads(synthesize_lock_info([held("*", run="", lease=None)], NOW))
    assert doc["ID"] == "kilolock-reservations:live"
