"""The domain's single owners of rules that once had diverging copies: no database needed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.domain.durations import format_duration, parse_duration
from app.domain.locking import lock_created, lock_holder, parse_lock_info, stored_lock
from app.domain.reservations import LIVE_STATUSES, Mode, RunStatus, terraform_lock_hold
from app.store.db import LIVE_STATUSES_SQL, sql_text_list

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_a_stored_lock_that_is_not_a_json_object_names_no_holder_instead_of_failing() -> None:
    for raw in (b"[1, 2]", b'"text"', b"not json", b"\xff"):
        lock = stored_lock("L1", raw)
        assert (lock.id, lock.who, lock.operation, lock.raw) == ("L1", "", "", raw)
        assert lock_holder(lock) == "terraform"


def test_a_stored_lock_and_a_lock_body_read_who_and_operation_alike() -> None:
    body = b'{"ID": "L1", "Who": "alice@host", "Operation": "OperationTypeApply", "Created": "2026-01-02T03:04:05Z"}'
    assert stored_lock("L1", body) == parse_lock_info(body, NOW)
    assert lock_holder(stored_lock("L1", body)) == "alice@host"


def test_terraform_s_lock_is_a_write_on_everything_without_a_lease() -> None:
    lock = stored_lock("L1", b'{"ID": "L1", "Created": "2026-01-02T03:00:00Z"}')
    held = terraform_lock_hold(lock, lock_created(lock, NOW))
    assert (held.glob, held.mode, held.holder, held.run_id, held.expires_at) == ("*", Mode.WRITE, "terraform", "", None)
    assert held.acquired_at == datetime(2026, 1, 2, 3, 0, tzinfo=UTC)
    assert lock_created(stored_lock("L1", b'{"Created": 5}'), NOW) == NOW
    assert lock_created(stored_lock("L1", b'{"Created": "2026-01-02T03:00:00"}'), NOW).tzinfo == UTC


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 90.0), ("2.5", 2.5), ("90s", 90.0), ("5m", 300.0), ("1h30m", 5400.0), ("1d", 86400.0), (" 10m ", 600.0),
])
def test_one_parser_reads_every_duration_kilolock_accepts(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "m", "5x", "1h 30m", "-5", "5m3"])
def test_a_duration_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)


def test_durations_are_formatted_for_a_glance() -> None:
    assert [format_duration(timedelta(seconds=s)) for s in (12, 888, 7380, -3)] == ["12s", "14m48s", "2h03m", "0s"]


def test_the_live_statuses_are_the_runs_that_hold_reservations_and_sql_spells_them_once() -> None:
    assert {s for s in RunStatus if s.is_live} == set(LIVE_STATUSES) == {"reserved", "running", "aborting"}
    assert LIVE_STATUSES_SQL == "('reserved', 'running', 'aborting')"
    assert sql_text_list(["it's"]) == "('it''s')"
