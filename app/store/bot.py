"""The GitHub bot's tables: webhook deliveries (idempotency), open pull requests' predicted
footprints (overlap warnings) and bot jobs with their typed arguments and stored outcome
(migrations/0006_bot.sql, 0014_bot_job_args.sql).

Every statement is one transaction. Jobs store their outcome here *before* posting it to GitHub,
so an outage on GitHub's side loses nothing: a retried job finds the stored result and posts it.
The overlap rule is ``app.domain.overlaps``; the job contract (kinds, arguments) ``app.domain.jobs``;
this module only fetches and saves.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

import psycopg
from psycopg.rows import class_row

from app.domain.jobs import JobArgs, JobKind, args_from_json
from app.store.db import Database


class DeliveryStatus(StrEnum):
    RECEIVED = "received"
    QUEUED = "queued"
    IGNORED = "ignored"
    FAILED = "failed"


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"

    @property
    def is_finished(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.SKIPPED)


FINISHED = tuple(s.value for s in JobStatus if s.is_finished)
# A delivery stuck in 'received' this long lost its request (the process died before enqueueing);
# a redelivery may take it over. Shorter would let a slow in-flight request and its redelivery both run.
STALE_RECEIVED_SECONDS = 300

# --- webhook deliveries -------------------------------------------------------------------------

# A new delivery is inserted; a known one is taken over only when its earlier attempt failed (or
# died in flight), so GitHub's manual redelivery of a failed delivery is processed, never a done one.
_RECORD_DELIVERY = """
INSERT INTO webhook_deliveries (delivery_id, event, action, repo, status)
VALUES (%s, %s, %s, %s, 'received')
ON CONFLICT (delivery_id) DO UPDATE
   SET status = 'received', event = EXCLUDED.event, action = EXCLUDED.action, repo = EXCLUDED.repo,
       job_ids = '{}', detail = '{}', received_at = now()
 WHERE webhook_deliveries.status = 'failed'
    OR (webhook_deliveries.status = 'received'
        AND webhook_deliveries.received_at < now() - make_interval(secs => %s))
RETURNING delivery_id
"""
_MARK_DELIVERY = """
UPDATE webhook_deliveries SET status = %s, job_ids = %s, detail = %s WHERE delivery_id = %s
"""
_GET_DELIVERY = """
SELECT delivery_id, event, action, repo, status, job_ids, detail, received_at
FROM webhook_deliveries WHERE delivery_id = %s
"""


@dataclass(frozen=True, slots=True)
class WebhookDelivery:
    delivery_id: str
    event: str
    action: str
    repo: str
    status: str
    job_ids: list[str]
    detail: dict[str, Any]
    received_at: datetime


def record_delivery(db: Database, delivery_id: str, event: str, action: str, repo: str) -> bool:
    """Record a delivery as received; False when it is already recorded (a redelivery of one that
    was queued or ignored, or one in flight right now). A delivery whose earlier attempt failed
    (or that has been stuck in ``received`` for 5 minutes) is taken over and True is returned."""
    with db.transaction() as conn:
        row = conn.execute(_RECORD_DELIVERY, (delivery_id, event, action, repo, STALE_RECEIVED_SECONDS)).fetchone()
    return row is not None


def mark_delivery(db: Database, delivery_id: str, status: str, job_ids: Sequence[str] = (),
                  detail: dict[str, Any] | None = None) -> None:
    """Set a recorded delivery's outcome: ``queued`` (with its job ids), ``ignored`` or ``failed``."""
    DeliveryStatus(status)  # raises ValueError on a typo before the CHECK constraint does
    with db.transaction() as conn:
        conn.execute(_MARK_DELIVERY, (status, list(job_ids), json.dumps(detail or {}), delivery_id))


class Receipt:
    """A delivery recorded inside a still-open transaction (see ``receive_delivery``)."""

    def __init__(self, conn: psycopg.Connection, delivery_id: str) -> None:
        self._conn = conn
        self.delivery_id = delivery_id

    def mark(self, status: str, job_ids: Sequence[str] = (), detail: dict[str, Any] | None = None) -> None:
        """Set the outcome in the same transaction (committed when the ``with`` block ends)."""
        DeliveryStatus(status)
        self._conn.execute(_MARK_DELIVERY, (status, list(job_ids), json.dumps(detail or {}), self.delivery_id))


@contextmanager
def receive_delivery(db: Database, delivery_id: str, event: str, action: str, repo: str) -> Iterator[Receipt | None]:
    """``record_delivery`` and ``mark_delivery`` in ONE transaction, for the webhook: yields None for a
    redelivery (as ``record_delivery`` returns False), else a Receipt to mark the outcome with. The
    delivery's row stays locked until the block ends, so a concurrent copy of it waits and then sees
    the outcome; if the block raises, nothing is recorded (the caller records the failure itself)."""
    with db.transaction() as conn:
        row = conn.execute(_RECORD_DELIVERY, (delivery_id, event, action, repo, STALE_RECEIVED_SECONDS)).fetchone()
        yield Receipt(conn, delivery_id) if row is not None else None


