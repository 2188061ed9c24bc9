"""State-name validation: the only rule deciding which names the backend lane accepts."""

from __future__ import annotations

import re

from app.errors import InvalidStateNameError

# Conservative on purpose: names end up in URLs, logs and file names. A name we cannot route
# must be a 400, never a 404 (Terraform reads 404 as "no state" and plans to recreate all).
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def validate_state_name(raw: str) -> str:
    """Return the state name (one trailing slash tolerated) or raise InvalidStateNameError."""
    name = raw[:-1] if raw.endswith("/") else raw
    if not _NAME.fullmatch(name) or ".." in name:
        shown = name if len(name) <= 80 else name[:77] + "..."
        raise InvalidStateNameError(
            f"invalid state name {shown!r}: use 1-200 characters from A-Z a-z 0-9 . _ - "
            "starting with a letter or digit (no slashes)"
        )
    return name
