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

from app.domain import durations

COMMAND_WORD = "kilolock"


class CommandName(StrEnum):
    PLAN = "plan"
    APPLY = "apply"
    UNLOCK = "unlock"
    HOLD = "hold"
    RELEASE = "release"
    HELP = "help"


@dataclass(frozen=True, slots=True)
class ApplyArgs:
    """``kilolock apply``'s options: one project, or every touched one (None); ``problem`` when not
    understood."""

    project: str | None
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class HoldArgs:
    """``kilolock hold GLOB… --reason TEXT [-p NAME] [--until DURATION]`` and ``kilolock release HOLD``:
    ``problem`` when not understood."""

    globs: tuple[str, ...] = ()
    reason: str = ""
    project: str | None = None
    until_seconds: float | None = None
    hold_id: str = ""
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class Command:
    """A comment addressed to Kilolock. ``word`` is the command as written (lower case); ``name`` is
    None when it is not a command Kilolock knows."""

    word: str
    name: CommandName | None
    apply: ApplyArgs = ApplyArgs(None)
    hold: HoldArgs = HoldArgs()


HELP = """Kilolock commands (comment on the pull request; you need write access to the repository):

- `kilolock plan` re-runs the plan preview for the pull request's current head.
- `kilolock apply [-p NAME]` applies the head before merge (every touched project, or the one named), when
  `apply_on_comment` is on and the `apply_requirements` hold (both read from the default branch); the pull
  request then holds what it applied until it is merged or closed.
- `kilolock unlock` releases this pull request's holds.
- `kilolock hold GLOB… --reason TEXT [-p NAME] [--until DURATION]` holds address globs of a project's state
  by hand (a change freeze, out-of-band work) until `kilolock release HOLD` or its expiry.
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
    if name is CommandName.HOLD:
        return Command(word, name, hold=parse_hold_args(body.split(None, 2)[2] if len(words) > 2 else ""))
    if name is CommandName.RELEASE:
        ok = len(words) == 3 and len(words[2]) <= 40
        return Command(word, name, hold=HoldArgs(hold_id=words[2] if ok else "", problem=None if ok else (
            "kilolock release needs one hold id, e.g. kilolock release ar_0123456789abcdef")))
    return Command(word, name)


_HOLD_USAGE = "use kilolock hold GLOB… --reason TEXT [-p NAME] [--until DURATION]"


def parse_hold_args(text: str) -> HoldArgs:
    """The words after ``kilolock hold``: globs, then options; ``--reason`` takes the rest of the line up to the
    next option (quotes are kept as written)."""
    words = text.split()
    globs: list[str] = []
    reason: list[str] = []
    project: str | None = None
    until: float | None = None
    i = 0
    try:
        while i < len(words):
            word = words[i]
            if word in ("-p", "--project"):
                project, i = words[i + 1], i + 2
            elif word == "--until":
                until, i = durations.parse_duration(words[i + 1]), i + 2
            elif word == "--reason":
                i += 1
                while i < len(words) and words[i] not in ("-p", "--project", "--until"):
                    reason.append(words[i])
                    i += 1
            elif reason or word.startswith("-"):
                raise ValueError(f"{word} is not understood")
            else:
                globs.append(word)
                i += 1
    except (IndexError, ValueError) as exc:
        return HoldArgs(problem=f"kilolock hold: {exc if isinstance(exc, ValueError) else 'an option lacks its value'}"
                                f": {_HOLD_USAGE}")
    text_reason = " ".join(reason).strip("\"'")
    if not globs or not text_reason:
        return HoldArgs(problem=f"kilolock hold needs address globs and a reason: {_HOLD_USAGE}")
    return HoldArgs(globs=tuple(globs), reason=text_reason, project=project, until_seconds=until)


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
