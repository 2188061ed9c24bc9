"""Enqueues background jobs on Redis (RQ) by dotted path, so the web app never imports job code.

The only importer of RQ on the service side; ``runner.bot.jobs`` holds the job functions. A job's
arguments (``app.domain.jobs``: one frozen type per kind) are passed by keyword to the function its row in
``app.domain.jobs.REGISTRY`` names. A test resolves every dotted path.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from redis import Redis
from rq import Queue, Retry
from rq.job import JobStatus

from app.domain.jobs import REGISTRY, JobArgs, JobKind

QUEUE_NAME = "kilolock"
SERIALIZER = "rq.serializers.JSONSerializer"  # the enqueuer's and the worker's: job arguments are str/int only

# kind → dotted path of the job function (from the registry of kinds).
JOBS: dict[JobKind, str] = {kind: spec.entry for kind, spec in REGISTRY.items()}
# A job in one of these is still to run (or running): enqueueing its id again is a no-op.
LIVE = frozenset({JobStatus.QUEUED, JobStatus.STARTED, JobStatus.DEFERRED, JobStatus.SCHEDULED})


@dataclass(frozen=True, slots=True)
class Enqueued:
    job_id: str
    kind: JobKind


def connect(redis_url: str) -> Redis:
    return Redis.from_url(redis_url)


def open_queue(redis: Redis) -> Queue:
    """The ``kilolock`` queue, as both the enqueuers and the worker open it."""
    return Queue(QUEUE_NAME, connection=redis, serializer=SERIALIZER)


def _is_live(queue: Queue, job_id: str) -> bool:
    """Whether a job of that id is still to run (or running), so that enqueueing it again must do nothing."""
    existing = queue.fetch_job(job_id)
    return existing is not None and existing.get_status(refresh=True) in LIVE


def enqueue(redis: Redis, args: JobArgs, *, job_id: str, timeout: int, retries: int = 3) -> Enqueued:
    """Put one job on the queue under a stable id (re-enqueueing an id that is still queued or
    running is a no-op, so redeliveries and retries cannot run a job twice at once)."""
    queue = open_queue(redis)
    if _is_live(queue, job_id):
        return Enqueued(job_id, args.kind)
    queue.enqueue(JOBS[args.kind], kwargs=args.to_kwargs(), job_id=job_id, job_timeout=timeout,
                  retry=Retry(max=retries, interval=[5, 30, 120]), result_ttl=86400, failure_ttl=7 * 86400)
    return Enqueued(job_id, args.kind)


def enqueue_at(redis: Redis, when: datetime, args: JobArgs, *, job_id: str, timeout: int) -> Enqueued:
    """Schedule one job for ``when`` (a worker running RQ's scheduler moves it to the queue then); a no-op
    when a job with that id is still scheduled, queued or running."""
    queue = open_queue(redis)
    if _is_live(queue, job_id):
        return Enqueued(job_id, args.kind)
    queue.enqueue_at(when, JOBS[args.kind], kwargs=args.to_kwargs(), job_id=job_id, job_timeout=timeout,
                     result_ttl=86400, failure_ttl=86400)
    return Enqueued(job_id, args.kind)
