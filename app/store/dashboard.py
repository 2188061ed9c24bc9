"""Reads for the operator dashboard: state overviews, head resources and outputs, one resource's
lifecycles and neighbourhood, a run's audit trail, and the token behind a dashboard session.

Every read is scoped by the principal's tenant and scope, like the rest of the store. Reads never
return state bodies or private instance data: only the attributes and sensitive paths of one
instance, and outputs with sensitive values replaced by NULL before they leave the database.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from psycopg.rows import class_row

from app.domain import scopes
from app.domain.jobs import JobKind
from app.domain.locking import lock_holder, stored_lock
from app.domain.principal import Principal
from app.errors import NotFoundError, StateNotFoundError
from app.store import states
from app.store.bot import PrFootprint
from app.store.db import LIVE_STATUSES_SQL, Database
from app.store.tenancy import AuthenticatedToken, hash_secret

_OVERVIEWS = f"""
SELECT s.name, s.current_serial, s.lock_info, s.locked_at, v.created_at AS last_write_at,
       v.actor AS last_writer, v.source AS last_source,
       (SELECT count(*) FROM resources r WHERE r.state_id = s.id AND r.delete_serial IS NULL) AS resources,
       (SELECT count(*) FROM resource_reservations x WHERE x.state_id = s.id AND x.expires_at > %(now)s)
           AS live_reservations,
       (SELECT count(*) FROM apply_runs a WHERE a.state_id = s.id AND a.status IN {LIVE_STATUSES_SQL})
           AS live_runs
FROM states s LEFT JOIN state_versions v ON v.id = s.head_version_id
WHERE s.tenant_id = %(tenant)s AND s.scope = %(scope)s
ORDER BY s.name
"""
_HEAD = """
SELECT s.name, s.current_serial, s.lineage, s.lock_info, s.locked_at, v.created_at AS written_at,
       v.actor AS written_by, v.source, v.terraform_version, v.encrypted, v.size_bytes
FROM states s LEFT JOIN state_versions v ON v.id = s.head_version_id
WHERE s.tenant_id = %s AND s.scope = %s AND s.name = %s
"""
# ILIKE with the filter's wildcards escaped: operators filter by any part of an address.
_HEAD_RESOURCES = """
SELECT address, type, mode, status, deposed, provider, create_serial, count(*) OVER () AS total
FROM resources
WHERE state_id = %(state_id)s AND delete_serial IS NULL
  AND (%(pattern)s::text IS NULL OR address ILIKE %(pattern)s)
ORDER BY address, deposed
LIMIT %(limit)s
"""
_COUNT_HEAD = "SELECT count(*) FROM resources WHERE state_id = %s AND delete_serial IS NULL"
_HEAD_OUTPUTS = """
SELECT o.name, CASE WHEN o.sensitive THEN NULL ELSE o.value::text END AS value_json, o.type::text AS type_json,
       o.sensitive
FROM outputs o WHERE o.state_version_id = %s ORDER BY o.name
"""
_LIFECYCLES = """
SELECT r.create_serial, r.delete_serial, r.deposed, r.status, r.type, r.provider,
       r.instance -> 'attributes' AS attributes, r.instance -> 'sensitive_attributes' AS sensitive_attributes,
       v.created_at AS created_at, v.actor AS created_by
FROM resources r LEFT JOIN state_versions v ON v.state_id = r.state_id AND v.serial = r.create_serial
WHERE r.state_id = %s AND r.address = %s
ORDER BY r.create_serial, r.deposed
"""
_UPSTREAM = """
SELECT DISTINCT t.address FROM resources r
JOIN resources t ON t.state_id = r.state_id AND t.resource_address = ANY(r.dependencies) AND t.deposed = ''
                AND t.delete_serial IS NULL
WHERE r.state_id = %s AND r.address = %s AND r.delete_serial IS NULL
ORDER BY t.address LIMIT %s
"""
_DOWNSTREAM = """
SELECT DISTINCT d.address FROM resources r
JOIN resources d ON d.state_id = r.state_id AND r.resource_address = ANY(d.dependencies) AND d.delete_serial IS NULL
WHERE r.state_id = %s AND r.address = %s AND r.delete_serial IS NULL
ORDER BY d.address LIMIT %s
"""
_RUN_EVENTS = """
SELECT e.id, e.kind, e.actor, e.serial, e.detail, e.created_at
FROM events e JOIN apply_runs a ON a.state_id = e.state_id
WHERE a.id = %(run)s AND a.tenant_id = %(tenant)s AND e.tenant_id = %(tenant)s AND e.scope = %(scope)s
  AND e.detail ->> 'run_id' = %(run)s
