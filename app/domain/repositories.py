"""Which GitHub repositories the bot serves: the allowlist patterns of ``KL_GITHUB_REPOSITORIES`` and
``KL_GITHUB_UNTRUSTED_PREVIEWS``.

A pattern is ``owner/name`` (one repository), ``owner/*`` (every repository of that owner) or ``*`` (every
repository, an explicit choice). GitHub's owner and repository names are case-insensitive, so matching is.
Pure: no I/O. Must not: guess — a name that is not ``owner/name`` matches nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# GitHub's owner logins are letters, digits and dashes; repository names also allow dots and underscores.
_OWNER = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})"
_NAME = r"[A-Za-z0-9._-]{1,100}"
_PATTERN = re.compile(rf"\*|{_OWNER}/(?:\*|{_NAME})")
_REPO = re.compile(rf"{_OWNER}/{_NAME}")


def parse_patterns(items: Iterable[str]) -> tuple[str, ...]:
    """The patterns as given (trimmed); raises ValueError naming every entry that is not one."""
    found = tuple(item.strip() for item in items if item.strip())
    bad = [item for item in found if not _PATTERN.fullmatch(item)]
    if bad:
        raise ValueError("entries are owner/name, owner/* or *; got " + ", ".join(repr(b) for b in bad))
    return found


def is_allowed(patterns: Iterable[str], repo: str) -> bool:
    """Whether ``repo`` (``owner/name``) matches one of ``patterns``."""
    if not _REPO.fullmatch(repo):
        return False
    owner, name = repo.lower().split("/")
    for pattern in patterns:
        if pattern == "*":
            return True
        their_owner, their_name = pattern.lower().split("/", 1)
        if their_owner == owner and their_name in ("*", name):
            return True
    return False
