"""Cross-PR overlap: which other open pull requests' predicted footprints intersect one PR's.

The rule is the reservation conflict matrix (``analyzer.globs.conflicts``) applied to predicted
footprints instead of held reservations: write∩write, write∩read and read∩write overlap, read∩read
never does, and footprints on different states never overlap. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from analyzer.globs import READ, WRITE, Glob, conflicts, stored_glob


class PredictedFootprint(Protocol):
    """What the rule reads of a PR's footprint on one state (``app.store.bot.PrFootprint`` is one)."""

    @property
    def number(self) -> int: ...

    @property
    def state_name(self) -> str: ...

    @property
    def write_globs(self) -> tuple[str, ...]: ...

    @property
    def read_globs(self) -> tuple[str, ...]: ...


def _parsed(texts: Iterable[str], mode: str) -> list[tuple[str, str, Glob]]:
    return [(text, mode, stored_glob(text)) for text in texts]


def shared_globs(mine: PredictedFootprint, theirs: PredictedFootprint) -> list[str]:
    """The globs of ``mine`` and ``theirs`` that overlap, sorted: the glob itself when both name the
    same one, else ``"mine ∩ theirs"``. Empty when the footprints are on different states."""
    if mine.state_name != theirs.state_name:
        return []
    own = _parsed(mine.write_globs, WRITE) + _parsed(mine.read_globs, READ)
    other = _parsed(theirs.write_globs, WRITE) + _parsed(theirs.read_globs, READ)
    found: set[str] = set()
    for text_a, mode_a, glob_a in own:
        for text_b, mode_b, glob_b in other:
            if conflicts(mode_a, glob_a, mode_b, glob_b):
                found.add(text_a if text_a == text_b else f"{text_a} ∩ {text_b}")
    return sorted(found)


def pr_overlaps(mine: PredictedFootprint, others: Sequence[PredictedFootprint]) -> list[tuple[int, list[str]]]:
    """Each other PR whose footprint overlaps ``mine``, as (PR number, shared globs), by PR number.
    A PR with several footprints on the state (several projects) is reported once, globs merged;
    ``mine``'s own number is skipped."""
    by_number: dict[int, set[str]] = {}
    for other in others:
        if other.number == mine.number:
            continue
        shared = shared_globs(mine, other)
        if shared:
            by_number.setdefault(other.number, set()).update(shared)
    return [(number, sorted(globs)) for number, globs in sorted(by_number.items())]
