"""States, their versions and Terraform's whole-state lock: the backend lane's operations.

Each operation is one transaction that locks the state row (``FOR UPDATE``), applies the pure
rules of ``app.domain``, writes, and appends an audit event in the same transaction.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import psycopg
from psycopg.rows import class_row

from analyzer.jsontext import INT64_MAX, may_hold_unstorable, unstorable_path
from analyzer.state import EncryptedState, ParsedState, StateFormatError, parse_state, parse_state_watched
from app.domain.locking import LockInfo, UnlockRequest, check_lock_for_write, parse_lock_info, stored_lock
from app.domain.principal import Principal
from app.domain.reservations import synthesize_lock_info
from app.domain.versions import check_new_serial
from app.errors import InvalidStateError, SerialConflictError, StateLockedError, StateNotFoundError
from app.store import assembly, events, firstrows, history, rawwrite, reservation_rows, resources
from app.store.db import LARGE_VALUE_BYTES, Database, retire

_ENSURE = """
INSERT INTO states (tenant_id, scope, name) VALUES (%s, %s, %s)
ON CONFLICT (tenant_id, scope, name) DO NOTHING
"""
_FOR_UPDATE = """
SELECT s.id, s.name, s.lineage, s.current_serial, s.head_version_id, s.lock_id, s.lock_info,
       v.sha256 AS head_sha256
FROM states s LEFT JOIN state_versions v ON v.id = s.head_version_id
WHERE s.tenant_id = %s AND s.scope = %s AND s.name = %s
FOR UPDATE OF s
"""
_HEAD_RAW = """
SELECT v.id, v.raw_state FROM states s JOIN state_versions v ON v.id = s.head_version_id
WHERE s.tenant_id = %s AND s.scope = %s AND s.name = %s
"""
_SUMMARY = """
SELECT s.id, s.name, s.lineage, s.current_serial, s.head_version_id, s.lock_id, s.lock_info,
       NULL::text AS head_sha256
FROM states s WHERE s.tenant_id = %s AND s.scope = %s AND s.name = %s
"""
_LIST_STATES = """
SELECT s.name, s.lineage, s.current_serial, s.lock_id IS NOT NULL AS locked, s.updated_at,
       (SELECT count(*) FROM resources r WHERE r.state_id = s.id AND r.delete_serial IS NULL) AS resources
