"""The reverse side of the configuration graph: which top-level blocks of a configuration may refer to a set of
configuration objects, found in the raw text of every file without parsing it.

Terraform resolves a reference by its root and the attribute steps after it (``var.x``, ``local.x``,
``T.N``, ``resource.T.N``, ``data.T.N``, ``ephemeral.T.N``, ``module.N``); none of them can be spelt with an
index step (``local["x"]`` is rejected), so any reference to an object contains its root name, a dot and its
name as plain text — in a block body, a quoted template, a heredoc or a ``.tf.json`` string alike. This
module finds every such spelling (spaces around the dot allowed, as HCL allows them) and reports where it
is. It over-approximates on purpose: a hit in a comment or in an unrelated string is a candidate the caller
confirms by parsing the one block around it, so a consumer is never missed and rarely parsed for nothing.

Must not parse HCL, import hcl2 or touch the filesystem.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["Hit", "ReferenceMatcher", "spellings"]

_NAME = r"[A-Za-z_][\w-]*"


def spellings(address: str) -> tuple[str, ...]:
    """The dotted root-and-name parts a reference to ``address`` must contain, as regular expressions.

    ``var.x`` → ``var . x``; ``local.x``; ``T.N`` (which ``resource.T.N`` contains too); ``data.T.N``;
    ``module.N``; anything else (an output, a provider) has no reference syntax and gives nothing.
    """
    parts = address.split(".")
    if not all(re.fullmatch(_NAME, p) for p in parts):
        return ()
    if parts[0] in ("var", "local", "module") and len(parts) == 2:
        return (_dotted(parts),)
    if parts[0] in ("data", "ephemeral", "action") and len(parts) == 3:
        return (_dotted(parts),)
    if len(parts) == 2 and parts[0] not in ("output", "provider", "check", "var", "local", "module"):
        return (_dotted(parts),)
    return ()


def _dotted(parts: list[str]) -> str:
    return r"\s*\.\s*".join(re.escape(p) for p in parts)


@dataclass(frozen=True, slots=True)
class Hit:
    """One place a file's text may refer to ``address`` (``pos`` is a character offset into the text)."""

    address: str
    pos: int


class ReferenceMatcher:
    """Finds, in file texts, every spelling of references to a set of addresses (see the module docstring)."""

    def __init__(self, addresses: Iterable[str]) -> None:
        self._by_name: dict[str, list[tuple[str, re.Pattern[str]]]] = {}
        for address in sorted(set(addresses)):
            for spelling in spellings(address):
                last = address.rsplit(".", 1)[-1]
                self._by_name.setdefault(last, []).append((address, _compiled(spelling)))

        # One pass over a file for all the names at once (most files hold none of them).
        names = sorted(self._by_name, key=lambda n: (-len(n), n))
        self._any = re.compile("|".join(re.escape(n) for n in names)) if names else None

    def __bool__(self) -> bool:
        return bool(self._by_name)

    def hits(self, text: str) -> Iterator[Hit]:
        """Every candidate reference in ``text``."""
        if self._any is None:
            return
        found = set(self._any.findall(text))
        for last in sorted(found):
            for address, pattern in self._by_name.get(last, ()):
                for match in pattern.finditer(text):
                    yield Hit(address, match.start())


@lru_cache(maxsize=1 << 14)
def _compiled(spelling: str) -> re.Pattern[str]:
    return re.compile(r"(?<![\w-])" + spelling + r"(?![\w-])")