def get_delivery(db: Database, delivery_id: str) -> WebhookDelivery | None:
    with db.transaction() as conn, conn.cursor(row_factory=class_row(WebhookDelivery)) as cur:
        return cur.execute(_GET_DELIVERY, (delivery_id,)).fetchone()


# --- pull request footprints ----------------------------------------------------------------------

_SAVE_FOOTPRINT = """
INSERT INTO pull_request_footprints
    (repo, number, project, state_name, head_sha, files, write_globs, read_globs, updated_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, now())
ON CONFLICT (repo, number, project) DO UPDATE
   SET state_name = EXCLUDED.state_name, head_sha = EXCLUDED.head_sha, files = EXCLUDED.files,
       write_globs = EXCLUDED.write_globs, read_globs = EXCLUDED.read_globs, updated_at = now()
"""
_DROP_FOOTPRINTS = "DELETE FROM pull_request_footprints WHERE repo = %s AND number = %s"
_OPEN_FOOTPRINTS = """
SELECT repo, number, project, state_name, head_sha, files, write_globs, read_globs, updated_at
FROM pull_request_footprints
WHERE repo = %s AND state_name = %s AND (%s::integer IS NULL OR number <> %s)
ORDER BY number, project
"""


@dataclass(frozen=True, slots=True)
class PrFootprint:
    """One open PR's predicted footprint for one project (on one state)."""

    repo: str
    number: int
    project: str
    state_name: str
    head_sha: str
    files: tuple[str, ...] = ()
    write_globs: tuple[str, ...] = ()
    read_globs: tuple[str, ...] = ()
    updated_at: datetime | None = None

    def __post_init__(self) -> None:
        # Rows arrive with lists; callers may pass any sequence. Frozen: assign through object.
        for name in ("files", "write_globs", "read_globs"):
            object.__setattr__(self, name, tuple(getattr(self, name)))


def save_footprint(db: Database, fp: PrFootprint) -> None:
    """Insert or replace the footprint of (repo, PR number, project)."""
    with db.transaction() as conn:
        conn.execute(_SAVE_FOOTPRINT, (fp.repo, fp.number, fp.project, fp.state_name, fp.head_sha, list(fp.files),
                                       list(fp.write_globs), list(fp.read_globs)))


def drop_footprints(db: Database, repo: str, number: int) -> None:
    """Forget every footprint of a PR (it was closed or merged)."""
    with db.transaction() as conn:
        conn.execute(_DROP_FOOTPRINTS, (repo, number))


def open_footprints(db: Database, repo: str, state_name: str, *,
                    exclude_number: int | None = None) -> list[PrFootprint]:
    """The recorded footprints on ``state_name`` of the repository's open PRs, by PR number."""
    with db.transaction() as conn, conn.cursor(row_factory=class_row(PrFootprint)) as cur:
        return cur.execute(_OPEN_FOOTPRINTS, (repo, state_name, exclude_number, exclude_number)).fetchall()


# --- bot jobs -------------------------------------------------------------------------------------

_COLUMNS = "id, kind, repo, number, sha, project, status, attempts, result, posted, error, args"
# A claim inserts the row as running, or takes an existing row over as a new attempt when ``{takeover}``
# holds; RETURNING yields no row when it does not.
_CLAIM = f"""
INSERT INTO bot_jobs (id, kind, repo, number, sha, project, status, attempts, args, started_at)
VALUES (%s, %s, %s, %s, %s, %s, 'running', 1, %s, now())
ON CONFLICT (id) DO UPDATE
   SET status = 'running', attempts = bot_jobs.attempts + 1, args = EXCLUDED.args, updated_at = now(),
       started_at = now()
 WHERE {{takeover}}
RETURNING {_COLUMNS}
"""
_CLAIM_JOB = _CLAIM.format(takeover="bot_jobs.status <> ALL(%s)")
_GET_JOB = f"SELECT {_COLUMNS} FROM bot_jobs WHERE id = %s"
_FINISH_JOB = """
UPDATE bot_jobs SET status = %s, result = %s, error = %s, posted = false, updated_at = now(), finished_at = now()
WHERE id = %s
"""
_MARK_POSTED = "UPDATE bot_jobs SET posted = true, updated_at = now() WHERE id = %s"
_RESET_JOB = f"""
UPDATE bot_jobs SET status = 'queued', result = '{{}}', error = NULL, posted = false, updated_at = now(),
       finished_at = NULL
WHERE id = %s
RETURNING {_COLUMNS}
"""
_LIST_JOBS = f"""
SELECT {_COLUMNS} FROM bot_jobs
WHERE repo = %s AND (%s::integer IS NULL OR number = %s)
ORDER BY created_at, id
"""
# Rows written before the merge job was split: the fan-out has no project, each apply one.
_LEGACY_MERGE = "merge_apply"