ORDER BY e.id DESC LIMIT %(limit)s
"""
_TOKEN_BY_ID = """
SELECT t.id, t.tenant_id, t.name, w.public_id AS workspace_id, e.public_id AS environment_id, t.scopes
FROM api_tokens t JOIN environments e ON e.id = t.environment_id JOIN workspaces w ON w.id = e.workspace_id
WHERE t.id = %s AND t.revoked_at IS NULL
"""
_TOKEN_ID_BY_SECRET = "SELECT id FROM api_tokens WHERE token_hash = %s AND revoked_at IS NULL"

# The jobs a pull request's last apply is one of: a merge's fan-out, or one project's apply.
_APPLIES = frozenset({JobKind.MERGE, JobKind.APPLY_PROJECT})


@dataclass(frozen=True, slots=True)
class StateOverview:
    name: str
    current_serial: int | None
    lock_holder: str | None
    locked_at: datetime | None
    last_write_at: datetime | None
    last_writer: str | None
    last_source: str | None
    resources: int
    live_reservations: int
    live_runs: int


@dataclass(frozen=True, slots=True)
class StateHead:
    name: str
    current_serial: int | None
    lineage: str | None
    lock_holder: str | None
    locked_at: datetime | None
    written_at: datetime | None
    written_by: str | None
    source: str | None
    terraform_version: str | None
    encrypted: bool
    size_bytes: int | None


@dataclass(frozen=True, slots=True)
class ResourceLine:
    address: str
    type: str
    mode: str
    status: str
    deposed: str
    provider: str
    create_serial: int


@dataclass(frozen=True, slots=True)
class ResourcePage:
    serial: int | None
    total: int
    matched: int
    lines: tuple[ResourceLine, ...]


@dataclass(frozen=True, slots=True)
class OutputLine:
    """An output at the head; ``value_json`` is None for sensitive outputs."""

    name: str
    value_json: str | None
    type_json: str
    sensitive: bool


@dataclass(frozen=True, slots=True)
class Lifecycle:
    """One lifecycle of an instance: alive for ``[create_serial, delete_serial)``."""

    create_serial: int
    delete_serial: int | None
    deposed: str
    status: str
    type: str
    provider: str
    attributes: dict[str, Any] | None
    sensitive_attributes: Any
    created_at: datetime | None
    created_by: str | None


@dataclass(frozen=True, slots=True)
class Neighbourhood:
    depends_on: tuple[str, ...]
    dependents: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RunEvent:
    id: int
    kind: str
    actor: str
    serial: int | None
    detail: dict[str, Any]
    created_at: datetime


def _lock_holder(lock_info: bytes | None) -> str | None:
    return None if lock_info is None else lock_holder(stored_lock("", bytes(lock_info)))


def state_overviews(db: Database, principal: Principal, *, now: datetime) -> list[StateOverview]:
    """Every state of the caller's scope with its head, lock holder, live reservations and runs."""
    params = {"tenant": principal.tenant_id, "scope": principal.scope, "now": now}
    with db.transaction() as conn:
        rows = conn.execute(_OVERVIEWS, params).fetchall()
    return [
        StateOverview(name=name, current_serial=serial, lock_holder=_lock_holder(lock_info), locked_at=locked_at,
                      last_write_at=written, last_writer=writer, last_source=source, resources=count,
                      # Terraform's own lock is a write reservation of the whole state, as kl reservations lists it.
                      live_reservations=held + (1 if lock_info is not None else 0), live_runs=live)
        for name, serial, lock_info, locked_at, written, writer, source, count, held, live in rows
    ]


def state_head(db: Database, principal: Principal, name: str) -> StateHead:
    """The state's head version summary (not its body). Raises StateNotFoundError."""
    with db.transaction() as conn:
        row = conn.execute(_HEAD, (principal.tenant_id, principal.scope, name)).fetchone()
    if row is None:
        raise StateNotFoundError(f"no state named {name!r}")
    (name, serial, lineage, lock_info, locked_at, written_at, written_by, source, tf_version, encrypted,
     size) = row
    return StateHead(name=name, current_serial=serial, lineage=lineage, lock_holder=_lock_holder(lock_info),
                     locked_at=locked_at, written_at=written_at, written_by=written_by, source=source,
                     terraform_version=tf_version, encrypted=bool(encrypted), size_bytes=size)


