"""Pull-request holds (migrations/0013_pull_request_holds.sql): the write globs a pull request applied
from a ``kilolock apply`` comment, kept until it is merged or closed or a ``kilolock unlock`` releases them.

A hold is an apply run of its own: its holder is the pull request (``owner/repo#N``), it holds only write
reservations, its info carries ``{"pr_hold": …}``, and its lease is :data:`HOLD_LEASE` (decades), so it
never lapses on its own. Being ordinary reservations, holds are refused, waited for and shown by the
existing paths: another run's acquisition meets them (``kl apply`` exit 2, the bot's applies), Terraform's
LOCK gets 423 naming the holder, ``GET /v1/engine/reservations``, ``kl reservations`` and the dashboard list
them. The ``pull_request_holds`` row ties the run to the pull request, project and applied commit, so that
merges, closes, unlocks and reconciliation find it again. :func:`blocking` answers which other pull
requests' live holds a footprint's globs meet (the refusal of ``kilolock apply`` and the comment use it).

Must not: decide when a hold starts or ends (the bot's jobs do), or talk to GitHub.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from psycopg.rows import class_row

from analyzer.globs import footprint_reservations, texts_conflict
from app.domain.names import split_scoped_path
from app.domain.principal import Principal
from app.domain.reservations import HOLD_LEASE, Mode, RunStatus, Wanted, parse_wanted
from app.errors import BadRequestError, RunClosedError, RunNotFoundError
from app.store import events, runs
from app.store.db import LIVE_STATUSES_SQL, Database

# Holds end by events, not by time: a lease this long never lapses in practice, and still fits the
# integer lease_seconds column (60 years < 2**31 seconds).

_FIELDS = f"""
h.repo, h.number, h.project, h.tenant_id, h.scope, h.token_name, h.state_name, h.run_id, h.head_sha, h.applied_serial,
h.applied_run_id, h.write_globs, h.created_at, (r.status IN {LIVE_STATUSES_SQL}) AS live
"""
_INSERT = """
INSERT INTO pull_request_holds (repo, number, project, tenant_id, scope, token_name, state_name, run_id,
                                head_sha, applied_serial, applied_run_id, write_globs)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
"""
_OF_PULL = f"""
SELECT {_FIELDS} FROM pull_request_holds h JOIN apply_runs r ON r.id = h.run_id
WHERE h.repo = %s AND h.number = %s ORDER BY h.project
"""
_OF_REPO = f"""
SELECT {_FIELDS} FROM pull_request_holds h JOIN apply_runs r ON r.id = h.run_id
WHERE h.repo = %s ORDER BY h.number, h.project
"""
_ON_STATE = f"""
SELECT {_FIELDS} FROM pull_request_holds h JOIN apply_runs r ON r.id = h.run_id
WHERE h.repo = %s AND h.state_name = %s ORDER BY h.number, h.project
"""
_OF_TENANT = f"""
SELECT {_FIELDS} FROM pull_request_holds h JOIN apply_runs r ON r.id = h.run_id
WHERE h.tenant_id = %s AND h.scope = %s ORDER BY h.created_at, h.repo, h.number, h.project LIMIT %s
"""
_DROP = "DELETE FROM pull_request_holds WHERE repo = %s AND number = %s AND project = %s AND run_id = %s"


@dataclass(frozen=True, slots=True)
class PrHold:
    """One project's hold by one pull request. ``live`` is false when its run was ended behind the bot's
    back (``kl abort``): the row is then only a record, released on the next event."""

    repo: str
    number: int
    project: str
    tenant_id: int
    scope: str
    token_name: str
    state_name: str
    run_id: str
    head_sha: str
    applied_serial: int | None
    applied_run_id: str | None
    write_globs: tuple[str, ...]
    created_at: datetime
    live: bool

    def __post_init__(self) -> None:
        object.__setattr__(self, "write_globs", tuple(self.write_globs))

    @property
    def holder(self) -> str:
        return holder_of(self.repo, self.number)


def holder_of(repo: str, number: int) -> str:
    """The reservations' holder for a pull request: ``owner/repo#N``."""
    return f"{repo}#{number}"