@dataclass(frozen=True, slots=True)
class BotJob:
    """One bot job's row. ``args`` are the arguments it ran with (None for a row that kept none);
    ``result`` is its stored outcome as JSON (``runner.bot.results`` reads it)."""

    id: str
    kind: JobKind
    repo: str
    number: int | None
    sha: str
    project: str
    status: JobStatus
    attempts: int
    result: dict[str, Any]
    posted: bool
    error: str | None
    args: JobArgs | None = None

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished


def _job_row(cursor: Any) -> Any:
    """Rows into BotJob, typed at the edge: the kind and status as enums, the arguments as their type."""
    names = [c.name for c in cursor.description]

    def make(values: Sequence[Any]) -> BotJob:
        row = dict(zip(names, values, strict=True))
        kind = row["kind"]
        if kind == _LEGACY_MERGE:
            kind = JobKind.APPLY_PROJECT if row["project"] else JobKind.MERGE
        kind = JobKind(kind)
        return BotJob(id=row["id"], kind=kind, repo=row["repo"], number=row["number"], sha=row["sha"],
                      project=row["project"], status=JobStatus(row["status"]), attempts=row["attempts"],
                      result=row["result"], posted=row["posted"], error=row["error"],
                      args=args_from_json(kind, row["args"] or {}))

    return make


def claim(db: Database, job_id: str, args: JobArgs) -> BotJob:
    """``claim_job`` for a job of ``args``' kind, its row about what the arguments name; they are kept."""
    s = args.subject()
    return claim_job(db, job_id, args.kind, s.repo, number=s.number, sha=s.sha, project=s.project, args=args)


def claim_job(db: Database, job_id: str, kind: str, repo: str, *, number: int | None, sha: str,
              project: str = "", args: JobArgs | None = None) -> BotJob:
    """Start (or restart) a job: insert it as running, or count one more attempt and set it running.
    A job that already finished (succeeded, failed, skipped) is returned unchanged, so the caller
    posts its stored result instead of running it again."""
    kept = json.dumps(args.to_kwargs() if args is not None else {})
    params = (job_id, kind, repo, number, sha, project, kept, list(FINISHED))
    with db.transaction() as conn, conn.cursor(row_factory=_job_row) as cur:
        job = cur.execute(_CLAIM_JOB, params).fetchone()
        if job is None:
            job = cur.execute(_GET_JOB, (job_id,)).fetchone()
    assert job is not None, "the conflicting row exists: it stopped the upsert"
    return job


def finish_job(db: Database, job_id: str, status: JobStatus, result: dict[str, Any],
               error: str | None = None) -> None:
    """Store a job's outcome, not yet posted. Call it BEFORE posting to GitHub."""
    if not JobStatus(status).is_finished:
        raise ValueError(f"finish_job needs succeeded, failed or skipped, not {status!r}")
    with db.transaction() as conn:
        updated = conn.execute(_FINISH_JOB, (status, json.dumps(result), error, job_id)).rowcount
    if updated != 1:
        raise LookupError(f"no bot job {job_id!r}: claim_job it first")


def mark_posted(db: Database, job_id: str) -> None:
    """Record that the stored outcome reached GitHub."""
    with db.transaction() as conn:
        conn.execute(_MARK_POSTED, (job_id,))


def reset_job(db: Database, job_id: str) -> BotJob | None:
    """Forget a job's stored outcome so the next ``claim_job`` runs it again (a check run the user
    asked to re-run); None when there is no such job."""
    with db.transaction() as conn, conn.cursor(row_factory=_job_row) as cur:
        found: BotJob | None = cur.execute(_RESET_JOB, (job_id,)).fetchone()
        return found


def get_job(db: Database, job_id: str) -> BotJob | None:
    with db.transaction() as conn, conn.cursor(row_factory=_job_row) as cur:
        found: BotJob | None = cur.execute(_GET_JOB, (job_id,)).fetchone()
        return found


def list_jobs(db: Database, repo: str, number: int | None = None) -> list[BotJob]:
    """A repository's jobs (one PR's when ``number`` is given), oldest first."""
    with db.transaction() as conn, conn.cursor(row_factory=_job_row) as cur:
        found: list[BotJob] = cur.execute(_LIST_JOBS, (repo, number, number)).fetchall()
        return found


# --- scheduled checks (one per repository, project and window) ------------------------------------

