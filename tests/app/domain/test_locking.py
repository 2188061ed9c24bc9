"""Terraform state-lock rules without a database: LockInfo parsing, the unlock shapes and the write-lock matrix."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from app.domain.locking import LockInfo, UnlockRequest, check_lock_for_write, classify_unlock, parse_lock_info, rfc3339
from app.errors import InvalidLockInfoError, StateLockedError

NOW = datetime(2026, 12, 1, 12, 0, 0, 123456, tzinfo=UTC)
FULL = {"ID": "l-1", "Operation": "OperationTypeApply", "Info": "", "Who": "alice@laptop", "Version": "1.15.5",
        "Created": "2026-11-30T10:00:00.123456789Z", "Path": ""}


def test_a_well_formed_lock_info_is_kept_byte_for_byte() -> None:
    body = json.dumps(FULL).encode()
    info = parse_lock_info(body, NOW)
    assert info == LockInfo(id="l-1", who="alice@laptop", operation="OperationTypeApply", raw=body)


@pytest.mark.parametrize("created", [None, "", "yesterday", "2026-11-30 10:00:00Z", 12])
def test_a_missing_or_bad_created_is_filled_in_with_now(created: object) -> None:
    doc = {**FULL, "Created": created}
    if created is None:
        del doc["Created"]
    info = parse_lock_info(json.dumps(doc).encode(), NOW)
    assert json.loads(info.raw) == {**FULL, "Created": "2026-12-01T12:00:00.123456Z"}


def test_offsets_are_valid_rfc3339_and_who_defaults_to_empty() -> None:
    body = json.dumps({"ID": "x", "Created": "2026-11-30T10:00:00+02:00"}).encode()
    info = parse_lock_info(body, NOW)
    assert info.raw == body and info.who == "" and info.operation == ""


@pytest.mark.parametrize(("body", "message"), [
    (b"not json", "lock body is not JSON"),
    (b"\xff\xfe", "lock body is not JSON"),
    (b"[1]", "must be a JSON object"),
    (b'{"Who": "a"}', "has no ID"),
    (b'{"ID": ""}', "has no ID"),
    (b'{"ID": 7}', "has no ID"),
])
def test_bad_lock_bodies_are_refused(body: bytes, message: str) -> None:
    with pytest.raises(InvalidLockInfoError, match=message):
        parse_lock_info(body, NOW)


def test_rfc3339_writes_utc_as_z() -> None:
    assert rfc3339(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)) == "2026-01-02T03:04:05.000000Z"


@pytest.mark.parametrize(("body", "query", "expected"), [
    (b"", None, UnlockRequest(force=True, lock_id="")),
    (b"  \n", "q-1", UnlockRequest(force=False, lock_id="q-1")),
    (b"{}", None, UnlockRequest(force=True, lock_id="")),
    (b'{"ID": ""}', None, UnlockRequest(force=True, lock_id="")),
    (b'{"ID": "l-1"}', None, UnlockRequest(force=True, lock_id="l-1")),  # OpenTofu's force-unlock
    (json.dumps(FULL).encode(), None, UnlockRequest(force=False, lock_id="l-1")),
    (b'{"Who": "alice"}', "q-1", UnlockRequest(force=False, lock_id="q-1")),
    (b'"l-2"', None, UnlockRequest(force=False, lock_id="l-2")),
    (b'""', None, UnlockRequest(force=True, lock_id="")),
    (b"plain-id", None, UnlockRequest(force=False, lock_id="plain-id")),
])
def test_unlock_shapes(body: bytes, query: str | None, expected: UnlockRequest) -> None:
    assert classify_unlock(body, query) == expected


@pytest.mark.parametrize("body", [b"two\nlines", b"x" * 201, b"\xff\xfe", b"[1, 2]", b"7", b'{"ID": 7}'])
def test_unlock_bodies_that_are_no_lock_id_are_refused(body: bytes) -> None:
    with pytest.raises(InvalidLockInfoError):
        classify_unlock(body, None)


HELD = LockInfo(id="l-1", who="alice@laptop", operation="OperationTypeApply", raw=b'{"ID": "l-1"}')


def test_writes_pass_unlocked_without_an_id_and_locked_with_the_held_id() -> None:
    check_lock_for_write(None, None, "prod")
    check_lock_for_write(None, "", "prod")
    check_lock_for_write(HELD, "l-1", "prod")


@pytest.mark.parametrize(("presented", "what"), [(None, "no lock ID"), ("", "no lock ID"),
                                                 ("l-2", "lock ID 'l-2'")])
def test_a_write_to_a_locked_state_without_its_id_is_locked_out_with_the_holders_info(
        presented: str | None, what: str) -> None:
    with pytest.raises(StateLockedError, match=f"locked by alice@laptop \\(lock l-1\\); the request carries {what}") \
            as caught:
        check_lock_for_write(HELD, presented, "prod")
    assert caught.value.lock_info == HELD.raw


def test_an_id_against_an_unlocked_state_is_refused_with_a_synthesized_lock_info() -> None:
    with pytest.raises(StateLockedError, match="is not locked but the request carries lock ID 'old'") as caught:
        check_lock_for_write(None, "old", "prod")
    assert json.loads(caught.value.lock_info) == {"ID": "old", "Info": "lock no longer held"}


def test_an_anonymous_holder_reads_as_someone() -> None:
    with pytest.raises(StateLockedError, match="locked by someone"):
        check_lock_for_write(LockInfo(id="l", who="", operation="", raw=b"{}"), None, "prod")
