"""Reservation rules: which held reservations a request conflicts with, leases, fair waiting,
and the human conflict message. Pure: time is always a parameter.

The conflict matrix itself (read/read never conflicts, any intersection with a write does) is
``analyzer.globs.conflicts``; this module applies it to rows through a ``GlobIndex`` per mode (a
requested write meets held reads and writes, a requested read only held writes), never pairwise.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from functools import lru_cache

from analyzer.globs import Glob, GlobError, Reservation, canonical, parse_glob, stored_glob
from analyzer.globs import Mode as Mode  # re-exported: its old home
from app.domain.durations import format_duration as format_duration  # re-exported: its old home
from app.domain.globindex import GlobIndex
from app.domain.locking import LockInfo, lock_holder, rfc3339
from app.domain.manual_holds import is_manual_holder
from app.errors import BadRequestError

DEFAULT_LEASE = timedelta(minutes=15)
MIN_LEASE = timedelta(seconds=1)
MAX_LEASE = timedelta(hours=12)
EVERYTHING = "*"
OUTPUTS_ROOT = "output"
# Default caps (KL_MAX_GLOBS_PER_REQUEST / KL_MAX_GLOBS_PER_RUN): every glob costs a walk of the held
# index under the state's row lock, so their number is what bounds a request's time there.
DEFAULT_MAX_GLOBS_PER_REQUEST = 1000
DEFAULT_MAX_GLOBS_PER_RUN = 5000
# How many conflicts an answer and its audit event list; the rest are counted.
SHOWN_CONFLICTS = 20


class RunStatus(StrEnum):
    RESERVED = "reserved"
    RUNNING = "running"
    ABORTING = "aborting"  # aborted while applying: holds its reservations until its Terraform has stopped
    COMMITTED = "committed"
    FAILED = "failed"
    ABORTED = "aborted"
    EXPIRED = "expired"

    @property
    def is_live(self) -> bool:
        return self in LIVE_STATUSES


# The statuses of a run that holds its reservations: the one list of them (the store spells it in SQL,
# matching the partial index of live runs).
LIVE_STATUSES: tuple[RunStatus, ...] = (RunStatus.RESERVED, RunStatus.RUNNING, RunStatus.ABORTING)


@dataclass(frozen=True, slots=True)
class Wanted:
    """One requested reservation."""

    glob: Glob
    mode: Mode

    @property
    def text(self) -> str:
        return canonical(self.glob)


@dataclass(frozen=True, slots=True)
class Held:
    """A reservation somebody holds (or held: it may have expired). ``run_id`` is empty for
    Terraform's own state lock, which counts as a write reservation on ``*``."""

    glob: str
    mode: Mode
    holder: str
    run_id: str
    acquired_at: datetime
    expires_at: datetime | None

    def is_expired(self, now: datetime) -> bool:
        return self.expires_at is not None and self.expires_at <= now


def terraform_lock_hold(lock: LockInfo, acquired_at: datetime) -> Held:
    """Terraform's state lock as a reservation: a write on ``*`` without a lease (it ends at UNLOCK)."""
    return Held(glob=EVERYTHING, mode=Mode.WRITE, holder=lock_holder(lock), run_id="", acquired_at=acquired_at,
                expires_at=None)


@dataclass(frozen=True, slots=True)
class Conflict:
    wanted: Wanted
    held: Held


def parse_wanted(
    items: Iterable[Reservation | tuple[str, str]], *, limit: int = DEFAULT_MAX_GLOBS_PER_REQUEST,
) -> tuple[Wanted, ...]:
    """Validate reservations (typed, or (glob, mode) text pairs from a request); raise BadRequestError
    naming the bad one, or when there are more than ``limit`` of them (counted before duplicates collapse,
    so the parse itself is bounded). Duplicates collapse, and a read on a glob also written by the same
    request is dropped."""
    found: dict[tuple[str, Mode], Wanted] = {}
    for count, item in enumerate(items, start=1):
        if count > limit:
            raise BadRequestError(
                f"a request may name at most {limit} reservation globs: reserve a module or resource "
                "prefix ('module.NAME.*', 'TYPE.NAME.*') instead of many instances"
            )
        glob_text, mode_text = (item.glob, item.mode) if isinstance(item, Reservation) else item
        try:
            mode = Mode(mode_text)
        except ValueError as exc:
            raise BadRequestError(f"unknown reservation mode {mode_text!r}: use read or write") from exc
        try:
            glob = parse_glob(glob_text)
        except GlobError as exc:
            raise BadRequestError(f"invalid reservation glob {glob_text!r}: {exc}") from exc
        wanted = Wanted(glob=glob, mode=mode)
        found[(wanted.text, mode)] = wanted
    return tuple(
        w for (text, mode), w in found.items() if not (mode is Mode.READ and (text, Mode.WRITE) in found)
    )


