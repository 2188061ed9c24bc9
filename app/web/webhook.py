"""``POST /webhooks/github``: GitHub's deliveries in, RQ jobs out.

Owns the request side of the bot: it refuses every delivery while no secret is configured (fail
closed), checks the size and the ``X-Hub-Signature-256`` HMAC of the raw body, records the delivery
(its ``X-GitHub-Delivery`` id makes redeliveries no-ops), routes it (``app.domain.webhooks``) and
enqueues jobs by dotted path (``app.queue``); a delivery for a repository outside
``KL_GITHUB_REPOSITORIES`` is recorded as ignored, never queued. It must stay fast: no GitHub API
calls, no git, no Terraform here — jobs do that on workers. It never imports ``runner.bot.github``.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
from dataclasses import dataclass
from typing import Any, NoReturn
from urllib.parse import parse_qs

from flask import Blueprint, Flask, Response, current_app, jsonify, request
from redis import Redis
from redis.exceptions import RedisError

from analyzer.jsontext import JsonInputError, load_json
from app import queue
from app.config import Settings
from app.domain.repositories import is_allowed
from app.domain.webhooks import PayloadError, Routed, route
from app.errors import (
    BadRequestError,
    ForbiddenError,
    PayloadTooLargeError,
    ServiceUnavailableError,
    UnauthorizedError,
)
from app.store import bot as store
from app.web.context import services
from app.web.metrics import WEBHOOK_DELIVERIES

log = logging.getLogger("kilolock.webhook")
bp = Blueprint("webhook", __name__)

SIGNATURE_HEADER = "X-Hub-Signature-256"
EXTENSION = "kilolock.webhook"
# GitHub's delivery ids are GUIDs and its event names short slugs; anything else is not GitHub.
_DELIVERY_ID = re.compile(r"[A-Za-z0-9-]{1,100}")
_EVENT = re.compile(r"[a-z_]{1,64}")
# Events GitHub can send that are worth their own metrics label; anything else (and anything sent
# before the signature is checked) is counted as "other", so a caller cannot grow the label set.
_KNOWN_EVENTS = frozenset({
    "ping", "pull_request", "push", "check_run", "check_suite", "issue_comment", "installation",
    "installation_repositories", "pull_request_review", "pull_request_review_comment", "status",
})


class WebhookSecretUnsetError(ForbiddenError):
    """No webhook secret is configured, so no delivery can be checked: every one is refused."""


class SignatureMissingError(UnauthorizedError):
    """A delivery without its signature header."""


class SignatureInvalidError(ForbiddenError):
    """A delivery not signed with the configured secret."""


@dataclass(frozen=True, slots=True)
class Queueing:
    """Where the webhook enqueues: resolved once when the app starts (None: bot not configured)."""

    redis: Redis | None


def init_app(app: Flask, settings: Settings) -> None:
    """Register the webhook. With a secret configured, resolve Redis now: ``KL_REDIS_URL``, else the
    embedded Redis under ``KL_DATA_DIR`` (started if needed)."""
    redis_client: Redis | None = None
    if settings.github_webhook_secret:
        url = settings.redis_url
        if url is None:
            from app.embedded import start_embedded_redis

            url = start_embedded_redis(settings.data_root)
        redis_client = queue.connect(url)
        if not settings.github_repositories:
            log.warning("KL_GITHUB_REPOSITORIES is not set: /webhooks/github acknowledges every delivery and "
                        "queues none; list the repositories the bot serves (owner/name or owner/*)")
    elif settings.github_enabled:
        # GitHub access without a secret: the bot's jobs could run, but nothing will ever enqueue them.
        log.warning("KL_GITHUB_WEBHOOK_SECRET is not set: /webhooks/github refuses every delivery")
    app.extensions[EXTENSION] = Queueing(redis=redis_client)
    app.register_blueprint(bp)


def _label(event: str) -> str:
    return event if event in _KNOWN_EVENTS else "other"


def _reject(event: str, error: Exception) -> NoReturn:
    WEBHOOK_DELIVERIES.labels(_label(event), "rejected").inc()
    raise error


@bp.post("/webhooks/github")
def receive() -> tuple[Response, int]:
    settings = services().settings
    event = request.headers.get("X-GitHub-Event", "")
    secret = settings.github_webhook_secret
    if not secret:
        _reject(event, WebhookSecretUnsetError(
            "webhook deliveries are refused: no webhook secret is configured; set KL_GITHUB_WEBHOOK_SECRET to "
            "the secret of the GitHub App's (or repository's) webhook and restart"))
    body = _read_body(event, settings.webhook_max_bytes)
    _verify(event, secret, body)
    delivery_id = request.headers.get("X-GitHub-Delivery", "")
    if not event or not delivery_id:
        _reject(event, BadRequestError("X-GitHub-Event and X-GitHub-Delivery headers are required"))
    if not _DELIVERY_ID.fullmatch(delivery_id) or not _EVENT.fullmatch(event):
        _reject(event, BadRequestError("X-GitHub-Delivery must be GitHub's delivery GUID (at most 100 letters, digits "
                                       "and dashes) and X-GitHub-Event an event name"))
    db = services().db
    try:
        routed = route(event, delivery_id, _payload(body), app_id=settings.github_app_id)
    except PayloadError as exc:
        # Signed, so GitHub sent it: keep it as failed (a redelivery is then processed again).
        if store.record_delivery(db, delivery_id, event, "", ""):
            store.mark_delivery(db, delivery_id, "failed", detail={"error": exc.message})
        WEBHOOK_DELIVERIES.labels(_label(event), "failed").inc()
        raise
    if routed.jobs and not is_allowed(settings.github_repositories, routed.repo):
        # Acknowledged (GitHub does not retry a 2xx) and recorded, but no job: nothing calls GitHub for it.
        routed = Routed(routed.event, routed.action, routed.repo, reason=(
            f"repository {routed.repo!r} is not in KL_GITHUB_REPOSITORIES: add it (owner/name or owner/*) "
            "for the bot to serve it"))
        log.warning("webhook delivery %s (%s) for %r refused: not an allowed repository", delivery_id, event,
                    routed.repo)
    try:
        # One transaction: the delivery's row is recorded, the jobs enqueued, the outcome marked.
        with store.receive_delivery(db, delivery_id, routed.event, routed.action, routed.repo) as receipt:
            if receipt is None:
                WEBHOOK_DELIVERIES.labels(_label(event), "duplicate").inc()
                log.info("webhook delivery %s (%s) already processed", delivery_id, event)
                return jsonify({"ok": True, "status": "already processed", "delivery": delivery_id}), 200
            if not routed.jobs:
                receipt.mark("ignored", detail={"reason": routed.reason})
                WEBHOOK_DELIVERIES.labels(_label(event), "ignored").inc()
                log.info("webhook delivery %s (%s %s) ignored: %s", delivery_id, event, routed.action, routed.reason)
                return jsonify({"ok": True, "status": "ignored", "delivery": delivery_id,
                                "reason": routed.reason}), 200
            job_ids = _enqueue(routed, settings)
            receipt.mark("queued", job_ids, detail={"kinds": [j.kind for j in routed.jobs]})
    except RedisError as exc:
        # The transaction rolled back; record the failure so a redelivery from GitHub is processed.
        if store.record_delivery(db, delivery_id, routed.event, routed.action, routed.repo):
            detail = {"error": f"enqueue failed: {exc.__class__.__name__}"}
            store.mark_delivery(db, delivery_id, "failed", detail=detail)
        WEBHOOK_DELIVERIES.labels(_label(event), "failed").inc()
        log.error("webhook delivery %s: enqueue failed: %s", delivery_id, exc)
        raise ServiceUnavailableError("the job queue (Redis) is unavailable; redeliver the delivery from GitHub "
                                      "once it is back") from exc
    WEBHOOK_DELIVERIES.labels(_label(event), "accepted").inc()
    log.info("webhook delivery %s (%s %s on %s) queued: %s", delivery_id, event, routed.action, routed.repo,
             ", ".join(job_ids))
    return jsonify({"ok": True, "status": "queued", "delivery": delivery_id, "job_ids": job_ids}), 202


def _read_body(event: str, limit: int) -> bytes:
    """The raw body (signatures are over these exact bytes), at most ``limit`` bytes."""
    too_large = PayloadTooLargeError(f"webhook body exceeds the limit of {limit} bytes: raise KL_WEBHOOK_MAX_BYTES")
    if request.content_length is not None and request.content_length > limit:
        _reject(event, too_large)
    body = request.stream.read(limit + 1)
    if len(body) > limit:
        _reject(event, too_large)
    return body


def _verify(event: str, secret: str, body: bytes) -> None:
    presented = request.headers.get(SIGNATURE_HEADER)
    if not presented:
        _reject(event, SignatureMissingError(
            f"unsigned webhook delivery: {SIGNATURE_HEADER} is required; set the webhook's secret in GitHub"))
    expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    # Header values arrive decoded as latin-1, so this encoding gives back the bytes sent.
    if not hmac.compare_digest(expected.encode(), presented.encode("latin-1", "replace")):
        _reject(event, SignatureInvalidError(
            f"bad {SIGNATURE_HEADER}: the body was not signed with KL_GITHUB_WEBHOOK_SECRET; check that the "
            "webhook's secret in GitHub matches it"))


def _payload(body: bytes) -> dict[str, Any]:
    """The JSON payload, sent as ``application/json`` or as the ``payload`` form field."""
    raw: str | bytes = body
    if request.mimetype == "application/x-www-form-urlencoded":
        fields = parse_qs(body.decode("utf-8", "replace"))
        raw = (fields.get("payload") or [""])[0]
    try:
        doc = load_json(raw)
    except JsonInputError as exc:
        raise PayloadError(f"the webhook body is not acceptable JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise PayloadError("the webhook payload is not a JSON object")
    return doc


def _enqueue(routed: Routed, settings: Settings) -> list[str]:
    queueing: Queueing = current_app.extensions[EXTENSION]
    assert queueing.redis is not None, "a secret is configured, so init_app resolved Redis"
    done = [queue.enqueue(queueing.redis, job.args, job_id=job.job_id, timeout=settings.job_timeout)
            for job in routed.jobs]
    return [job.job_id for job in done]
