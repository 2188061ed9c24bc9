"""State-name validation: the only rule deciding which names the backend lane accepts."""

from __future__ import annotations

import re

from app.errors import InvalidStateNameError

# Conservative on purpose: names end up in URLs, logs and file names. A name we cannot route
# must be a 400, never a 404 (Terraform reads 404 as "no state" and plans to recreate all).
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


_SCOPE_PART = re.compile(r"(ws_[a-z0-9]{1,40})/(env_[a-z0-9]{1,40})/(.+)")


def split_scoped_path(raw: str) -> tuple[str | None, str]:
    """``ws_x/env_y/prod`` → (``ws_x/env_y``, ``prod``); a plain name has no scope.
    The name part is validated; a path with slashes that is not a scoped path is a 400."""
    match = _SCOPE_PART.fullmatch(raw[:-1] if raw.endswith("/") else raw)
    if match is None:
        return None, validate_state_name(raw)
    return f"{match.group(1)}/{match.group(2)}", validate_state_name(match.group(3))


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
