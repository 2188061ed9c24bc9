"""A cheap scan of a .tf file for its top-level block headers, without parsing it.

Owns finding which top-level blocks (``resource "a" "b" {``, ``locals {``, ``moved {`` …) a file declares and
where each one starts and ends, so the footprint can decide which files, and which blocks in them, to parse.

The scan is a single regular-expression pass that skips comments, quoted strings (with nested ``${…}``
templates), and heredocs as whole tokens and counts braces (inert text and ordinary strings are consumed
inside the regular expression, so Python sees little more than the braces). A header is recognised only at
brace depth 0, so blocks nested in others, or HCL text inside heredocs and strings, are never reported. It
does not validate the file: on text it cannot follow (an unterminated string or heredoc, a top-level brace
after no readable header) it sets ``complete`` to False, so the caller parses the file or fails closed.

Must not import hcl2 or touch the filesystem.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["BlockHeader", "Prescan", "Unterminated", "expression_end", "scan", "template_end"]

# Everything that can neither open nor close a block, swallowed in C: text without braces, quotes, comments or
# heredoc introducers, and whole quoted strings whose templates hold no braces or quotes (nearly all of them).
_INERT = r"""(?:[^"{}\#/<]+|\\.|/(?![/*])|<(?!<)|"(?:[^"\\$%\n]|\\.|\$\$\{|%%\{|[$%](?!\{)|[$%]\{[^{}"\n]*\})*")*+"""
_TOKEN = re.compile(
    _INERT
    + r"""(?:
      (?P<quote>")                                   # a quoted string with nested templates: the slow path
    | (?P<comment>\#[^\n]*|//[^\n]*|/\*.*?\*/)
    | (?P<heredoc><<-?(?P<marker>[A-Za-z][\w.-]*)[ \t]*\r?\n)
    | (?P<open>\{)
    | (?P<close>\})
    | (?P<end>\Z)
    )""",
    re.S | re.X,
)
_IN_TEMPLATE = re.compile(r'"|\\.|\$\$\{|%%\{|[$%]\{|\n', re.S)
_IN_EXPRESSION = re.compile(r'"|\{|\}|\n', re.S)
_HEADER = re.compile(r'[ \t]*([A-Za-z_][\w-]*)((?:[ \t]+(?:"(?:[^"\\\n]|\\.)*"|[A-Za-z_][\w-]*))*)[ \t]*\Z')
_LABEL = re.compile(r'"(?:[^"\\\n]|\\.)*"|[A-Za-z_][\w-]*')


@dataclass(frozen=True, slots=True)
class BlockHeader:
    """One top-level block: its type, its labels (unquoted), and where it lies.

    ``start_pos``/``end_pos`` are character offsets into the file text (end exclusive, just past the
    closing brace); ``line`` is the 1-based line of the header.
    """

    type: str
    labels: tuple[str, ...]
    line: int
    start_pos: int
    end_pos: int

    def __reduce__(self) -> tuple[Callable[..., BlockHeader], tuple[str, tuple[str, ...], int, int, int]]:
        # Parse caches pickle tens of thousands of headers; the dataclass default goes through
        # dataclasses.fields() for each one, which made loading and saving a cache ~8x slower.
        return (BlockHeader, (self.type, self.labels, self.line, self.start_pos, self.end_pos))


@dataclass(frozen=True, slots=True)
class Prescan:
    """The headers of one file, and whether the scan reached the end of the text."""

    headers: tuple[BlockHeader, ...]
    complete: bool


class Unterminated(Exception):
    """A quoted string (``what`` is "string"), a ``${…}``/``%{…}`` sequence ("sequence") or a heredoc
    ("heredoc") that opens at ``start`` and does not end."""

    def __init__(self, what: str, start: int) -> None:
        super().__init__(what, start)
        self.what = what
        self.start = start


# One walk (a footprint, its widening, the workspace) asks for the headers of the same texts from several
# rules; the scan is pure, so each text is scanned once and the answer shared.
@lru_cache(maxsize=4096)
def scan(text: str) -> Prescan:
    """Find the top-level block headers of ``text`` (see the module docstring)."""
    headers: list[BlockHeader] = []
    complete = True
    depth = 0
    pending: tuple[str, tuple[str, ...], int, int] | None = None  # the open top-level block
    pos = 0
    line, counted = 1, 0
    try:
        while True:
            match = _TOKEN.match(text, pos)
            if match is None:
                return Prescan(tuple(headers), False)  # e.g. a stray "<<" that starts no heredoc
            kind = match.lastgroup
            pos = match.end()
            if kind == "end":
                break
            if kind == "open":
                if depth == 0:
                    brace = match.start(kind)
                    line += text.count("\n", counted, brace)  # counted incrementally: one pass per file
                    counted = brace
                    pending = _header_at(text, brace, line)
                    # A top-level brace that does not follow a header on its own line (a comment before the
                    # header, two blocks on one line): the scan cannot name this block, so it says so.
                    complete = complete and pending is not None
                depth += 1
            elif kind == "close":
                depth -= 1
                if depth == 0 and pending is not None:
                    type_, labels, line, start = pending
                    headers.append(BlockHeader(type_, labels, line, start, pos))
                    pending = None
                elif depth < 0:
                    return Prescan(tuple(headers), False)
            elif kind == "quote":
                pos = template_end(text, pos)
            elif kind == "heredoc":
                pos = _heredoc_end(text, pos, match.group("marker"))
    except Unterminated:
        return Prescan(tuple(headers), False)
    return Prescan(tuple(headers), complete and depth == 0)


def _header_at(text: str, brace: int, line: int) -> tuple[str, tuple[str, ...], int, int] | None:
    line_start = text.rfind("\n", 0, brace) + 1
    match = _HEADER.match(text, line_start, brace)
    if match is None:
        return None  # e.g. a top-level attribute with an object value: not a block
    labels = tuple(_unquote(label) for label in _LABEL.findall(match.group(2)))
    start = line_start + (len(match.group(0)) - len(match.group(0).lstrip(" \t")))
    return match.group(1), labels, line, start


def _unquote(label: str) -> str:
    if not label.startswith('"'):
        return label
    if "\\" not in label:
        return label[1:-1]
    try:
        value = json.loads(label)
    except ValueError:
        return label[1:-1]
    return value if isinstance(value, str) else label[1:-1]


def template_end(text: str, pos: int) -> int:
    """Just past the ``"`` closing a quoted string whose contents start at ``pos``.

    A backslash escapes the next character; ``$${`` and ``%%{`` are escapes, not sequences; ``${`` and ``%{``
    open a sequence, scanned by :func:`expression_end`; a newline ends the string unterminated. Raises
    :class:`Unterminated` for the innermost string or sequence that does not end."""
    start = pos
    while True:
        match = _IN_TEMPLATE.search(text, pos)
        if match is None or match.group() == "\n":
            raise Unterminated("string", start)
        token = match.group()
        pos = match.end()
        if token == '"':
            return pos
        if token in ("${", "%{"):
            pos = expression_end(text, pos)


def expression_end(text: str, pos: int) -> int:
    """Just past the ``}`` closing a template sequence whose expression starts at ``pos`` (after ``${``):
    braces nest, quoted strings are skipped whole (:func:`template_end`), newlines are allowed."""
    start = pos
    depth = 0
    while True:
        match = _IN_EXPRESSION.search(text, pos)
        if match is None:
            raise Unterminated("sequence", start)
        token = match.group()
        pos = match.end()
        if token == '"':
            pos = template_end(text, pos)
        elif token == "{":
            depth += 1
        elif token == "}":
            if depth == 0:
                return pos
            depth -= 1


def _heredoc_end(text: str, pos: int, marker: str) -> int:
    closing = re.compile(r"^[ \t]*" + re.escape(marker) + r"[ \t]*\r?$", re.M)
    match = closing.search(text, pos)
    if match is None:
        raise Unterminated("heredoc", pos)
    return match.end()