@lru_cache(maxsize=65536)
def glob_root(glob_text: str) -> str:
    """The first step of a glob, from its parsed form: ``module.NAME``, ``TYPE.NAME``,
    ``data.TYPE.NAME``, ``output`` (every output glob) or ``*``. Globs whose roots differ (and neither
    is ``*``) can never intersect, which is what the store's root index relies on. A root module's type glob
    (``aws_iam_role.*``) meets every ``aws_iam_role.NAME`` root, so its root is ``*``: it is read by every
    conflict check of the state, and reads every reservation of the state when it is requested."""
    glob = _parsed(glob_text)
    if glob.is_everything or (glob.resource_type is not None and not glob.module):
        return EVERYTHING
    if glob.is_output:
        return OUTPUTS_ROOT
    if glob.module:
        return "module." + glob.module[0].name
    assert glob.resource is not None  # exact and resource globs at the root
    mode, type_, name = glob.resource
    return f"data.{type_}.{name}" if mode == "data" else f"{type_}.{name}"


@lru_cache(maxsize=65536)
def _parsed(text: str) -> Glob:
    """Held globs recur on every acquire of a busy state; parsing them once is enough. One that no longer
    parses blocks everything (``stored_glob``)."""
    return stored_glob(text)


def find_conflicts(
    wanted: Sequence[Wanted], held: Iterable[Held], now: datetime | None, *, limit: int | None = None,
) -> list[Conflict]:
    """Every (request, holding) pair that conflicts, in request order, or the first ``limit`` of
    them. Expired holdings never block; with ``now=None`` expiry is ignored (to find the expired
    holdings a request meets).

    The holdings are indexed once (``GlobIndex``), so each requested glob walks only the branches
    it can meet: the cost follows the conflicts found, not requested × held."""
    writes: GlobIndex[Held] = GlobIndex()
    reads: GlobIndex[Held] = GlobIndex()
    for h in held:
        if now is not None and h.is_expired(now):
            continue
        (writes if h.mode is Mode.WRITE else reads).add(_parsed(h.glob), h)
    found: list[Conflict] = []
    for w in wanted:
        indexes = (writes, reads) if w.mode is Mode.WRITE else (writes,)
        for index in indexes:
            for _, h in index.meeting(w.glob):
                found.append(Conflict(wanted=w, held=h))
                if limit is not None and len(found) >= limit:
                    return found
    return found


def blocks(wanted: Sequence[Wanted], earlier: Iterable[Sequence[Wanted]]) -> bool:
    """Whether an earlier waiter's request conflicts with ours: then it goes first (FIFO among
    requests that compete for the same addresses; unrelated requests do not wait on each other)."""
    writes: GlobIndex[None] = GlobIndex()
    reads: GlobIndex[None] = GlobIndex()
    for other in earlier:
        for b in other:
            (writes if b.mode is Mode.WRITE else reads).add(b.glob, None)
    return any(
        index.any_meeting(a.glob) for a in wanted for index in ((writes, reads) if a.mode is Mode.WRITE else (writes,))
    )


@dataclass(frozen=True, slots=True)
class Waiter:
    """An earlier request in a state's queue: who waits, for which run (None: it would open a new one),
    since when, and what it wants."""

    holder: str
    run_id: str | None
    enqueued_at: datetime
    wanted: tuple[Wanted, ...]


# A refusal because earlier waiters go first names this many of them.
SHOWN_WAITERS = 5


def waiting_ahead(wanted: Sequence[Wanted], earlier: Sequence[Waiter]) -> list[Waiter]:
    """The earlier waiters, in queue order, whose requests each conflict with ``wanted`` (those that go first)."""
    return [w for w in earlier if blocks(wanted, [w.wanted])]


