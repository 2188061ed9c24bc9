"""What GitHub imposes, as plain functions over text and headers (no PyGithub, no I/O): the size limits of
comments, check runs and commit statuses with the text cut to fit them, and how long a rate-limited answer's
headers say to wait. ``runner.bot.github`` applies them to every call.
"""

from __future__ import annotations

import time

__all__ = ["COMMENT_LIMIT", "OUTPUT_LIMIT", "SECONDARY_RATE_WAIT", "STATUS_DESCRIPTION_LIMIT", "TITLE_LIMIT",
           "first_line", "is_rate_limited", "rate_limit_wait", "shortened", "truncate", "with_marker"]

# GitHub's limits: 65,535 characters for a check run's summary and text and 65,536 for a comment
# body. Measured in UTF-8 bytes here, so no character count can exceed them.
OUTPUT_LIMIT = 65_535
COMMENT_LIMIT = 65_535
TITLE_LIMIT = 255
STATUS_DESCRIPTION_LIMIT = 140
SECONDARY_RATE_WAIT = 60.0  # GitHub's advice for a secondary rate limit without Retry-After


def truncate(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes, with a note saying how much was left out."""
    data = text.encode()
    if len(data) <= limit:
        return text
    omitted_total = len(text)
    note = "\n\n… output truncated: {} more characters not shown (GitHub's size limit)"
    keep = limit - len(note.format(omitted_total).encode())
    head = data[:keep].decode("utf-8", "ignore")
    return head + note.format(len(text) - len(head))


def with_marker(marker: str, body: str) -> str:
    text = body if marker in body else f"{marker}\n{body}"
    text = truncate(text, COMMENT_LIMIT)
    if marker not in text:  # the marker sat past the cut: it must survive, or the next run duplicates
        text = truncate(f"{marker}\n{body}", COMMENT_LIMIT)
    return text


def shortened(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def is_rate_limited(headers: dict[str, str], message: str) -> bool:
    return "retry-after" in headers or headers.get("x-ratelimit-remaining") == "0" or "rate limit" in message.lower()


def rate_limit_wait(headers: dict[str, str]) -> float:
    retry_after = headers.get("retry-after", "")
    if retry_after.strip().isdigit():
        return float(retry_after)
    reset = headers.get("x-ratelimit-reset", "")
    if headers.get("x-ratelimit-remaining") == "0" and reset.strip().isdigit():
        return max(float(reset) - time.time(), 0.0) + 1.0
    return SECONDARY_RATE_WAIT
