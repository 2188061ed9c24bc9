"""Process logging: plain text (the default) or one JSON object per line (``KL_LOG_FORMAT=json``),
each record carrying the request id of the request it was logged in.

What gets logged is decided by the callers, which log methods, paths, statuses, timings and error
codes — never state bodies, lock info, query strings, tokens or cookies. This module adds no
request data of its own beyond the request id, and guards what callers pass in both formats:

- control characters in a message (a decoded ``%0a`` in a path) are escaped, so a client cannot
  forge log lines;
- exceptions are written as their traceback frames (file, line, function) and class names only —
  never the exception's message, which for a database error quotes the row data it refused (state
  content, possibly sensitive values). A psycopg error adds its SQLSTATE.
"""

from __future__ import annotations

import json
import logging
import re
import traceback
from datetime import UTC, datetime
from types import TracebackType

from flask import g, has_request_context

from app.config import Settings

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
# Fields a caller may attach with ``extra=`` that the JSON format copies into each line.
FIELDS = ("request_id", "method", "path", "route", "status", "duration_ms", "lane")


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")

_ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]


def escape_controls(text: str) -> str:
    """``text`` with every control character written as an escape (``\\n``, ``\\x00``)."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def scrubbed_exception(ei: _ExcInfo) -> str:
    """A traceback without any exception message: frames, then each exception's class (and SQLSTATE),
    following the chain of causes."""
    _, error, _ = ei
    chain: list[BaseException] = []
    while error is not None and error not in chain and len(chain) < 8:
        chain.append(error)
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    lines: list[str] = []
    for exc in reversed(chain):
        if lines:
            lines.append("The above exception led to:")
        lines.append("Traceback (most recent call last):")
        lines.extend(line.rstrip("\n") for line in traceback.format_list(traceback.extract_tb(exc.__traceback__)))
        kind = f"{type(exc).__module__}.{type(exc).__qualname__}"
        sqlstate = getattr(exc, "sqlstate", None)
        lines.append(f"{kind} (message withheld{f'; SQLSTATE {sqlstate}' if sqlstate else ''})")
    return "\n".join(lines)


class TextFormatter(logging.Formatter):
    """The text format: one line per record (control characters escaped), scrubbed tracebacks."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        record.message = escape_controls(record.getMessage())
        record.asctime = self.formatTime(record, self.datefmt)
        text = self.formatMessage(record)
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text

    def formatException(self, ei: _ExcInfo) -> str:  # type: ignore[override]  # noqa: N802
        return scrubbed_exception(ei)


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
            doc["exception"] = scrubbed_exception(record.exc_info)
        return json.dumps(doc, default=str, ensure_ascii=True)


def _ours(handler: logging.Handler) -> bool:
    return getattr(handler, "kilolock", False) is True


def configure_logging(settings: Settings) -> None:
    """Install (once) a stderr handler on the root logger in the configured format. A root logger
    that already has someone else's handlers (a test runner, gunicorn's --log-config) is left to
    them, as ``logging.basicConfig`` would."""
    root = logging.getLogger()
    formatter = JsonFormatter() if settings.log_format == "json" else TextFormatter()
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
