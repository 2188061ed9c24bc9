"""Process logging: plain text (the default) or one JSON object per line (``KL_LOG_FORMAT=json``),
each record carrying the request id of the request it was logged in.

What gets logged is decided by the callers, which log methods, paths, statuses, timings and error
codes — never state bodies, lock info, query strings, tokens or cookies. This module adds no
request data of its own beyond the request id.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from flask import g, has_request_context

from app.config import Settings

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
# Fields a caller may attach with ``extra=`` that the JSON format copies into each line.
FIELDS = ("request_id", "method", "path", "route", "status", "duration_ms", "lane")


class RequestIdFilter(logging.Filter):
    """Stamp each record with the current request's id (``-`` outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "request_id", None):
            record.request_id = g.get("request_id", "-") if has_request_context() else "-"
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, message, request_id and any FIELDS given."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                doc[name] = value
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str, ensure_ascii=False)


def _ours(handler: logging.Handler) -> bool:
    return getattr(handler, "kilolock", False) is True


def configure_logging(settings: Settings) -> None:
    """Install (once) a stderr handler on the root logger in the configured format. A root logger
    that already has someone else's handlers (a test runner, gunicorn's --log-config) is left to
    them, as ``logging.basicConfig`` would."""
    root = logging.getLogger()
    formatter = JsonFormatter() if settings.log_format == "json" else logging.Formatter(TEXT_FORMAT)
    mine: list[logging.Handler] = [h for h in root.handlers if _ours(h)]
    if root.handlers and not mine:
        return
    if not mine:
        stream = logging.StreamHandler()
        stream.kilolock = True  # type: ignore[attr-defined]
        stream.addFilter(RequestIdFilter())
        root.addHandler(stream)
        mine = [stream]
    for handler in mine:
        handler.setFormatter(formatter)
    root.setLevel(settings.log_level)
