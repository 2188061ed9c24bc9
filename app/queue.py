"""Enqueues background jobs on Redis (RQ) by dotted path, so the web app never imports job code.

The only importer of RQ on the service side; ``runner.jobs`` holds the job functions. A test
resolves every dotted path in ``JOBS``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from redis import Redis
from rq import Queue, Retry

QUEUE_NAME = "kilolock"

# kind → dotted path of the job function (arguments are str/int only).
JOBS: dict[str, str] = {
    "pull_request": "runner.jobs.pull_request_footprint",
    "plan_preview": "runner.jobs.pull_request_preview",
    "pull_request_closed": "runner.jobs.pull_request_closed",
    "merge_apply": "runner.jobs.merge_apply",
    "push": "runner.jobs.push_to_default_branch",
    "rerun": "runner.jobs.rerun_check",
    "comment": "runner.jobs.comment_command",
    "reconcile_holds": "runner.jobs.reconcile_holds",
    "pull_request_review": "runner.jobs.pull_request_review",
}


@dataclass(frozen=True, slots=True)
class Enqueued:
    job_id: str
    kind: str


def connect(redis_url: str) -> Redis:
    return Redis.from_url(redis_url)


def enqueue(
    redis: Redis, kind: str, args: Sequence[str | int], *, job_id: str, timeout: int, retries: int = 3,
    depends_on: str | None = None,
) -> Enqueued:
    """Put one job on the queue under a stable id (re-enqueueing an id that is still queued or
    running is a no-op, so redeliveries and retries cannot run a job twice at once)."""
    queue = Queue(QUEUE_NAME, connection=redis, serializer="rq.serializers.JSONSerializer")
    existing = queue.fetch_job(job_id)
    if existing is not None and existing.get_status(refresh=True) in ("queued", "started", "deferred", "scheduled"):
        return Enqueued(job_id, kind)
    queue.enqueue(JOBS[kind], *args, job_id=job_id, job_timeout=timeout,
                  retry=Retry(max=retries, interval=[5, 30, 120]), result_ttl=86400, failure_ttl=7 * 86400,
                  depends_on=depends_on)
    return Enqueued(job_id, kind)
