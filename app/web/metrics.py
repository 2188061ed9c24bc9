"""Prometheus metrics at ``/metrics``: the only importer of ``prometheus_client``.

Counters and histograms live in one process-wide registry and are moved from the web layer: a
request hook counts every request by lane, route template and status; the ``engine_call`` and
``backend_call`` decorators turn the outcome of a lane's view (its return or its typed error)
into reservation, lock, run and commit metrics. Gauges (live reservations, live runs…) are read
from Postgres at scrape time through ``app.store.gauges``.

Labels never carry a tenant, address, holder or token, and only the two drift series carry a state
name (``kilolock_drifted_instances`` and ``kilolock_drift_checks_total``, for states that were checked,
bounded by ``app.store.drift_reports.METRIC_STATES``): the endpoint may be scraped by anyone allowed to reach it
(``KL_METRICS_TOKEN`` guards it).
Webhook delivery and job metrics are defined here for the GitHub bot and its workers.
"""

from __future__ import annotations

import functools
import hmac
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

from flask import Flask, Response, g, request
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector

from app.domain.reservations import LIVE_STATUSES, RunStatus
from app.errors import (
    KlError,
    LeaseExpiredError,
    ReservationConflictError,
    ServiceUnavailableError,
    StateLockedError,
    UnauthorizedError,
)
from app.store import Database, drift_reports, gauges
from app.store import bot as bot_store
from app.store.runs import WAITER_STALE
from app.web.context import services

View = TypeVar("View", bound=Callable[..., Any])

# The *_created series only double the exposition; rates and increases do not need them.
disable_created_metrics()  # type: ignore[no-untyped-call]
REGISTRY = CollectorRegistry()
ProcessCollector(registry=REGISTRY)

_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_RUN_SECONDS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 43200)
_BYTES = (1024, 10240, 102400, 1048576, 10485760, 104857600, 1073741824)

HTTP_REQUESTS = Counter("kilolock_http_requests", "HTTP requests by lane, route template, method and status.",
                        ["lane", "route", "method", "status"], registry=REGISTRY)
HTTP_LATENCY = Histogram("kilolock_http_request_duration_seconds", "Time to answer an HTTP request.",
                         ["lane", "route", "method"], buckets=_SECONDS, registry=REGISTRY)
STATE_LOCK_ACQUISITIONS = Counter("kilolock_state_lock_acquisitions",
                                  "Terraform LOCK requests granted (a same-ID replay counts again).", registry=REGISTRY)
STATE_LOCK_CONFLICTS = Counter("kilolock_state_lock_conflicts",
                               "Terraform LOCK requests answered 423: locked, or live reservations.", registry=REGISTRY)
STATE_LOCK_RELEASES = Counter("kilolock_state_lock_releases", "Terraform UNLOCK and force-unlock requests answered.",
                              registry=REGISTRY)
RESERVATION_ACQUISITIONS = Counter("kilolock_reservation_acquisitions",
                                   "Reservation requests granted, all or nothing (open: a new run; more: added "
                                   "to a live run).", ["operation"], registry=REGISTRY)
RESERVATION_CONFLICTS = Counter("kilolock_reservation_conflicts",
                                "Reservation requests refused because they conflicted (after any wait).",
                                ["operation"], registry=REGISTRY)
RESERVATION_WAIT = Histogram("kilolock_reservation_wait_seconds",
                             "Time spent answering reservation requests that asked to wait (each poll of a "
                             "queue ticket is one short request; the outcome is the final poll's), by outcome.",
                             ["outcome"], buckets=_SECONDS, registry=REGISTRY)
RESERVATION_EXPIRIES = Counter("kilolock_reservation_expiries",
                               "Run requests refused with lease_expired: the holder's lease had run out.",
                               ["operation"], registry=REGISTRY)
APPLY_RUNS_OPENED = Counter("kilolock_apply_runs_opened", "Apply runs opened.", registry=REGISTRY)
APPLY_RUNS_FINISHED = Counter("kilolock_apply_runs_finished",
                              "Apply runs closed through the service, by outcome (committed, failed, aborted).",
                              ["outcome"], registry=REGISTRY)