def take(db: Database, principal: Principal, *, repo: str, number: int, project: str, state_name: str,
         write_globs: Sequence[str], head_sha: str, applied_serial: int | None, applied_run_id: str | None,
         max_globs: int, clock: runs.Clock = runs.utcnow) -> PrHold:
    """Hold ``write_globs`` on the state for the pull request (all-or-nothing, no waiting). Raises
    ReservationConflictError naming whoever holds an intersecting glob, or BadRequestError when the hold
    would have more than ``max_globs`` globs (the per-run cap every apply run has); nothing is held then.
    The pull request must not hold this project already (release it first)."""
    holder = holder_of(repo, number)
    wanted: tuple[Wanted, ...] = parse_wanted(footprint_reservations(sorted(set(write_globs)), ()))
    if len(wanted) > max_globs:
        raise BadRequestError(f"a hold of {len(wanted)} write globs is more than a run may hold ({max_globs}, "
                              "KL_MAX_GLOBS_PER_RUN): apply module or resource prefixes instead of many instances")
    info = {"pr_hold": {"repo": repo, "number": number, "project": project, "head_sha": head_sha,
                        "applied_serial": applied_serial, "applied_run_id": applied_run_id}}
    # A database-mode backend address names the state with its scope (ws_…/env_…/NAME): the run is opened on
    # NAME in the holder's scope, the row keeps the project's name for the bot's own lookups.
    scope, name = split_scoped_path(state_name)
    if scope is not None and scope != principal.scope:
        raise BadRequestError(f"state {state_name!r} is not in the environment of the bot's token ({principal.scope})")
    run = runs.open_run(db, principal, name, actor=holder, wanted=wanted, lease=HOLD_LEASE, info=info,
                        clock=clock)
    try:
        with db.transaction() as conn:
            conn.execute(_INSERT, (repo, number, project, principal.tenant_id, principal.scope, principal.token_name,
                                   state_name, run.id, head_sha, applied_serial, applied_run_id,
                                   [w.text for w in wanted]))
            events.record(conn, principal, "pr_hold_taken", state_id=run.state_id, state_name=state_name,
                          run_id=run.id, holder=holder, repo=repo, number=number, project=project,
                          sha=head_sha, globs=[w.text for w in wanted[:200]])
    except Exception:
        _end_run(db, principal, run.id, holder, "the hold could not be recorded")
        raise
    found = [h for h in of_pull_request(db, repo, number) if h.project == project]
    assert found, "the hold was just recorded"
    return found[0]


def release(db: Database, hold: PrHold, reason: str) -> None:
    """End a hold: its run is closed (aborted, with ``reason``) so its reservations go now, and the row is
    dropped. A run that already ended (``kl abort``) only loses its row."""
    # The credential that opened the hold run ends it (a run belongs to the credential that opened it).
    principal = Principal(tenant_id=hold.tenant_id, actor=hold.holder, scope=hold.scope, token_name=hold.token_name)
    _end_run(db, principal, hold.run_id, hold.holder, reason)
    with db.transaction() as conn:
        dropped = conn.execute(_DROP + " RETURNING run_id", (hold.repo, hold.number, hold.project, hold.run_id))
        if dropped.fetchone() is not None:
            events.record(conn, principal, "pr_hold_released", state_id=None, state_name=hold.state_name,
                          run_id=hold.run_id, holder=hold.holder, repo=hold.repo, number=hold.number,
                          project=hold.project, reason=reason[:200], globs=list(hold.write_globs[:200]))


def _end_run(db: Database, principal: Principal, run_id: str, holder: str, reason: str) -> None:
    try:
        runs.close_run(db, principal, run_id, holder=holder, status=RunStatus.ABORTED, error_summary=reason)
    except (RunClosedError, RunNotFoundError):
        pass


def of_pull_request(db: Database, repo: str, number: int) -> list[PrHold]:
    """Every hold of one pull request, by project."""
    with db.transaction() as conn, conn.cursor(row_factory=class_row(PrHold)) as cur:
        return cur.execute(_OF_PULL, (repo, number)).fetchall()


def of_repo(db: Database, repo: str) -> list[PrHold]:
    """Every hold of a repository's pull requests (what reconciliation checks)."""
    with db.transaction() as conn, conn.cursor(row_factory=class_row(PrHold)) as cur:
        return cur.execute(_OF_REPO, (repo,)).fetchall()


def on_state(db: Database, repo: str, state_name: str) -> list[PrHold]:
    """The repository's pull-request holds on one state."""
    with db.transaction() as conn, conn.cursor(row_factory=class_row(PrHold)) as cur:
        return cur.execute(_ON_STATE, (repo, state_name)).fetchall()


def of_tenant(db: Database, principal: Principal, *, limit: int = 500) -> list[PrHold]:
    """The holds in the principal's tenant and scope, oldest first (the dashboard's list)."""
    with db.transaction() as conn, conn.cursor(row_factory=class_row(PrHold)) as cur:
        return cur.execute(_OF_TENANT, (principal.tenant_id, principal.scope, limit)).fetchall()


def blocking(db: Database, repo: str, number: int, state: str, write_globs: Sequence[str],
             read_globs: Sequence[str]) -> list[tuple[PrHold, list[str]]]:
    """Other pull requests' live holds on ``state`` that a run with these globs would conflict with, and
    the globs of theirs it meets."""
    mine = footprint_reservations(write_globs, read_globs)
    found: list[tuple[PrHold, list[str]]] = []
    for hold in on_state(db, repo, state):
        if hold.number == number or not hold.live:
            continue
        met = [theirs for theirs in hold.write_globs
               if any(texts_conflict(r.mode, r.glob, Mode.WRITE, theirs) for r in mine)]
        if met:
            found.append((hold, met))
    return found
