"""Durations as people write and read them: ``90``, ``90s``, ``5m``, ``1h30m``, ``1d`` in; ``14m48s`` out.

The one parser (the CLI's ``--wait``/``--lease``, ``.kilolock.yml``'s ``merge_wait`` and ``drift.every``) and
the one formatter (conflict messages, the CLI's listings, the dashboard). Pure; ranges are the callers' rules.
"""

from __future__ import annotations

import re
from datetime import timedelta

__all__ = ["format_duration", "parse_duration"]

_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_NUMBER = re.compile(r"\d+(\.\d+)?")
_PART = re.compile(r"(\d+)([dhms])")


def parse_duration(text: str) -> float:
    """Seconds: a plain number (``90``, ``2.5``) or whole units in any order (``1h30m``, ``90s``, ``1d``),
    surrounding blanks ignored. Raises ValueError naming the text."""
    text = text.strip()
    if _NUMBER.fullmatch(text):
        return float(text)
    parts = _PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"invalid duration {text!r}: use e.g. 30s, 5m, 1h or 1d")
    return float(sum(int(n) * _UNITS[u] for n, u in parts))


def format_duration(delta: timedelta) -> str:
    """``14m48s``, ``12s``, ``2h03m``, ``3d04h``: what an operator reads at a glance."""
    seconds = max(int(delta.total_seconds()), 0)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"