APPLY_RUN_DURATION = Histogram("kilolock_apply_run_duration_seconds", "Apply run duration, opened to closed.",
                               ["outcome"], buckets=_RUN_SECONDS, registry=REGISTRY)
COMMIT_LATENCY = Histogram("kilolock_commit_duration_seconds",
                           "Row-level commit requests, by outcome (committed or the error code).", ["outcome"],
                           buckets=_SECONDS, registry=REGISTRY)
STATE_WRITE_BYTES = Histogram("kilolock_state_write_bytes",
                              "Size of accepted state writes (http: a backend POST; commit: the commit request).",
                              ["source"], buckets=_BYTES, registry=REGISTRY)
DASHBOARD_LOGINS = Counter("kilolock_dashboard_logins", "Dashboard login attempts by outcome (ok, refused).",
                           ["outcome"], registry=REGISTRY)
WEBHOOK_DELIVERIES = Counter("kilolock_webhook_deliveries",
                             "GitHub webhook deliveries by event and outcome "
                             "(accepted, ignored, duplicate, rejected, failed).",
                             ["event", "outcome"], registry=REGISTRY)

_LANES = {"backend": "backend", "engine": "engine", "runs": "engine", "drift": "engine", "control": "control",
          "ui": "ui"}
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "LOCK", "UNLOCK"})
_ACQUIRING = frozenset({"open", "more"})
_CLOSING = frozenset({"close", "abort", "commit"})


def init_app(app: Flask, *, serve: bool) -> None:
    """Count every request of ``app``; with ``serve``, also answer ``GET /metrics``."""
    app.after_request(_observe_request)
    if serve:
        app.add_url_rule("/metrics", "metrics", _metrics_view, methods=["GET"])


def _lane() -> str:
    if request.blueprint:
        return _LANES.get(request.blueprint, request.blueprint)
    return {"healthz": "health", "metrics": "metrics"}.get(request.endpoint or "", "other")


def _observe_request(response: Response) -> Response:
    rule = request.url_rule.rule if request.url_rule is not None else "unmatched"
    method = request.method if request.method in _METHODS else "other"
    lane = _lane()
    HTTP_REQUESTS.labels(lane, rule, method, str(response.status_code)).inc()
    started = g.get("started")
    if started is not None:
        HTTP_LATENCY.labels(lane, rule, method).observe(time.perf_counter() - started)
    return response


def _metrics_view() -> Response:
    settings = services().settings
    if settings.metrics_token:
        presented = request.headers.get("Authorization", "")
        if not hmac.compare_digest(presented.encode(), f"Bearer {settings.metrics_token}".encode()):
            raise UnauthorizedError("send Authorization: Bearer <KL_METRICS_TOKEN> to read /metrics")
    body = (generate_latest(REGISTRY) + generate_latest(_StoreGauges(services().db))  # type: ignore[arg-type, unused-ignore]
            + generate_latest(_Background()))  # type: ignore[arg-type, unused-ignore]
    response = Response(body, mimetype=None, content_type=CONTENT_TYPE_LATEST)
    response.headers["Cache-Control"] = "no-store"
    return response


class _Background:
    """This process's work after answers, queued or running: a bench or an operator waits for 0 to know a
    bulk write's upkeep (statistics, changed attribute names) and splice base are done. Per process: each
    server process has its own threads and queues."""

    def collect(self) -> Iterator[Metric]:
        found = services()
        pending = GaugeMetricFamily(
            "kilolock_background_pending",
            "Work this process runs after answering, queued or running: upkeep (statistics refreshes and "
            "changed attribute names after bulk writes) and splice_bases (splice base builds).",
            labels=["queue"])
        pending.add_metric(["upkeep"], 0 if found.upkeep is None else found.upkeep.pending)
        pending.add_metric(["splice_bases"], 0 if found.splice_bases is None else found.splice_bases.pending)
        yield pending


