"""Comment commands (``kilolock plan``, ``kilolock apply [-p NAME]``, ``kilolock unlock``, ``kilolock
help``): a comment body parsed once into a typed :class:`Command`, and the help text listing them.

The webhook router asks :func:`parse` whether a comment is addressed to Kilolock at all (it enqueues a
comment job only then); the comment job asks it which command to run. Pure: no I/O. Must not: decide
who may run a command (the job asks GitHub about write access) or run anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

COMMAND_WORD = "kilolock"


class CommandName(StrEnum):
    PLAN = "plan"
    APPLY = "apply"
    UNLOCK = "unlock"
    HELP = "help"


@dataclass(frozen=True, slots=True)
class ApplyArgs:
    """``kilolock apply``'s options: one project, or every touched one (None); ``problem`` when not
    understood."""

    project: str | None
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class Command:
    """A comment addressed to Kilolock. ``word`` is the command as written (lower case); ``name`` is
    None when it is not a command Kilolock knows."""

    word: str
    name: CommandName | None
    apply: ApplyArgs = ApplyArgs(None)


HELP = """Kilolock commands (comment on the pull request; you need write access to the repository):

- `kilolock plan` re-runs the plan preview for the pull request's current head.
- `kilolock apply [-p NAME]` applies the head before merge (every touched project, or the one named), when
  `apply_on_comment` is on and the `apply_requirements` hold (both read from the default branch); the pull
  request then holds what it applied until it is merged or closed.
- `kilolock unlock` releases this pull request's holds.
- `kilolock help` shows this list.

Kilolock also comments on its own: the predicted reservations when the pull request opens or changes,
the plan preview, and the apply result after the merge. Re-run a `kilolock/*` check from the Checks tab to
repeat that step."""


def parse(body: str) -> Command | None:
    """The command of a comment, or None when the comment does not start with ``kilolock``. A bare
    ``kilolock`` asks for help."""
    words = body.split()
    if not words or words[0].lower() != COMMAND_WORD:
        return None
    word = words[1].lower() if len(words) > 1 else CommandName.HELP.value
    name = CommandName(word) if word in CommandName._value2member_map_ else None
    if name is CommandName.APPLY:
        return Command(word, name, parse_apply_args(words[2:]))
    return Command(word, name)


def parse_apply_args(words: Sequence[str]) -> ApplyArgs:
    """``kilolock apply [-p NAME]``: the words after ``apply``."""
    rest = list(words)
    if not rest:
        return ApplyArgs(None)
    if rest[0] in ("-p", "--project") and len(rest) == 2 and rest[1]:
        return ApplyArgs(rest[1])
    # Plain text: it quotes the comment, and the reply escapes it once (runner.bot.markdown).
    return ApplyArgs(None, f"kilolock apply {' '.join(rest)} is not understood: use kilolock apply for every "
                           "project the pull request touches, or kilolock apply -p NAME for one")