# Unlike claim_job, a row another worker holds as running is NOT taken over, unless it has been running
# longer than ``stale`` seconds (its worker died: RQ would have killed it by then) or it was reset.
_CLAIM_WINDOW = _CLAIM.format(takeover="""bot_jobs.status = 'queued'
    OR (bot_jobs.status = 'running' AND bot_jobs.updated_at < now() - make_interval(secs => %s))""")
_KNOWN_REPOS = """
SELECT repo FROM bot_jobs WHERE repo <> '' AND repo <> '-'
UNION SELECT repo FROM webhook_deliveries WHERE repo <> ''
ORDER BY repo
"""
_LAST_RESULT = """
SELECT result FROM bot_jobs
WHERE repo = %s AND kind = %s AND project = %s AND status <> ALL(%s) AND result ? %s
ORDER BY finished_at DESC NULLS LAST, updated_at DESC LIMIT 1
"""


def claim_window(db: Database, job_id: str, args: JobArgs, *, stale_seconds: int) -> tuple[BotJob, bool]:
    """Claim a scheduled job's row: (row, True) when this caller runs it now, (row, False) when another
    worker is running it or it already finished (the caller then only delivers a finished outcome)."""
    s = args.subject()
    params = (job_id, args.kind.value, s.repo, s.number, s.sha, s.project, json.dumps(args.to_kwargs()),
              stale_seconds)
    with db.transaction() as conn, conn.cursor(row_factory=_job_row) as cur:
        job = cur.execute(_CLAIM_WINDOW, params).fetchone()
        if job is not None:
            return job, True
        job = cur.execute(_GET_JOB, (job_id,)).fetchone()
    assert job is not None, "the conflicting row exists: it stopped the upsert"
    return job, False


def known_repos(db: Database) -> list[str]:
    """Every repository the bot has received a delivery for or run a job on."""
    with db.transaction() as conn:
        return [str(row[0]) for row in conn.execute(_KNOWN_REPOS).fetchall()]


def last_result(db: Database, repo: str, kind: JobKind, project: str, key: str) -> dict[str, Any] | None:
    """The stored result of the newest finished job of ``kind`` on (repo, project) that holds ``key``."""
    unfinished = ["queued", "running"]
    with db.transaction() as conn:
        row = conn.execute(_LAST_RESULT, (repo, kind.value, project, unfinished, key)).fetchone()
    return dict(row[0]) if row is not None else None


_MERGE_RESULT = "UPDATE bot_jobs SET result = result || %s, updated_at = now() WHERE id = %s"


def merge_result(db: Database, job_id: str, extra: dict[str, Any]) -> None:
    """Add keys to a job's stored result (what posting it learnt, such as an issue number)."""
    with db.transaction() as conn:
        conn.execute(_MERGE_RESULT, (json.dumps(extra), job_id))


# --- metrics --------------------------------------------------------------------------------------

# The latest attempt of every finished job, bucketed in SQL: width_bucket counts the bounds at or below
# each duration, so a scrape reads one row per (kind, outcome, bucket), whatever the table's size.
_JOB_DURATIONS = """
SELECT kind, status, width_bucket(s, %s::float8[]), count(*), sum(s)
FROM (SELECT kind, status, greatest(extract(epoch FROM finished_at - started_at)::float8, 0) AS s
      FROM bot_jobs WHERE finished_at IS NOT NULL AND started_at IS NOT NULL) AS d
GROUP BY 1, 2, 3
"""


@dataclass(frozen=True, slots=True)
class JobDurations:
    """How long the finished jobs of one kind and outcome ran: ``counts[i]`` jobs took at most
    ``bounds[i]`` seconds (cumulative, as Prometheus histograms are); ``count`` and ``total`` over all."""

    kind: str
    outcome: str
    counts: tuple[int, ...]
    count: int
    total: float


def job_durations(db: Database, bounds: Sequence[float]) -> list[JobDurations]:
    """Run times (claim → outcome stored, of the latest attempt) of the bot's finished jobs, by kind and
    outcome. Workers store them with each job; the web process exports them (``/metrics``)."""
    with db.transaction() as conn:
        rows = conn.execute(_JOB_DURATIONS, (list(bounds),)).fetchall()
    per: dict[tuple[str, str], list[float]] = {}
    for kind, status, bucket, count, total in rows:
        # bucket b: b bounds lie below the duration, so it counts for the bounds from index b on.
        acc = per.setdefault((kind, status), [0.0] * (len(bounds) + 2))
        for i in range(int(bucket), len(bounds)):
            acc[i] += count
        acc[-2] += count
        acc[-1] += float(total or 0)
    return [JobDurations(kind, status, tuple(int(c) for c in acc[:len(bounds)]), int(acc[-2]), acc[-1])
            for (kind, status), acc in sorted(per.items())]