def _like_pattern(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def head_resources(
    db: Database, principal: Principal, name: str, *, contains: str | None = None, limit: int = 500,
) -> ResourcePage:
    """Instances alive at the head whose address contains ``contains`` (case-insensitive), at most
    ``limit`` of them, with the number that matched and the state's total."""
    with db.transaction() as conn:
        row = states.find_state(conn, principal, name)
        params = {"state_id": row.id, "pattern": _like_pattern(contains) if contains else None, "limit": limit}
        found = conn.execute(_HEAD_RESOURCES, params).fetchall()
        (total,) = conn.execute(_COUNT_HEAD, (row.id,)).fetchone() or (0,)
    lines = tuple(ResourceLine(address=a, type=t, mode=m, status=s, deposed=d, provider=p, create_serial=c)
                  for a, t, m, s, d, p, c, _ in found)
    matched = int(found[0][7]) if found else 0
    if principal.scopes is not None:  # a scoped token sees (and counts) only what its read scopes cover
        lines = tuple(line for line in lines if scopes.can_read(principal.scopes, line.address))
        matched = total = len(lines)
    return ResourcePage(serial=row.current_serial, total=int(total), matched=matched, lines=lines)


def head_outputs(db: Database, principal: Principal, name: str) -> list[OutputLine]:
    """The head version's outputs; sensitive values are dropped in SQL and never leave the database."""
    with db.transaction() as conn:
        row = states.find_state(conn, principal, name)
        if row.head_version_id is None:
            return []
        with conn.cursor(row_factory=class_row(OutputLine)) as cur:
            found = cur.execute(_HEAD_OUTPUTS, (row.head_version_id,)).fetchall()
    return [o for o in found if scopes.can_read_output(principal.scopes, o.name)]


def lifecycles(db: Database, principal: Principal, name: str, address: str) -> list[Lifecycle]:
    """Every lifecycle of one instance address, oldest first (attributes only, no private data).
    Raises StateNotFoundError, NotFoundError when the state never held the address, or AddressScopeError."""
    scopes.check_readable(principal.scopes, name, address)
    with db.transaction() as conn:
        row = states.find_state(conn, principal, name)
        with conn.cursor(row_factory=class_row(Lifecycle)) as cur:
            found = cur.execute(_LIFECYCLES, (row.id, address)).fetchall()
    if not found:
        raise NotFoundError(f"state {name!r} has never held {address!r}")
    return found


def neighbourhood(db: Database, principal: Principal, name: str, address: str, *, limit: int = 200) -> Neighbourhood:
    """What the live instance depends on and what depends on its resource, at the head."""
    with db.transaction() as conn:
        row = states.find_state(conn, principal, name)
        upstream = [a for (a,) in conn.execute(_UPSTREAM, (row.id, address, limit))]
        downstream = [a for (a,) in conn.execute(_DOWNSTREAM, (row.id, address, limit)) if a != address]
    readable = principal.scopes
    return Neighbourhood(depends_on=tuple(a for a in upstream if scopes.can_read(readable, a)),
                         dependents=tuple(a for a in downstream if scopes.can_read(readable, a)))


def run_events(db: Database, principal: Principal, run_id: str, *, limit: int = 50) -> list[RunEvent]:
    """The newest audit events that name this run (its log tail), newest first."""
    params = {"run": run_id, "tenant": principal.tenant_id, "scope": principal.scope, "limit": limit}
    with db.transaction() as conn, conn.cursor(row_factory=class_row(RunEvent)) as cur:
        found = cur.execute(_RUN_EVENTS, params).fetchall()
    return [e for e in found if scopes.readable_event(principal.scopes, e.detail)]


def token_id_for_secret(db: Database, secret: str) -> int | None:
    """The internal id of the active token with this secret: a dashboard session keeps the id,
    never the secret, and re-checks it on every request so revocation ends the session."""
    with db.transaction() as conn:
        found = conn.execute(_TOKEN_ID_BY_SECRET, (hash_secret(secret),)).fetchone()
    return None if found is None else int(found[0])


def session_token(db: Database, token_id: int) -> AuthenticatedToken | None:
    """The active (unrevoked) token behind a dashboard session, or None."""
    with db.transaction() as conn, conn.cursor(row_factory=class_row(AuthenticatedToken)) as cur:
        return cur.execute(_TOKEN_BY_ID, (token_id,)).fetchone()


# --- the GitHub bot's open pull requests (read-only over app.store.bot's tables) ------------------------

_PR_FOOTPRINTS = """
SELECT f.repo, f.number, f.project, f.state_name, f.head_sha, f.files, f.write_globs, f.read_globs, f.updated_at
FROM pull_request_footprints f
WHERE %(all)s OR EXISTS (SELECT 1 FROM states s WHERE s.name = f.state_name AND s.tenant_id = %(tenant)s
                                                   AND s.scope = %(scope)s)
ORDER BY f.repo, f.number, f.project
LIMIT %(limit)s
"""
_NEVER = datetime.min.replace(tzinfo=UTC)  # footprint rows always carry updated_at; this only types the max
_PR_JOBS = """
SELECT DISTINCT ON (j.repo, j.number, j.kind) j.repo, j.number, j.kind, j.sha, j.project, j.status, j.error,
       j.result, j.updated_at, j.finished_at
FROM bot_jobs j
WHERE j.number IS NOT NULL AND (j.repo, j.number) IN (SELECT * FROM unnest(%s::text[], %s::integer[]))
ORDER BY j.repo, j.number, j.kind, j.updated_at DESC, j.id
"""


@dataclass(frozen=True, slots=True)
class PullJob:
    """The latest bot job of one kind for a pull request: a check (footprint, plan preview) or an apply."""

    kind: str
    sha: str
    project: str
    status: str
    error: str | None
    summary: str
    updated_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True, slots=True)
