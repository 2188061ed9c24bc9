"""Terraform state-lock rules: LockInfo parsing (of a LOCK body and of a stored lock), the unlock shapes,
and the write-lock matrix.

Pure functions over bytes and strings. The store holds the state row lock while it calls them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from app.errors import InvalidLockInfoError, StateLockedError

# Who holds a Terraform state lock whose LockInfo names nobody.
TERRAFORM_HOLDER = "terraform"

_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})")


@dataclass(frozen=True, slots=True)
class LockInfo:
    """A held lock. ``raw`` is what LOCK conflicts answer with, byte for byte when the client
    sent a well-formed LockInfo, so Terraform shows the holder and ``-lock-timeout`` waits."""

    id: str
    who: str
    operation: str
    raw: bytes


@dataclass(frozen=True, slots=True)
class UnlockRequest:
    """An UNLOCK as understood from its body: ``force`` releases whatever lock is held."""

    force: bool
    lock_id: str


def rfc3339(moment: datetime) -> str:
    """Format an aware datetime the way Go's time.Time marshals (RFC 3339, UTC 'Z')."""
    text = moment.isoformat(timespec="microseconds")
    return text.replace("+00:00", "Z")


def parse_lock_info(body: bytes, now: datetime) -> LockInfo:
    """Parse a LOCK body. Requires a JSON object with a non-empty string ``ID``.

    A missing or non-RFC 3339 ``Created`` is filled in with ``now`` (and the body re-encoded),
    because Terraform 1.15 cannot parse a conflict answer without it.
    """
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidLockInfoError(
            f"lock body is not JSON ({exc.__class__.__name__}): send Terraform's LockInfo"
        ) from exc
    if not isinstance(doc, dict):
        raise InvalidLockInfoError("lock body must be a JSON object (Terraform's LockInfo)")
    lock_id = doc.get("ID")
    if not isinstance(lock_id, str) or not lock_id:
        raise InvalidLockInfoError("lock body has no ID: send Terraform's LockInfo with a non-empty ID")
    raw = body
    created = doc.get("Created")
    if not isinstance(created, str) or not _RFC3339.fullmatch(created):
        doc["Created"] = rfc3339(now)
        raw = json.dumps(doc).encode()
    return _lock_info(lock_id, doc, raw)


def stored_lock(lock_id: str, raw: bytes) -> LockInfo:
    """The lock a state row holds, read back from its stored LockInfo bytes. Bytes that are not a JSON
    object (a lock taken before bodies were validated) name no holder and never fail the reader."""
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    return _lock_info(lock_id, doc if isinstance(doc, dict) else {}, raw)


def _lock_info(lock_id: str, doc: dict[str, object], raw: bytes) -> LockInfo:
    return LockInfo(id=lock_id, who=str(doc.get("Who") or ""), operation=str(doc.get("Operation") or ""), raw=raw)


def lock_holder(lock: LockInfo) -> str:
    """Who to show as the lock's holder: its ``Who``, else ``terraform``."""
    return lock.who or TERRAFORM_HOLDER


def lock_created(lock: LockInfo, default: datetime) -> datetime:
    """When the lock was taken, from its ``Created`` (naive times read as UTC), else ``default``."""
    try:
        doc = json.loads(lock.raw)
        created = datetime.fromisoformat(doc.get("Created", "").replace("Z", "+00:00")[:32])
    except (ValueError, AttributeError):
        return default
    return created if created.tzinfo is not None else created.replace(tzinfo=UTC)


def classify_unlock(body: bytes, query_id: str | None) -> UnlockRequest:
    """Decide what an UNLOCK (or POST /v1/state-unlock) asks for.

    - empty body, ``{}``, or a LockInfo with an empty ID: force (Terraform's force-unlock sends
      an empty body and can never present the ID);
    - a LockInfo whose only non-empty field is ``ID``: force (OpenTofu >= 1.10's force-unlock);
    - a LockInfo with an ID and holder fields: owner release of that ID;
    - a JSON string, a plain-text ID or ``?ID=``: owner release of that ID.
    """
    text = body.strip()
    if not text:
        return UnlockRequest(force=query_id is None, lock_id=query_id or "")
    try:
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError):
        try:
            plain = text.decode()
        except UnicodeDecodeError as exc:
            raise InvalidLockInfoError("unlock body is neither JSON nor a lock ID") from exc
        if "\n" in plain or len(plain) > 200:
            raise InvalidLockInfoError("unlock body is neither JSON nor a lock ID") from None
        return UnlockRequest(force=False, lock_id=plain)
    if isinstance(doc, str):
        return UnlockRequest(force=not doc, lock_id=doc)
    if not isinstance(doc, dict):
        raise InvalidLockInfoError("unlock body must be Terraform's LockInfo JSON, a lock ID, or empty")
    lock_id = doc.get("ID") or query_id or ""
    if not isinstance(lock_id, str):
        raise InvalidLockInfoError("unlock body's ID must be a string")
    if not lock_id:
        return UnlockRequest(force=True, lock_id="")
    holder_fields = ("Operation", "Who", "Version", "Path", "Info")
    if not any(doc.get(field) for field in holder_fields):
        return UnlockRequest(force=True, lock_id=lock_id)
    return UnlockRequest(force=False, lock_id=lock_id)


def check_lock_for_write(held: LockInfo | None, presented_id: str | None, state_name: str) -> None:
    """The write-lock matrix shared by POST and DELETE.

    Unlocked and no ID: allowed. Locked and the held ID presented: allowed. Anything else is
    423 with the holder's LockInfo (or, for an ID against an unlocked state, a synthesized one
    naming the stale ID) so the writer stops instead of clobbering another run.
    """
    if held is None:
        if presented_id:
            raise StateLockedError(
                f"state {state_name!r} is not locked but the request carries lock ID {presented_id!r}: "
                "the lock was released or force-unlocked; re-run terraform to take a new lock",
                lock_info=json.dumps({"ID": presented_id, "Info": "lock no longer held"}).encode(),
            )
        return
    if presented_id != held.id:
        what = f"lock ID {presented_id!r}" if presented_id else "no lock ID"
        raise StateLockedError(
            f"state {state_name!r} is locked by {held.who or 'someone'} (lock {held.id}); "
            f"the request carries {what}: wait for the lock or run terraform force-unlock",
            lock_info=held.raw,
        )