class _StoreGauges:
    """Gauges read from Postgres at scrape time (one transaction per scrape)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def collect(self) -> Iterator[Metric]:
        now = datetime.now(UTC)
        up = GaugeMetricFamily("kilolock_database_up", "1 when the scrape could read the database.")
        try:
            snap = gauges.read_gauges(self.db, now=now, waiter_fresh=now - WAITER_STALE)
        except ServiceUnavailableError:
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield GaugeMetricFamily("kilolock_states", "States stored (all tenants).", value=snap.states)
        yield GaugeMetricFamily("kilolock_live_reservations", "Reservations whose lease has not run out.",
                                value=snap.live_reservations)
        yield GaugeMetricFamily("kilolock_lapsed_reservations",
                                "Reservations whose lease ran out and that no acquirer has reclaimed yet.",
                                value=snap.lapsed_reservations)
        runs = GaugeMetricFamily("kilolock_apply_runs", "Apply runs in the database by status.", labels=["status"])
        known = dict(snap.runs_by_status)
        for status in RunStatus:
            runs.add_metric([status.value], known.get(status.value, 0))
        yield runs
        yield GaugeMetricFamily("kilolock_oldest_live_run_age_seconds",
                                "Age of the oldest reserved or running apply run, pull-request holds apart (0 when "
                                "none).", value=snap.oldest_live_run_seconds)
        yield GaugeMetricFamily("kilolock_pull_request_holds", "Pull-request holds (applied before merge).",
                                value=snap.pr_holds)
        yield GaugeMetricFamily("kilolock_oldest_pull_request_hold_age_seconds",
                                "Age of the oldest pull-request hold (0 when none).", value=snap.oldest_pr_hold_seconds)
        yield GaugeMetricFamily("kilolock_manual_holds", "Live manual holds (kl hold, kilolock hold).",
                                value=snap.manual_holds)
        yield GaugeMetricFamily("kilolock_state_locks_held", "States locked by Terraform's whole-state lock.",
                                value=snap.state_locks)
        yield GaugeMetricFamily("kilolock_oldest_state_lock_age_seconds",
                                "Age of the oldest Terraform state lock (0 when none).",
                                value=snap.oldest_state_lock_seconds)
        yield GaugeMetricFamily("kilolock_reservation_waiters", "Reservation requests waiting in the queue.",
                                value=snap.waiters)
        yield from _drift_metrics(self.db)
        yield _job_durations(self.db)


def _job_durations(db: Database) -> Metric:
    """The bot's job run times. Jobs run in worker processes, which store each one's start and finish in
    ``bot_jobs``; the histogram is built from there, so every web process answers the same."""
    family = HistogramMetricFamily("kilolock_job_duration_seconds", "Bot job run time by job and outcome.",
                                   labels=["job", "outcome"])
    for found in bot_store.job_durations(db, _RUN_SECONDS):
        buckets = [(str(float(le)), count) for le, count in zip(_RUN_SECONDS, found.counts, strict=True)]
        family.add_metric([found.kind, found.outcome], buckets + [("+Inf", found.count)], found.total)
    return family


def _drift_metrics(db: Database) -> Iterator[Metric]:
    """Per-state drift: read from the stored reports, so every worker process answers the same."""
    found = drift_reports.read_metrics(db)
    drifted = GaugeMetricFamily("kilolock_drifted_instances",
                                "Managed instances drifted at the state's latest drift check or refresh.",
                                labels=["state"])
    for state, count in found.drifted:
        drifted.add_metric([state], count)
    yield drifted
    checks = CounterMetricFamily("kilolock_drift_checks", "Drift checks and refreshes recorded, by outcome "
                                 "(clean, drifted, refreshed).", labels=["state", "outcome"])
    for state, outcome, count in found.checks:
        checks.add_metric([state, outcome], count)
    yield checks


def record_run_finished(status: str, created_at: datetime, finished_at: datetime | None) -> None:
    """Count an apply run that was just closed (and how long it lived)."""
    APPLY_RUNS_FINISHED.labels(status).inc()
    if finished_at is not None:
        APPLY_RUN_DURATION.labels(status).observe(max((finished_at - created_at).total_seconds(), 0.0))


def _run_of(result: Any) -> dict[str, Any] | None:
    response = result[0] if isinstance(result, tuple) else result
    doc = response.get_json(silent=True) if isinstance(response, Response) else None
    return doc if isinstance(doc, dict) else None


def _when(value: object) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else None


def _asked_to_wait() -> bool:
    doc = request.get_json(silent=True, force=True)
    if isinstance(doc, dict) and doc.get("ticket"):
        return True  # a poll of a queue ticket: the request waited before
    wait = doc.get("wait_seconds") if isinstance(doc, dict) else None
    return isinstance(wait, int | float) and not isinstance(wait, bool) and wait > 0


def engine_call(operation: str) -> Callable[[View], View]:
    """Turn an engine-lane run view's outcome into metrics. ``operation``: open, more, renew,
    release, running, close, abort, commit or dry_commit."""

    def decorate(view: View) -> View:
        @functools.wraps(view)
        def observed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            waits = operation in _ACQUIRING and _asked_to_wait()
            try:
                result = view(*args, **kwargs)
            except KlError as error:
                _engine_refused(operation, error, time.perf_counter() - started, waits)
                raise
            _engine_done(operation, result, time.perf_counter() - started, waits)
            return result

        return cast(View, observed)

    return decorate


def _engine_refused(operation: str, error: KlError, elapsed: float, waits: bool) -> None:
    if isinstance(error, ReservationConflictError) and operation in _ACQUIRING:
        RESERVATION_CONFLICTS.labels(operation).inc()
        if waits:
            RESERVATION_WAIT.labels("conflict").observe(elapsed)
    if isinstance(error, LeaseExpiredError):
        RESERVATION_EXPIRIES.labels(operation).inc()
    if operation == "commit":
        COMMIT_LATENCY.labels(error.code).observe(elapsed)


def _engine_done(operation: str, result: Any, elapsed: float, waits: bool) -> None:
    if isinstance(result, tuple) and len(result) > 1 and result[1] == 202:
        return  # queued with a ticket: no outcome yet, the client asks again
    if operation in _ACQUIRING:
        RESERVATION_ACQUISITIONS.labels(operation).inc()
        if operation == "open":
            APPLY_RUNS_OPENED.inc()
        if waits:
            RESERVATION_WAIT.labels("granted").observe(elapsed)
    if operation not in _CLOSING:
        return
    doc = _run_of(result) or {}
    run = doc.get("run") or {}
    created = _when(run.get("created_at"))
    if created is not None and run.get("status") not in LIVE_STATUSES:  # an abort may leave it aborting
        record_run_finished(str(run.get("status")), created, _when(run.get("finished_at")))
    if operation == "commit":
        COMMIT_LATENCY.labels("committed").observe(elapsed)
        if (doc.get("commit") or {}).get("serial") is not None and request.content_length:
            STATE_WRITE_BYTES.labels("commit").observe(request.content_length)


def backend_call(view: View) -> View:
    """Turn a backend-lane view's outcome into state lock and write metrics."""

    @functools.wraps(view)
    def observed(*args: Any, **kwargs: Any) -> Any:
        method = request.method
        try:
            result = view(*args, **kwargs)
        except StateLockedError:
            if method == "LOCK":
                STATE_LOCK_CONFLICTS.inc()
            raise
        if method == "LOCK":
            STATE_LOCK_ACQUISITIONS.inc()
        elif method == "UNLOCK" or request.endpoint == "backend.state_unlock":
            STATE_LOCK_RELEASES.inc()
        elif method == "POST" and request.content_length is not None:
            STATE_WRITE_BYTES.labels("http").observe(request.content_length)
        return result

    return cast(View, observed)