class PullRequest:
    repo: str
    number: int
    head_sha: str
    footprints: tuple[PrFootprint, ...]  # one a project, as the bot predicts it writes and reads
    checks: tuple[PullJob, ...]
    last_apply: PullJob | None
    overlaps: tuple[tuple[int, tuple[str, ...]], ...]  # (other PR number, shared globs)


def _job_summary(result: dict[str, Any]) -> str:
    """A line from a job's stored result: an apply's status and serial, or a footprint's verdict."""
    apply = result.get("apply")
    if isinstance(apply, dict):
        parts = [str(apply.get("status") or "")]
        if apply.get("serial") is not None:
            parts.append(f"serial {apply['serial']}")
        if apply.get("error"):
            parts.append(str(apply["error"])[:200])
        return " · ".join(p for p in parts if p)
    footprint = result.get("footprint")
    if isinstance(footprint, dict):
        projects = [p for p in footprint.get("projects") or [] if isinstance(p, dict)]
        errors = [str(p["error"]) for p in projects if p.get("error")] + [str(e) for e in
                                                                          footprint.get("config_errors") or []]
        text = f"{len(projects)} project(s)"
        return text + (f" · {errors[0][:200]}" if errors else "")
    return ""


_BOT_RECORDS = "SELECT EXISTS (SELECT 1 FROM webhook_deliveries) OR EXISTS (SELECT 1 FROM bot_jobs)"


def bot_has_records(db: Database) -> bool:
    """Whether the bot has recorded anything here (a delivery or a job): it is set up somewhere, even when
    the process asking has no GitHub credentials of its own (they live on the workers)."""
    with db.transaction() as conn:
        row = conn.execute(_BOT_RECORDS).fetchone()
    return bool(row and row[0])


def open_pull_requests(db: Database, principal: Principal, *, limit: int = 2000) -> list[PullRequest]:
    """The bot's open pull requests (those with a recorded footprint) on the caller's states, by repository
    and number, with their latest checks, their last apply and the other open PRs they overlap."""
    from app.domain.overlaps import pr_overlaps
    from app.domain.principal import DEFAULT_TENANT_ID

    params = {"all": principal.tenant_id == DEFAULT_TENANT_ID and not principal.scope,
              "tenant": principal.tenant_id, "scope": principal.scope, "limit": limit}
    with db.transaction() as conn:
        rows = conn.execute(_PR_FOOTPRINTS, params).fetchall()
        keys = sorted({(r[0], r[1]) for r in rows})
        jobs = conn.execute(_PR_JOBS, ([k[0] for k in keys], [k[1] for k in keys])).fetchall() if keys else []
    by_pr: dict[tuple[str, int], list[PrFootprint]] = {}
    for repo, number, project, state_name, sha, files, writes, reads, updated in rows:
        by_pr.setdefault((repo, number), []).append(PrFootprint(
            repo=repo, number=number, project=project, state_name=state_name, head_sha=sha, files=files,
            write_globs=writes, read_globs=reads, updated_at=updated))
    jobs_by_pr: dict[tuple[str, int], list[PullJob]] = {}
    for repo, number, kind, sha, project, status, error, result, updated, finished in jobs:
        jobs_by_pr.setdefault((repo, number), []).append(PullJob(
            kind=kind, sha=sha, project=project, status=status, error=(error or "")[:500] or None,
            summary=_job_summary(result if isinstance(result, dict) else {}), updated_at=updated,
            finished_at=finished))
    found = []
    for (repo, number), footprints in by_pr.items():
        others = [fp for (r, n), fps in by_pr.items() if r == repo and n != number for fp in fps]
        shared: dict[int, set[str]] = {}
        for mine in footprints:
            for other, globs in pr_overlaps(mine, others):
                shared.setdefault(other, set()).update(globs)
        pr_jobs = jobs_by_pr.get((repo, number), [])
        applies = sorted((j for j in pr_jobs if j.kind in _APPLIES), key=lambda j: j.updated_at)
        found.append(PullRequest(
            repo=repo, number=number, head_sha=max(footprints, key=lambda f: f.updated_at or _NEVER).head_sha,
            footprints=tuple(footprints), checks=tuple(j for j in pr_jobs if j.kind not in _APPLIES and
                                                       j.kind != JobKind.PULL_REQUEST_CLOSED),
            last_apply=applies[-1] if applies else None,
            overlaps=tuple((n, tuple(sorted(g))) for n, g in sorted(shared.items()))))
    return found