def describe_waiting(ahead: Sequence[Waiter], now: datetime, limit: int = SHOWN_WAITERS) -> str:
    """``reservation conflict: earlier waiting requests for the same addresses go first: alice (run ar_…,
    waiting 12s for module.web.*), …``, naming the first ``limit`` and counting the rest."""
    parts = []
    for w in ahead[:limit]:
        run = f"run {w.run_id}" if w.run_id else "a new run"
        globs = ", ".join(x.text for x in w.wanted[:3])
        if len(w.wanted) > 3:
            globs += f" and {len(w.wanted) - 3} more"
        parts.append(f"{w.holder} ({run}, waiting {format_duration(now - w.enqueued_at)} for {globs})")
    more = f"; and {len(ahead) - limit} more" if len(ahead) > limit else ""
    named = f": {'; '.join(parts)}{more}" if parts else ""
    return (f"reservation conflict: earlier waiting requests for the same addresses go first{named}; "
            "retry with a longer wait (kl apply --wait), or after they are granted")


def shown_conflicts(found: Sequence[Conflict], limit: int = SHOWN_CONFLICTS) -> tuple[list[Conflict], int]:
    """The first ``limit`` conflicts an answer or audit event lists, and how many it leaves out."""
    return list(found[:limit]), max(len(found) - limit, 0)


def lease_for(seconds: float | None) -> timedelta:
    if seconds is None:
        return DEFAULT_LEASE
    if not MIN_LEASE.total_seconds() <= seconds <= MAX_LEASE.total_seconds():  # before timedelta can overflow
        raise BadRequestError(
            f"lease_seconds must be between {int(MIN_LEASE.total_seconds())} and {int(MAX_LEASE.total_seconds())}"
        )
    return timedelta(seconds=seconds)


# A pull-request hold is an apply run whose lease is decades long: it ends at merge, close or unlock, never
# by lapsing. Any lease longer than this reads as such a hold.
HOLD_LEASE = timedelta(days=365 * 60)
_HOLD_THRESHOLD = timedelta(days=365 * 10)


def _lease_text(held: Held, now: datetime) -> str:
    if held.expires_at is None:
        return "no lease"
    if held.expires_at - now > _HOLD_THRESHOLD:
        if is_manual_holder(held.holder):
            return "no expiry: held until released"
        return ("a pull-request hold, no lease: it ends when the pull request is merged or closed, "
                "or at `kilolock unlock`")
    return f"expires in {format_duration(held.expires_at - now)}"


def describe(conflict: Conflict, now: datetime) -> str:
    """``reservation conflict on module.web.*: held by alice (run ar_4f2a…, acquired 12s ago,
    expires in 14m48s)``."""
    h = conflict.held
    if not h.run_id:
        where = f"Terraform state lock, acquired {format_duration(now - h.acquired_at)} ago, no lease"
    else:
        where = f"run {h.run_id}, acquired {format_duration(now - h.acquired_at)} ago, {_lease_text(h, now)}"
    shown = conflict.wanted.text if conflict.wanted.text == h.glob else f"{conflict.wanted.text} ({h.mode} {h.glob})"
    return f"reservation conflict on {shown}: held by {h.holder} ({where})"


def synthesize_lock_info(held: Sequence[Held], now: datetime) -> bytes:
    """A Terraform LockInfo describing live reservations, for a LOCK or whole-state POST they
    block: a non-empty ID and an RFC 3339 Created, so Terraform shows it and -lock-timeout waits."""
    holders = sorted({h.holder for h in held})
    runs = sorted({h.run_id for h in held if h.run_id})
    parts = []
    for h in held[:10]:
        lease = "" if h.expires_at is None else f", {_lease_text(h, now)}"
        parts.append(f"{h.mode} {h.glob} (run {h.run_id}, {h.holder}{lease})")
    if len(held) > 10:
        parts.append(f"and {len(held) - 10} more")
    return json.dumps({
        "ID": "kilolock-reservations:" + (runs[0] if runs else "live"),
        "Operation": "OperationTypeApply",
        "Info": "resources reserved by Kilolock apply runs: " + "; ".join(parts),
        "Who": ", ".join(holders),
        "Version": "",
        "Created": rfc3339(min(h.acquired_at for h in held)),
        "Path": "",
    }).encode()
