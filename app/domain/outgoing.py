"""Outgoing events: the versioned JSON an endpoint receives, built from one audit row, its signature,
the Slack formatter and the per-endpoint filters.

Owns: which audit kinds become which event type, and which fields leave (an allow-list: addresses, globs,
serials, run ids, holders and actors; never attribute values, tokens, token names or lock info). Must
not: do I/O.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from analyzer.globs import GlobError, intersects, matches, parse_glob
from app.errors import BadRequestError

SCHEMA = "kilolock.event/v1"
SIGNATURE_HEADER = "X-Kilolock-Signature"
TIMESTAMP_HEADER = "X-Kilolock-Timestamp"
EVENT_ID_HEADER = "X-Kilolock-Event-Id"
FORMATS = ("webhook", "slack")
MAX_SHOWN = 200  # addresses or globs an event carries at most

# audit kind → event type (drift checks are decided by their outcome, below).
TYPES: dict[str, str] = {
    "run_open": "run.opened",
    "reservation_acquire": "run.granted",
    "reservation_wait": "run.waiting",
    "run_commit": "run.committed",
    "run_failed": "run.failed",
    "run_aborted": "run.aborted",
    "run_abort": "run.aborted",
    "reservation_conflict": "conflict.refused",
    "lock_conflict": "conflict.refused",
    "hold_taken": "hold.taken",
    "pr_hold_taken": "hold.taken",
    "hold_released": "hold.released",
    "hold_expired": "hold.released",
    "pr_hold_released": "hold.released",
    "pr_apply_started": "pr_apply.started",
    "pr_apply_finished": "pr_apply.finished",
}
EVENT_TYPES = (*sorted(set(TYPES.values())), "drift.found", "drift.cleared")
# The detail fields an event may carry in ``data`` (anything else in the audit row stays home).
_DATA_FIELDS = ("holder", "base_serial", "created", "updated", "deleted", "outputs_changed", "source", "outcome",
                "checked", "drifted", "outstanding", "reason", "until", "hold_id", "repo", "number", "project",
                "sha", "status", "forced", "expires_at", "wait_until")


@dataclass(frozen=True, slots=True)
class AuditRow:
    """The columns of one ``events`` row the stream reads."""

    id: int
    tenant_id: int | None
    scope: str
    state_name: str
    kind: str
    actor: str
    serial: int | None
    detail: Mapping[str, Any]
    created_at: datetime


def event_type(row: AuditRow) -> str | None:
    """The event type of an audit row, or None when the row is not part of the stream."""
    if row.kind == "drift_check":
        if int(row.detail.get("drifted") or 0) > 0:
            return "drift.found"
        if int(row.detail.get("outstanding_before") or 0) > 0 and int(row.detail.get("outstanding") or 0) == 0:
            return "drift.cleared"
        return None
    if row.kind == "hold_expired":
        return "hold.released"
    return TYPES.get(row.kind)


def _texts(value: Any) -> list[str]:
    """Glob or address texts from the audit shapes: ``["g", …]``, ``[["g", "mode"], …]``, ``[{"glob": …}]``."""
    found: list[str] = []
    for item in value if isinstance(value, list) else []:
        if isinstance(item, str):
            found.append(item)
        elif isinstance(item, list) and item and isinstance(item[0], str):
            found.append(item[0])
        elif isinstance(item, Mapping):
            text = item.get("glob") or item.get("address")
            if isinstance(text, str):
                found.append(text)
    return found[:MAX_SHOWN]


def to_event(row: AuditRow) -> dict[str, Any] | None:
    """The v1 event of an audit row (None when the row is not an event)."""
    kind = event_type(row)
    if kind is None:
        return None
    detail = row.detail
    globs = _texts(detail.get("globs")) + _texts(detail.get("wanted"))
    conflicts = [{"holder": str(c.get("holder", "")), "glob": str(c.get("glob", ""))}
                 for c in detail.get("conflicts", []) if isinstance(c, Mapping)][:MAX_SHOWN]
    data = {k: detail[k] for k in _DATA_FIELDS if k in detail and isinstance(detail[k], (str, int, bool, type(None)))}
    if conflicts:
        data["conflicts"] = conflicts
    if row.kind == "hold_expired":
        data["reason_released"] = "expired"
    return {
        "schema": SCHEMA,
        "id": f"evt_{row.id}",
        "sequence": row.id,
        "type": kind,
        "occurred_at": row.created_at.isoformat(),
        "tenant": row.tenant_id,
        "scope": row.scope,
        "state": row.state_name,
        "serial": row.serial if row.serial is not None else detail.get("serial"),
        "run": detail.get("run_id") if isinstance(detail.get("run_id"), str) else None,
        "actor": row.actor,
        "addresses": _texts(detail.get("addresses")),
        "globs": globs,
        "data": data,
    }


def body_of(event: Mapping[str, Any], fmt: str) -> bytes:
    """The exact bytes posted: the event itself, or a Slack incoming-webhook message about it."""
    if fmt == "slack":
        return json.dumps(slack_message(event), sort_keys=True, separators=(",", ":")).encode()
    return json.dumps(event, sort_keys=True, separators=(",", ":")).encode()


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_message(event: Mapping[str, Any]) -> dict[str, Any]:
    """A Slack ``{"text": …}`` message (mrkdwn, with ``&<>`` escaped as Slack requires)."""
    parts = [f"*{event['type']}* on `{_escape(str(event['state']))}`"]
    if event.get("run"):
        parts.append(f"run `{_escape(str(event['run']))}`")
    if event.get("actor"):
        parts.append(f"by {_escape(str(event['actor']))}")
    shown = list(event.get("addresses") or event.get("globs") or [])
    text = " ".join(parts)
    if shown:
        text += "\n" + ", ".join(f"`{_escape(a)}`" for a in shown[:10])
        if len(shown) > 10:
            text += f" and {len(shown) - 10} more"
    return {"text": text}


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """``v1=<hex HMAC-SHA256(secret, "<timestamp>." + body)>``."""
    mac = hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256)
    return f"v1={mac.hexdigest()}"


def verify(secret: str, timestamp: int, body: bytes, header: str, *, now: int, tolerance: int = 300) -> bool:
    """What a receiver checks: the signature over the exact body, and a timestamp within ``tolerance``."""
    if abs(now - timestamp) > tolerance:
        return False
    return hmac.compare_digest(signature(secret, timestamp, body), header)


@dataclass(frozen=True, slots=True)
class EndpointFilter:
    """Which events an endpoint gets: states by exact name (empty: all) and globs (empty: all). With globs,
    an event is sent when one of its addresses matches, or one of its globs intersects, one of them;
    an event that names no address or glob is not sent to a glob-filtered endpoint."""

    states: tuple[str, ...] = ()
    globs: tuple[str, ...] = ()

    def wants(self, event: Mapping[str, Any]) -> bool:
        if self.states and event.get("state") not in self.states:
            return False
        if not self.globs:
            return True
        mine = [parse_glob(g) for g in self.globs]
        for address in event.get("addresses") or ():
            try:
                if any(matches(g, address) for g in mine):
                    return True
            except (GlobError, ValueError):
                continue
        for text in event.get("globs") or ():
            try:
                theirs = parse_glob(text)
            except (GlobError, ValueError):
                continue
            if any(intersects(g, theirs) for g in mine):
                return True
        return False


def check_endpoint(url: str, fmt: str, globs: Sequence[str]) -> None:
    """Raise BadRequestError for a URL that is not plain http(s) with a host (no credentials in it), an
    unknown format or a glob that does not parse."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadRequestError(f"an event endpoint URL must be http:// or https:// with a host, not {url[:80]!r}")
    if parts.username or parts.password:
        raise BadRequestError("an event endpoint URL must not carry credentials; the signature authenticates")
    if fmt not in FORMATS:
        raise BadRequestError(f"event endpoint format must be one of {', '.join(FORMATS)}")
    for glob in globs:
        try:
            parse_glob(glob)
        except (GlobError, ValueError) as exc:
            raise BadRequestError(f"event endpoint glob {glob!r}: {exc}") from exc


def backoff(attempts: int, schedule: Sequence[int]) -> int | None:
    """Seconds to wait before retry number ``attempts`` (1-based), or None once the schedule is spent."""
    return schedule[attempts - 1] if 0 < attempts <= len(schedule) else None
