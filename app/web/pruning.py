"""The periodic retention job: every server process prunes old versions' raw bytes on a timer.

Started by ``create_app`` when retention is configured (``KL_RETAIN_VERSIONS`` or ``KL_RETAIN_DAYS``) and
``KL_PRUNE_INTERVAL_SECONDS`` is not 0, so ``kl serve`` and every gunicorn worker run it without another
process to deploy. Pruning is idempotent (``app.store.prune``), so several workers pruning at once only
repeat each other's no-ops; the first run waits one interval (plus a per-process jitter) so a fleet
restarting together does not prune together. A failed run is logged and retried at the next tick.
"""

from __future__ import annotations

import logging
import random
import threading
from datetime import timedelta

from app.config import Settings
from app.store import prune
from app.store.db import Database

log = logging.getLogger("kilolock.retention")


def policy(settings: Settings) -> prune.RetentionPolicy:
    """The retention rules the settings ask for."""
    return prune.RetentionPolicy(
        keep_versions=settings.retain_versions or None,
        keep_age=timedelta(days=settings.retain_days) if settings.retain_days else None,
    )


def start(settings: Settings, db: Database) -> threading.Event | None:
    """Start the timer thread when retention is on; returns the event that stops it (None: not started)."""
    rules = policy(settings)
    if not rules.enabled or settings.prune_interval_seconds == 0:
        return None
    stop = threading.Event()
    interval = float(settings.prune_interval_seconds)
    thread = threading.Thread(target=_loop, args=(db, rules, interval, stop), name="kl-retention", daemon=True)
    thread.start()
    log.info("retention: pruning raw bytes of versions %s every %ds", rules.describe(), int(interval))
    return stop


def _loop(db: Database, rules: prune.RetentionPolicy, interval: float, stop: threading.Event) -> None:
    delay = interval + random.uniform(0, min(interval, 60.0))  # noqa: S311 - jitter, not a secret
    while not stop.wait(delay):
        delay = interval
        try:
            report = prune.prune(db, rules)
        except Exception:  # the next tick retries; the server must not lose its timer to one failure
            log.exception("retention: pruning failed; retrying in %ds", int(interval))
            continue
        if report.versions:
            log.info("retention: removed the raw bytes of %d versions in %d states (%d bytes)",
                     report.versions, report.states, report.bytes)
