"""Conflict messages and Terraform LockInfo text, from the pure rules (no database)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from app.domain.reservations import HOLD_LEASE, Conflict, Held, Mode, describe, parse_wanted, synthesize_lock_info

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _held(holder: str, lease: timedelta) -> Held:
    return Held(glob="terraform_data.a", mode=Mode.WRITE, holder=holder, run_id="ar_1",
                acquired_at=NOW - timedelta(seconds=30), expires_at=NOW - timedelta(seconds=30) + lease)


def test_a_pull_request_hold_reads_as_a_hold_not_as_a_lease_of_decades():
    wanted = parse_wanted([("terraform_data.a", "write")])[0]
    text = describe(Conflict(wanted, _held("acme/infra#7", HOLD_LEASE)), NOW)
    assert "held by acme/infra#7" in text and "pull-request hold" in text and "kilolock unlock" in text
    assert "expires in" not in text
    info = json.loads(synthesize_lock_info([_held("acme/infra#7", HOLD_LEASE)], NOW))
    assert "pull-request hold" in info["Info"] and "expires in" not in info["Info"]


def test_an_ordinary_run_shows_when_its_lease_expires():
    wanted = parse_wanted([("terraform_data.a", "write")])[0]
    text = describe(Conflict(wanted, _held("alice", timedelta(minutes=15))), NOW)
    assert "held by alice" in text and "expires in 14m30s" in text
