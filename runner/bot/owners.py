"""Owners of address globs (``owners:`` in the default branch's ``.kilolock.yml``): who must approve a pull
request that writes which addresses.

A rule maps one address glob (the reservation grammar of ``analyzer.globs``) to GitHub users (``@alice``)
and teams (``@org/team``). As in CODEOWNERS, the last rule that matches an address owns it, and a rule
with no owners leaves its addresses unowned. A write glob of a footprint needs the approval of every rule
that owns some address it may write: rule *i* counts when its glob intersects the write glob and no later
rule covers that intersection (a later rule covering the write glob or rule *i*'s glob). When the
intersection is covered only by several later rules together, rule *i* still counts: asking one group too
many is the safe side. A write glob that cannot be parsed needs every group of the project.

Pure: rules and reviews in, frozen results out. Must not: talk to GitHub (``runner.bot.github`` reads
team memberships), or read the file (``runner.bot.config`` validates ``owners:`` into rules).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from analyzer.globs import Glob, GlobError, covers, intersects, parse_glob

# GitHub logins: letters, digits and single hyphens, at most 39; team slugs: lowercase letters, digits,
# hyphens and underscores (GitHub derives them from the team's name).
_USER = r"[A-Za-z0-9](?:[A-Za-z0-9]|-(?=[A-Za-z0-9])){0,38}"
_TEAM = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,99})"
_HANDLE = re.compile(rf"@(?P<user>{_USER})(?:/(?P<team>{_TEAM}))?")
MAX_RULES = 500
MAX_OWNERS_PER_RULE = 50


class OwnerHandleError(ValueError):
    """A text that is not ``@user`` or ``@org/team``."""


@dataclass(frozen=True, slots=True)
class Owner:
    """``@alice`` (``team`` None) or ``@acme/payments`` (``login`` is the organization)."""

    login: str
    team: str | None = None

    def __str__(self) -> str:
        return f"@{self.login}/{self.team}" if self.team else f"@{self.login}"


@dataclass(frozen=True, slots=True)
class OwnerRule:
    """One line of ``owners:``: the glob, its owners (empty: unowned) and the line of the file it is on."""

    glob: str
    owners: tuple[Owner, ...]
    line: int = 0

    @property
    def parsed(self) -> Glob:
        return parse_glob(self.glob)


@dataclass(frozen=True, slots=True)
class OwnedGlob:
    """A predicted write glob and the owner groups whose approval it needs (each group one rule's owners:
    any one of them approves for the group)."""

    glob: str
    groups: tuple[tuple[Owner, ...], ...]
    unparsable: bool = False


def parse_owner(text: str) -> Owner:
    if not isinstance(text, str) or not (m := _HANDLE.fullmatch(text.strip())):
        raise OwnerHandleError(f"owner {text!r} is not a GitHub user (@alice) or team (@org/team)")
    return Owner(m.group("user"), m.group("team"))


def owned(rules: Sequence[OwnerRule], write_glob: str) -> OwnedGlob:
    """The owner groups a write of ``write_glob`` needs (last match wins; fail closed, see the module)."""
    try:
        wanted = parse_glob(write_glob)
    except GlobError:
        return OwnedGlob(write_glob, _unique(r.owners for r in rules if r.owners), unparsable=True)
    parsed = [r.parsed for r in rules]
    groups: list[tuple[Owner, ...]] = []
    for i, rule in enumerate(rules):
        if not rule.owners or not intersects(parsed[i], wanted):
            continue
        if any(covers(later, wanted) or covers(later, parsed[i]) for later in parsed[i + 1:]):
            continue
        groups.append(rule.owners)
    return OwnedGlob(write_glob, _unique(groups))


def owned_globs(rules: Sequence[OwnerRule], write_globs: Iterable[str]) -> tuple[OwnedGlob, ...]:
    return tuple(owned(rules, g) for g in write_globs)


def _unique(groups: Iterable[tuple[Owner, ...]]) -> tuple[tuple[Owner, ...], ...]:
    found: list[tuple[Owner, ...]] = []
    for group in groups:
        if group not in found:
            found.append(group)
    return tuple(found)


def groups_of(items: Iterable[OwnedGlob]) -> tuple[tuple[Owner, ...], ...]:
    """Every group some write glob needs, once each, in first-seen order."""
    return _unique(g for item in items for g in item.groups)


IsMember = Callable[[str, Owner], bool]


def missing_groups(groups: Sequence[tuple[Owner, ...]], approvers: Iterable[str],
                   is_member: IsMember) -> tuple[tuple[Owner, ...], ...]:
    """The groups none of ``approvers`` belongs to (a user owner is its own login, case-insensitively; a
    team owner asks ``is_member``)."""
    who = sorted(set(approvers))
    return tuple(g for g in groups if not any(_belongs(login, o, is_member) for login in who for o in g))


def _belongs(login: str, owner: Owner, is_member: IsMember) -> bool:
    if owner.team is None:
        return login.lower() == owner.login.lower()
    return is_member(login, owner)


def shown(group: Sequence[Owner]) -> str:
    return " or ".join(str(o) for o in group)



def token_scopes(rules: Sequence[OwnerRule]) -> tuple[str, ...]:
    """The address scopes of a token with exactly a project's owned globs: ``GLOB:write`` for each rule that
    names owners (in order, once each; a rule without owners grants nothing), then ``*:read``, for the
    reads every plan makes of the addresses its configuration refers to outside what it changes."""
    writes = dict.fromkeys(f"{rule.glob}:write" for rule in rules if rule.owners)
    return (*writes, "*:read")
