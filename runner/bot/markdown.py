"""The one escaping rule for untrusted text in the bot's Markdown: comments, replies, check-run summaries
and issues.

Untrusted is anything a pull request or a Terraform run can shape: project names and keys of
``.kilolock.yml``, file names, addresses, branch names, logins, error text. Every such piece goes through
exactly one of these, which redact first (``app.domain.redaction``, token shapes and Terraform's values)
and then escape:

- :func:`code` — inline code, fenced with more backticks than the text holds: no mention, link, HTML or
  emphasis is live inside;
- :func:`cell` — the same inside a table row, with ``|`` escaped so the row keeps its columns;
- :func:`block` — a fenced block for multi-line text (error output), its tail when long;
- :func:`prose` — one line of running text: HTML and Markdown punctuation escaped, and ``@mentions``,
  ``http://`` and ``www.`` links broken by a zero-width space so they notify and link nobody;
- :func:`commit` — a commit's short id as inline code; :func:`marker` — the hidden HTML comment that finds
  a comment or an issue of the bot again, its parts reduced to characters that cannot close it.

Must not: know about outcomes or GitHub (``runner.bot.render`` and friends compose; this escapes).
"""

from __future__ import annotations

import re

from app.domain.redaction import redact

ERROR_TAIL = 3_000
_ZWSP = "\u200b"
# Emphasis, code, strikethrough and table pipes anywhere; an underscore only where it could open or close
# emphasis (not inside a word: snake_case stays readable); "](" would start a link's target.
_PUNCTUATION = re.compile(r"([\\`*~|]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])|^#|\](?=\())")
_LINKS = re.compile(r"(?i)(@|://|\bwww\.)")


def _line(text: str) -> str:
    return " ".join(redact(text).split())


def code(text: str) -> str:
    """Inline code that survives backticks inside (GitHub's rule: a longer fence, padded)."""
    text = _line(text)
    fence = "`"
    while fence in text:
        fence += "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def cell(text: str) -> str:
    """Inline code for a table cell: GitHub splits rows on ``|`` before it reads code spans."""
    return code(text).replace("|", "\\|")


def commit(sha: str) -> str:
    """A commit as inline code: the first seven characters of its id, ``unknown`` when there is none."""
    return code(sha[:7] if sha else "unknown")


def marker(*parts: str) -> str:
    """``<!-- kilolock:PART:… -->``, each part kept to letters, digits and ``-_./`` (``_`` for the rest)."""
    safe = ("".join(c if c.isalnum() or c in "-_./" else "_" for c in part) for part in parts)
    return f"<!-- kilolock:{':'.join(safe)} -->"


def block(text: str, tail: int = ERROR_TAIL) -> str:
    """A fenced block holding the (redacted) text, or its last ``tail`` characters."""
    text = redact(text).rstrip()
    shown = text if len(text) <= tail else "…" + text[-tail:]
    fence = "```"
    while fence in shown:
        fence += "`"
    return f"{fence}\n{shown}\n{fence}"


def prose(text: str) -> str:
    """One line of untrusted running text, inert: no HTML, emphasis, links, tables or mentions."""
    text = _line(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = _PUNCTUATION.sub(r"\\\1", text)
    return _LINKS.sub(lambda m: m.group(1)[0] + _ZWSP + m.group(1)[1:], text)


def mention(login: str) -> str:
    """A live ``@login`` for the person who asked (a GitHub login: letters, digits and ``-``), else inert."""
    return f"@{login}" if re.fullmatch(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})(?:\[bot\])?", login) else prose(login)
