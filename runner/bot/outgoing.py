"""Delivering outgoing events (docs/events.md) from the RQ workers, never from a request.

A tick (``events_tick``, one per ``KL_EVENT_POLL_SECONDS`` slot, scheduled before it works so a killed
worker loses no schedule) walks every endpoint under a Redis lock of its own: the audit rows after the
endpoint's cursor become v1 events, those its filter wants are posted one by one in audit order, and the
cursor moves past each only once it was delivered or dead-lettered. A failed post (non-2xx, or no answer)
stops that endpoint's walk until its retry time (``KL_EVENT_RETRY_SECONDS``), so later events never
overtake it; after the last retry the event is recorded ``dead`` and the walk goes on. At-least-once: a
worker that dies between a post and its cursor update posts that event again, with the same id.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import requests

from app import queue
from app.domain.jobs import EventsTickArgs, job_id
from app.domain.outgoing import (
    EVENT_ID_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    backoff,
    body_of,
    signature,
    to_event,
)
from app.store import outbox
from app.store.db import Database

log = logging.getLogger("kilolock.events")
Post = Callable[[str, bytes, dict[str, str], int], int]  # url, body, headers, timeout → HTTP status


def http_post(url: str, body: bytes, headers: dict[str, str], timeout: int) -> int:
    """POST without following redirects (a redirect is a failed delivery, not a new destination)."""
    return requests.post(url, data=body, headers=headers, timeout=timeout, allow_redirects=False).status_code


def deliver_endpoint(db: Database, endpoint_id: int, *, schedule: Sequence[int], timeout: int,
                     post: Post = http_post, now: Callable[[], datetime] = lambda: datetime.now(UTC),
                     keep_alive: Callable[[], None] = lambda: None, batch: int = 100) -> str:
    """Deliver what is pending for one endpoint: ``"idle"`` when caught up, ``"waiting"`` when a failed
    event waits for its retry."""
    endpoint = outbox.get_endpoint(db, endpoint_id)
    if endpoint.next_at is not None and now() < endpoint.next_at:
        return "waiting"
    tenant = outbox.tenant_of(db, endpoint_id)
    attempts = endpoint.attempts
    while True:
        rows = outbox.pending(db, endpoint, tenant, batch)
        if not rows:
            return "idle"
        for row in rows:
            event = to_event(row)
            if event is None or not endpoint.filter.wants(event):
                outbox.advance(db, endpoint_id, row.id, status=None, attempts=0)
                continue
            body = body_of(event, endpoint.format)
            stamp = int(now().timestamp())
            headers = {"Content-Type": "application/json", EVENT_ID_HEADER: str(event["id"]),
                       TIMESTAMP_HEADER: str(stamp), SIGNATURE_HEADER: signature(endpoint.secret, stamp, body),
                       "User-Agent": "kilolock-events/1"}
            attempts += 1
            try:
                status = post(endpoint.url, body, headers, timeout)
                error = None if 200 <= status < 300 else f"HTTP {status}"
            except requests.RequestException as exc:
                error = exc.__class__.__name__  # never the URL's text or the body
            keep_alive()
            if error is None:
                outbox.advance(db, endpoint_id, row.id, status="delivered", attempts=attempts)
                attempts = 0
                continue
            wait = backoff(attempts, schedule)
            if wait is None:
                log.warning("event %s to endpoint %s is dead after %s attempts: %s", event["id"], endpoint.name,
                            attempts, error)
                outbox.advance(db, endpoint_id, row.id, status="dead", attempts=attempts, error=error)
                attempts = 0
                continue
            outbox.failed_attempt(db, endpoint_id, attempts, now() + timedelta(seconds=wait), error)
            return "waiting"
        endpoint = outbox.get_endpoint(db, endpoint_id)


def redrive(db: Database, endpoint_name: str, event_id: int, *, timeout: int, post: Post = http_post) -> bool:
    """Post one dead-lettered event again (now, once); True when the endpoint took it."""
    endpoint = next((e for e in outbox.list_endpoints(db) if e.name == endpoint_name), None)
    row = outbox.event_row(db, event_id)
    event = to_event(row) if row is not None else None
    if endpoint is None or event is None:
        return False
    body = body_of(event, endpoint.format)
    stamp = int(time.time())
    headers = {"Content-Type": "application/json", EVENT_ID_HEADER: str(event["id"]), TIMESTAMP_HEADER: str(stamp),
               SIGNATURE_HEADER: signature(endpoint.secret, stamp, body)}
    try:
        ok = 200 <= post(endpoint.url, body, headers, timeout) < 300
    except requests.RequestException:
        ok = False
    if ok:
        outbox.advance(db, endpoint.id, event_id, status="delivered", attempts=0)
    return ok


def schedule_tick(redis: Any, every: int, after: float) -> str | None:
    """Schedule the tick of the next ``every``-second slot after ``after``; None when a worker already did."""
    slot = (int(after) // every + 1) * every
    if not redis.set(f"kilolock:events-tick:{slot}", 1, nx=True, ex=max(4 * every, 60)):
        return None
    return queue.enqueue_at(redis, datetime.fromtimestamp(slot, UTC), EventsTickArgs(slot),
                            job_id=job_id(EventsTickArgs.kind, "-", slot), timeout=600).job_id


def start(redis: Any) -> str:
    """Enqueue a tick now (a starting worker does, so events that piled up go out without its scheduler)."""
    at = int(time.time())
    return queue.enqueue(redis, EventsTickArgs(at), job_id=job_id(EventsTickArgs.kind, "-", "start", at),
                         timeout=600, retries=1).job_id


def tick(db: Database, redis: Any, *, schedule: Sequence[int], timeout: int, every: int,
         post: Post = http_post) -> dict[str, str]:
    """Schedule the next tick, then deliver for every endpoint no other worker is delivering for."""
    schedule_tick(redis, every, time.time())
    done: dict[str, str] = {}
    for endpoint in outbox.list_endpoints(db):
        lock = redis.lock(f"kilolock:events:endpoint:{endpoint.id}", timeout=3 * timeout + 5)
        if not lock.acquire(blocking=False):
            done[endpoint.name] = "busy"
            continue
        try:
            done[endpoint.name] = deliver_endpoint(db, endpoint.id, schedule=schedule, timeout=timeout, post=post,
                                                   keep_alive=lock.reacquire)
        except Exception as exc:  # the type only: a message could quote an endpoint's URL, itself a credential
            log.error("event delivery to endpoint %s failed: %s", endpoint.name, type(exc).__name__)
            done[endpoint.name] = "error"
        finally:
            try:
                lock.release()
            except Exception:  # lapsed meanwhile: another worker may hold it now
                pass
    return done