FROM states s WHERE s.tenant_id = %s AND s.scope = %s ORDER BY s.name
"""
_SET_HEAD = """
UPDATE states SET lineage = %s, current_serial = %s, head_version_id = %s, updated_at = now()
WHERE id = %s
"""
_VERSION_AT = """
SELECT id, serial, lineage, terraform_version, encrypted FROM state_versions
WHERE state_id = %s AND serial <= %s ORDER BY serial DESC LIMIT 1
"""
_SET_LOCK = "UPDATE states SET lock_id = %s, lock_info = %s, locked_at = now() WHERE id = %s"
_CLEAR_LOCK = "UPDATE states SET lock_id = NULL, lock_info = NULL, locked_at = NULL WHERE id = %s"
_DELETE = "DELETE FROM states WHERE id = %s"


@dataclass(frozen=True, slots=True)
class StateRow:
    id: int
    name: str
    lineage: str | None
    current_serial: int | None
    head_version_id: int | None
    lock_id: str | None
    lock_info: bytes | None
    head_sha256: str | None

    @property
    def held_lock(self) -> LockInfo | None:
        if self.lock_id is None:
            return None
        return stored_lock(self.lock_id, bytes(self.lock_info or b"{}"))


@dataclass(frozen=True, slots=True)
class WriteResult:
    serial: int
    replay: bool
    opened: int = 0
    closed: int = 0
    version_id: int = 0  # the new version (0 for a replay)
    encrypted: bool = False
    size: int = 0  # the body's bytes (0 for a replay)


@dataclass(frozen=True, slots=True)
class StateSummary:
    name: str
    lineage: str | None
    current_serial: int | None
    locked: bool
    updated_at: datetime
    resources: int


@dataclass(frozen=True, slots=True)
class VersionRef:
    id: int
    serial: int
    lineage: str
    terraform_version: str
    encrypted: bool


def locked_row(conn: psycopg.Connection, principal: Principal, name: str, *, create: bool) -> StateRow | None:
    """The state's row, locked ``FOR UPDATE``; with ``create``, created first when missing (again when a
    concurrent deletion commits between the two statements)."""
    while True:
        if create:
            conn.execute(_ENSURE, (principal.tenant_id, principal.scope, name))
        row = lock_row_read(conn, principal, name).fetchone()
        if row is not None or not create:
            return row


def lock_row_read(conn: psycopg.Connection, principal: Principal, name: str) -> psycopg.Cursor[StateRow]:
    """``locked_row`` of an existing state, sent but not yet fetched (so it can open a pipeline)."""
    cur = conn.cursor(row_factory=class_row(StateRow))
    return cur.execute(_FOR_UPDATE, (principal.tenant_id, principal.scope, name))


def find_state(conn: psycopg.Connection, principal: Principal, name: str) -> StateRow:
    """The state row (no row lock), or StateNotFoundError."""
    row = _state_summary(conn, principal, name)
    if row is None:
        raise StateNotFoundError(f"no state named {name!r}")
    return row


def read_head(db: Database, principal: Principal, name: str) -> bytes | None:
    """The bytes of the head version, or None when the state has never been written (whole, for callers
    that need them in memory; the backend lane streams with ``head_pieces``)."""
    pieces = head_pieces(db, principal, name)
    return None if pieces is None else b"".join(pieces)


def head_pieces(db: Database, principal: Principal, name: str,
                before_assembly: Callable[[int], None] | None = None,
                found: assembly.Found | None = None) -> Iterator[bytes] | None:
    """The bytes of the head version as pieces, or None when the state has never been written (or was
    deleted meanwhile).

    A head written by a row-level commit has no bytes until its first read, which assembles and caches
    them (``app.store.assembly``) as a stream, calling ``before_assembly`` with the expected size first
    when this reader is the one that assembles (the caller's admission check); the head read here is the
    committed one, so a GET never sees an older serial than a commit that finished before it started, and
    always a whole serial. The first piece is read before this
    returns, so a refusal or a database error is raised here, not halfway through the body; ``found``
    then tells what was found, its ``size`` the body's length when it is known before the last piece.
    """
    with db.transaction() as conn:
        # Binary results: a 25 MB state as hex text costs twice the bytes and a decode pass.
        row = conn.execute(_HEAD_RAW, (principal.tenant_id, principal.scope, name), binary=True).fetchone()
        if row is not None and row[1] is not None and len(row[1]) >= LARGE_VALUE_BYTES:
            retire(conn)
    if row is None:
        return None
    version_id, raw = row
    found = assembly.Found() if found is None else found
    if raw is not None:
        found.exists, found.size = True, len(raw)
        return iter((bytes(raw),))
    pieces = assembly.stream(db, version_id, found, before_assembly)
    first = next(pieces, None)
    if first is None:
        return None
    return itertools.chain((first,), pieces)


def list_states(db: Database, principal: Principal) -> list[StateSummary]:
    with db.transaction() as conn, conn.cursor(row_factory=class_row(StateSummary)) as cur:
        return cur.execute(_LIST_STATES, (principal.tenant_id, principal.scope)).fetchall()


def parse_body(body: bytes | bytearray, *, scanned: bool | None = None) -> ParsedState | EncryptedState:
    """Parse a POSTed state, mapping format problems to a 400, and refuse (400, naming the field)
    what Postgres cannot hold: a NUL or a lone surrogate in any string (``jsonb`` and ``text`` refuse
    both) and a serial beyond 64 bits (``bigint``). Refusing beats storing other bytes than were sent.
    ``scanned`` is ``may_hold_unstorable(body)`` when the caller has it already."""
    try:
        parsed = parse_state(body)  # type: ignore[arg-type]  # json.loads reads any bytes-like body
    except StateFormatError as exc:
        raise InvalidStateError(str(exc)) from exc
    return _storable(body, parsed, scanned)


def _storable(body: bytes | bytearray, parsed: ParsedState | EncryptedState,
              scanned: bool | None = None) -> ParsedState | EncryptedState:
    """``parsed`` once ``parse_body``'s refusals of what Postgres cannot hold have passed (``scanned``: the
    body's ``may_hold_unstorable``, scanned here when None)."""
    if parsed.serial > INT64_MAX:
        raise InvalidStateError(f'the state\'s "serial" {parsed.serial} is above the 64-bit limit (2^63 - 1), '
                                "which Kilolock cannot store: write the state with a smaller serial")
    if may_hold_unstorable(body) if scanned is None else scanned:  # a quick scan; the walk runs only on a hit
        where = unstorable_path(json.loads(body))
        if where is not None:
            raise InvalidStateError(f"{where} holds a NUL character or a lone UTF-16 surrogate, which Kilolock "
                                    "cannot store (Postgres text and jsonb refuse them): change that value so "
                                    "it holds neither")
    return parsed


def write_state(
    db: Database,
    principal: Principal,
    name: str,
    body: bytes,
    *,
    lock_id: str | None,
    source: str = "http",
    after_bulk: Callable[[], None] | None = None,
    later: Callable[[Callable[[], object]], None] | None = None,
    names_inline_max: int | None = None,
) -> WriteResult:
    """Store a whole-state write as a new version and project it into resource rows.

    A write that opens ``BULK_ROWS`` rows or more then refreshes the statistics (``refresh_statistics``)
    after its commit, or, given ``after_bulk``, calls that instead to have them refreshed elsewhere (the
    server's background upkeep, ``app.web.upkeep``). The changed attribute names of the rows it replaced
    (``history.record_changed_names``) are recorded after its commit, outside the row lock: at once when it
    replaced fewer than ``names_inline_max`` rows (``CHANGED_NAMES_INLINE``) or no ``later`` is given,
    otherwise handed to ``later`` to be run off the request (readers derive them meanwhile).
    A byte-identical replay of the head is a no-op success (clients retry POSTs on 5xx).
    Raises StateLockedError (423), SerialConflictError (409) or InvalidStateError (400); a
    rejected write changes nothing.

    The first write of a state (no head yet) is tried optimistically first (``_first_write``), its rows
    stored while the body is parsed; when that finds the state other than it assumed, it rolls back and the
    write runs the usual way, below.
    """
    scanned = may_hold_unstorable(body)
    first = _Usual() if scanned else _first_write(db, principal, name, body, lock_id=lock_id, source=source)
    if isinstance(first, WriteResult):
        return _after_write(db, first, after_bulk)  # a first write replaces no row
    digest = first.digest or hashlib.sha256(body).hexdigest()
    # CPU work before taking the row lock (done already when the optimistic write parsed the body)
    parsed = parse_body(body, scanned=scanned) if first.parsed is None else _storable(body, first.parsed, scanned)
    replaced = 0  # the most rows the write can have replaced (opened where it closed one)
    with db.transaction() as conn:
        # A state the optimistic write found with a head exists (unless deleted since): no INSERT to ensure it.
        row = None if first.state is None else locked_row(conn, principal, name, create=False)
        row = row or locked_row(conn, principal, name, create=True)
        assert row is not None  # _ENSURE guarantees the row
        if row.head_sha256 == digest:
            return WriteResult(serial=row.current_serial or 0, replay=True)
        check_lock_for_write(row.held_lock, lock_id, name)
        if row.held_lock is None:
            _refuse_if_reserved(conn, principal, row, name, "whole-state write")
        check_new_serial(name, row.current_serial, parsed.serial)
        encrypted = isinstance(parsed, EncryptedState)
        terraform_version = "" if isinstance(parsed, EncryptedState) else parsed.terraform_version
        version_id = rawwrite.insert_version(
            conn, tenant_id=principal.tenant_id, state_id=row.id, serial=parsed.serial, lineage=parsed.lineage,
            terraform_version=terraform_version, raw=body, sha256=digest, encrypted=encrypted, source=source,
            actor=principal.actor,
        )
        size = len(body)
        del body  # stored: the caller holds no other reference, so a large body is freed before the rows' write
        if isinstance(parsed, EncryptedState):
            opened, closed = 0, resources.close_all(conn, state_id=row.id, serial=parsed.serial)
        else:
            delta = resources.project(
                conn, tenant_id=principal.tenant_id, state_id=row.id, serial=parsed.serial,
                instances=parsed.instances,
            )
            resources.insert_outputs(
                conn, tenant_id=principal.tenant_id, state_id=row.id, version_id=version_id,
                outputs=parsed.outputs,
            )
            replaced = min(len(delta.inserts), len(delta.close_ids))
            opened, closed = len(delta.inserts), len(delta.close_ids)
        result = WriteResult(serial=parsed.serial, replay=False, opened=opened, closed=closed,
                             version_id=version_id, encrypted=encrypted, size=size)
        _set_head(conn, principal, row, name, parsed, result, lock_id=lock_id, source=source)
    _after_write(db, result, after_bulk)
    if replaced:
        # The changed attribute names are derived from rows that no longer change: after the row lock, so a
        # write that replaces every row does not hold the state for the comparison; and, for many rows, after
        # the answer and the statistics refresh asked for above (its plan pairs the rows by a hash join).
        record = functools.partial(_record_changed_names, db, row.id, parsed.serial)
        limit = CHANGED_NAMES_INLINE if names_inline_max is None else names_inline_max
        if later is None or replaced < limit:
            record()
        else:
            later(record)
    return result


def _set_head(conn: psycopg.Connection, principal: Principal, row: StateRow, name: str,
              parsed: ParsedState | EncryptedState, result: WriteResult, *, lock_id: str | None,
              source: str) -> None:
    """Make the written version the head, with its token and its audit event (under the row lock)."""
    history.record_token(conn, version_id=result.version_id, token_name=principal.token_name)
    conn.execute(_SET_HEAD, (parsed.lineage, parsed.serial, result.version_id, row.id))
    detail: dict[str, object] = {"bytes": result.size, "opened": result.opened, "closed": result.closed,
                                 "source": source}
    if result.encrypted:
        detail["encrypted"] = True
    if row.lineage is not None and row.lineage != parsed.lineage:
        detail["lineage_changed_from"] = row.lineage
    events.record(conn, principal, "state_write", state_id=row.id, state_name=name,
                  serial=parsed.serial, lock_id=lock_id, **detail)


def _after_write(db: Database, result: WriteResult, after_bulk: Callable[[], None] | None) -> WriteResult:
    """A committed write's refresh of the statistics when it opened ``BULK_ROWS`` rows or more."""
    if result.opened >= BULK_ROWS:
        if after_bulk is None:
            refresh_statistics(db)
        else:
            after_bulk()
    return result


class _Moved(Exception):  # noqa: N818 - a signal inside this module, never raised to a caller
    """The optimistic first write found the state other than it assumed: roll back, write the usual way.
    Carries the parsed body when the parse had finished, so the usual way does not parse it again, and the
    state's row when it was found with a head (so the usual way does not create it again)."""

    def __init__(self, parsed: ParsedState | None = None, state: StateRow | None = None) -> None:
        super().__init__()
        self.parsed = parsed
        self.state = state


@dataclass(frozen=True, slots=True)
class _Usual:
    """What an optimistic first write that fell back hands to the usual way: the parsed body (None when not
    parsed), and the state's row when it was read and found with a head."""

    parsed: ParsedState | None = None
    state: StateRow | None = None
    digest: str | None = None  # the body's sha256, when the attempt computed it


def _first_write(db: Database, principal: Principal, name: str, body: bytes, *, lock_id: str | None,
                 source: str) -> WriteResult | _Usual:
    """The first write of a state (none, or one with no head yet), with its version and its rows stored while
    the body is parsed, so Postgres stores them on one core while Python parses on the other.

    Optimistic: in one transaction, before the state's row lock, it creates the state when missing, stores
    the version (``firstrows.FirstRows``) and streams the rows into a COPY as the parser makes them
    (``analyzer.state.parse_state_watched``); then it takes the row lock and checks that nothing it assumed
    moved (still no head, the same lock, no reservations, a serial the rules accept). Only the head's update,
    the outputs and the event run under the lock. When anything moved, when Postgres refuses a statement (a
    concurrent first writer's rows or version, a deadlock), or when the body is not in Terraform's own shape,
    everything rolls back and the caller writes the usual way, which gives today's answer (a 409, 423 or 400
    included) and leaves no row of this attempt, not even the state's. Returns the committed write, else what
    the usual way can reuse.
    """
    with db.transaction() as conn:
        found = _state_summary(conn, principal, name)
        attempt = firstrows.FirstRows(
            conn, tenant_id=principal.tenant_id, actor=principal.actor, source=source, body=body,
            # A missing state is created only once the body is known to stream: an envelope or an odd body
            # takes the usual way without a state created and rolled back (and its id spent).
            state_of=lambda: _id_and_lock(found or _created_state(conn, principal, name)))
        try:
            return _first_write_in(conn, principal, name, body, attempt, found, lock_id=lock_id, source=source)
        except _Moved as moved:
            conn.rollback()
            return _Usual(moved.parsed, moved.state, attempt.digest)
        except (psycopg.Error, StateLockedError, SerialConflictError):
            conn.rollback()
            return _Usual(digest=attempt.digest)


def _first_write_in(conn: psycopg.Connection, principal: Principal, name: str, body: bytes,
                    attempt: firstrows.FirstRows, found: StateRow | None, *, lock_id: str | None,
                    source: str) -> WriteResult:
    if found is not None and found.head_version_id is not None:
        raise _Moved(state=found)  # not a first write: the usual way
    if found is not None:
        check_lock_for_write(found.held_lock, lock_id, name)
    with attempt:
        parsed = parse_state_watched(body, attempt.watch)
        if parsed is None or not attempt.state_id:
            raise _Moved(parsed)  # raised inside the COPY, so it fails and stores nothing
        try:
            attempt.finish()
        except psycopg.Error:
            raise _Moved(parsed) from None  # the version was refused (another writer's): the usual way answers
    if attempt.version_fields not in (None, (parsed.lineage, parsed.terraform_version)):
        raise _Moved(parsed)  # the version holds other fields than the parse read (never for one body)
    try:
        return _commit_first(conn, principal, name, body, parsed, attempt, lock_id=lock_id, source=source)
    except (psycopg.Error, StateLockedError, SerialConflictError):
        raise _Moved(parsed) from None  # the usual way answers it, without parsing again


def _commit_first(conn: psycopg.Connection, principal: Principal, name: str, body: bytes, parsed: ParsedState,
                  attempt: firstrows.FirstRows, *, lock_id: str | None, source: str) -> WriteResult:
    """The optimistic first write once its rows are in: the version when not stored yet, then the row lock
    and its checks."""
    if not attempt.version_id:
        attempt.digest = attempt.digest or hashlib.sha256(body).hexdigest()
        attempt.version_id = rawwrite.insert_version(
            conn, tenant_id=principal.tenant_id, state_id=attempt.state_id, serial=parsed.serial,
            lineage=parsed.lineage, terraform_version=parsed.terraform_version, raw=body, sha256=attempt.digest,
            encrypted=False, source=source, actor=principal.actor,
        )
    version_id = attempt.version_id
    resources.remember_open_set(conn, state_id=attempt.state_id, version_id=version_id, rows=parsed.instances,
                                after_id=attempt.ids_after)
    locked = locked_row(conn, principal, name, create=False)
    if (locked is None or locked.id != attempt.state_id or locked.head_version_id is not None
            or locked.lock_id != attempt.lock_id):
        raise _Moved(parsed)
    check_lock_for_write(locked.held_lock, lock_id, name)
    check_new_serial(name, locked.current_serial, parsed.serial)
    if locked.held_lock is None and reservation_rows.live_for_state(
            conn, principal, state_id=locked.id, state_name=name, now=datetime.now(UTC), limit=1):
        raise _Moved(parsed)  # the usual way refuses it, with its audit event
    resources.insert_outputs(conn, tenant_id=principal.tenant_id, state_id=locked.id, version_id=version_id,
                             outputs=parsed.outputs)
    result = WriteResult(serial=parsed.serial, replay=False, opened=len(parsed.instances), closed=0,
                         version_id=version_id, size=len(body))
    _set_head(conn, principal, locked, name, parsed, result, lock_id=lock_id, source=source)
    return result


def _id_and_lock(row: StateRow) -> tuple[int, str | None]:
    return row.id, row.lock_id


def _created_state(conn: psycopg.Connection, principal: Principal, name: str) -> StateRow:
    """The state's row, created in this transaction when still missing (unlocked: the caller takes the row
    lock later)."""
    conn.execute(_ENSURE, (principal.tenant_id, principal.scope, name))
    row = _state_summary(conn, principal, name)
    if row is None or row.head_version_id is not None:
        raise _Moved  # deleted again, or written meanwhile by another first writer
    return row


def _state_summary(conn: psycopg.Connection, principal: Principal, name: str) -> StateRow | None:
    with conn.cursor(row_factory=class_row(StateRow)) as cur:
        return cur.execute(_SUMMARY, (principal.tenant_id, principal.scope, name)).fetchone()


# A write that opens this many rows (the first POST of a large state) makes the planner's row counts
# stale until autovacuum catches up, and slices and edge lookups then fall back to scanning the
# whole state: refresh them at once. It also fills the pending list of the GIN index on dependencies
# (new entries wait there, unsorted, until vacuum folds them in), which every dependents lookup of
# ``edges`` then reads through whatever it finds: fold it in at once as well.
BULK_ROWS = 5000
_ANALYZE = "ANALYZE resources"
_FOLD_PENDING = "SELECT gin_clean_pending_list('resources_alive_deps_gin'::regclass)"


# A whole-state write that replaced fewer rows than this records their changed attribute names before it
# answers (about 30 us a row, so at most ~0.15 s, less than the write spent projecting those rows), so the
# history table is complete for it when the client hears back; one that replaced more is a bulk write whose
# statistics refresh already runs after the answer, and its names follow that refresh there.
CHANGED_NAMES_INLINE = BULK_ROWS


def _record_changed_names(db: Database, state_id: int, serial: int) -> None:
    with db.transaction() as conn:
        history.record_changed_names_after_commit(conn, state_id=state_id, serial=serial)


def refresh_statistics(db: Database) -> None:
    """Bring the planner's statistics and the dependencies index up to a bulk write (after its commit,
    outside any state's row lock)."""
    with db.transaction() as conn:
        conn.execute(_ANALYZE)
    with db.transaction() as conn:
        conn.execute(_FOLD_PENDING)


def lock(db: Database, principal: Principal, name: str, body: bytes) -> None:
    """Take Terraform's whole-state lock; a same-ID re-LOCK is a replay and succeeds."""
    info = parse_lock_info(body, datetime.now(UTC))
    with db.transaction() as conn:
        row = locked_row(conn, principal, name, create=True)
        assert row is not None
        held = row.held_lock
        if held is not None:
            if held.id == info.id:
                return
            events.record(conn, principal, "lock_conflict", state_id=row.id, state_name=name,
                          lock_id=info.id, holder=held.id)
            # The conflict event must survive the 423, so commit it before raising.
            conn.commit()
            raise StateLockedError(
                f"state {name!r} is locked by {held.who or 'someone'} (lock {held.id})", lock_info=held.raw
            )
        _refuse_if_reserved(conn, principal, row, name, "lock", lock_id=info.id)
        conn.execute(_SET_LOCK, (info.id, info.raw, row.id))
        events.record(conn, principal, "lock", state_id=row.id, state_name=name, lock_id=info.id,
                      who=info.who, operation=info.operation)


def _refuse_if_reserved(
    conn: psycopg.Connection, principal: Principal, row: StateRow, name: str, what: str,
    lock_id: str | None = None,
) -> None:
    """Terraform's whole-state lock (and a lock-less whole-state POST) is a write reservation on
    ``*``: it must never run while a row-level apply holds reservations on this state."""
    now = datetime.now(UTC)
    live = reservation_rows.live_for_state(conn, principal, state_id=row.id, state_name=name, now=now)
    if not live:
        return
    events.record(conn, principal, "reservation_conflict", state_id=row.id, state_name=name, lock_id=lock_id,
                  request=what, glob="*", holders=sorted({h.holder for h in live}),
                  runs=sorted({h.run_id for h in live}))
    conn.commit()  # keep the audit event (and any reclaim) although the request is refused
    raise StateLockedError(
        f"state {name!r} has live reservations held by {', '.join(sorted({h.holder for h in live}))}: "
        "wait for their apply runs to finish (terraform -lock-timeout waits)",
        lock_info=synthesize_lock_info(live, now),
    )


def unlock(db: Database, principal: Principal, name: str, request: UnlockRequest) -> None:
    """Release the lock. Owner releases compare only the ID; force releases always succeed.
    Unlocking an unlocked (or unknown) state succeeds, so force-unlock is safe to re-run."""
    with db.transaction() as conn:
        row = locked_row(conn, principal, name, create=False)
        if row is None or row.held_lock is None:
            return
        held = row.held_lock
        if not request.force and request.lock_id != held.id:
            raise StateLockedError(
                f"state {name!r} is locked by {held.who or 'someone'} with lock {held.id}, not "
                f"{request.lock_id!r}: use that ID, or terraform force-unlock",
                lock_info=held.raw,
            )
        conn.execute(_CLEAR_LOCK, (row.id,))
        if request.force:
            events.record(conn, principal, "lock_force_release", state_id=row.id, state_name=name,
                          lock_id=held.id, presented_id=request.lock_id or None,
                          matched=request.lock_id == held.id)
        else:
            events.record(conn, principal, "unlock", state_id=row.id, state_name=name, lock_id=held.id)


def delete_state(db: Database, principal: Principal, name: str, *, lock_id: str | None) -> None:
    """Remove a state and everything hanging off it; refused (423) while locked by another ID."""
    with db.transaction() as conn:
        row = locked_row(conn, principal, name, create=False)
        if row is None:
            raise StateNotFoundError(f"no state named {name!r}")
        check_lock_for_write(row.held_lock, lock_id, name)
        if row.held_lock is None:
            _refuse_if_reserved(conn, principal, row, name, "delete")
        conn.execute(_DELETE, (row.id,))
        events.record(conn, principal, "state_delete", state_id=None, state_name=name,
                      serial=row.current_serial, lock_id=lock_id)


def version_at(conn: psycopg.Connection, state_id: int, serial: int) -> VersionRef | None:
    """The newest version at or below ``serial``."""
    with conn.cursor(row_factory=class_row(VersionRef)) as cur:
        return cur.execute(_VERSION_AT, (state_id, serial)).fetchone()
