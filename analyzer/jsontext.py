"""JSON text a client sends, checked for what the store can hold before anything is stored.

Postgres ``jsonb`` and ``text`` cannot hold a NUL character, and neither can hold a lone UTF-16 surrogate
(``"\\ud800"`` is legal JSON text but no Unicode string): a value carrying one would fail deep inside a
write. Kilolock refuses such a body up front, naming where the value sits (``$.resources[0]...``) and never
quoting the value itself, which may be a secret.

Two entry points: ``unstorable_path`` walks an already parsed document (iteratively, so depth costs no
stack); ``may_hold_unstorable`` is a fast scan of the raw bytes that lets a large state skip that walk in
the usual case where no such escape occurs. ``load_json`` is the bounded parse used for request bodies:
depth, integer range and finite numbers are checked too.

Pure: no I/O, standard library only.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = [
    "INT64_MAX",
    "MAX_DEPTH",
    "JsonInputError",
    "json_path",
    "load_json",
    "may_hold_unstorable",
    "unstorable_path",
]

INT64_MAX = 2**63 - 1
# Request bodies (lock info, engine-lane documents, webhook payloads) nest a few levels; a Terraform state's
# attribute values a few dozen at most.
MAX_DEPTH = 128

_UNSTORABLE_CHAR = re.compile("[\x00\ud800-\udfff]")
# A ``\u0000`` escape, a high surrogate escape not followed by a low one, or a low one not preceded by a high.
_UNSTORABLE_ESCAPE = re.compile(
    rb"\\u(?:0000|[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|(?<![dD][89abAB][0-9a-fA-F]{2}\\u)[dD][c-fC-F][0-9a-fA-F]{2})"
)
# UTF-8 encoded surrogates (ED A0..BF xx): not UTF-8, but ``json.loads`` of bytes lets them through.
_ENCODED_SURROGATE = re.compile(rb"\xed[\xa0-\xbf]")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")


class JsonInputError(ValueError):
    """A request body that is not acceptable JSON; the message names the place, never the value."""


def json_path(parts: tuple[str | int, ...]) -> str:
    """``("resources", 0, "name")`` → ``$.resources[0].name``; odd keys are quoted and shortened."""
    out = ["$"]
    for part in parts:
        if isinstance(part, int):
            out.append(f"[{part}]")
        elif _IDENTIFIER.fullmatch(part):
            out.append(f".{part}")
        else:
            shown = _UNSTORABLE_CHAR.sub("?", part[:40]).encode("ascii", "backslashreplace").decode()
            out.append(f"[{json.dumps(shown)}]")
    return "".join(out)


def may_hold_unstorable(raw: bytes | bytearray) -> bool:
    """True when the JSON text may hold a NUL or a lone surrogate (false positives only: an escaped
    backslash before ``u0000``). A quick scan, so large bodies skip ``unstorable_path`` when False."""
    return bool(_UNSTORABLE_ESCAPE.search(raw) or _ENCODED_SURROGATE.search(raw))


def unstorable_path(doc: object) -> str | None:
    """The path of the first key or string holding a NUL or a lone surrogate, or None."""
    stack: list[tuple[object, tuple[str | int, ...]]] = [(doc, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            if _UNSTORABLE_CHAR.search(value):
                return json_path(path)
        elif isinstance(value, dict):
            for key, item in value.items():
                if _UNSTORABLE_CHAR.search(key):
                    return json_path((*path, key)) + " (the key)"
                stack.append((item, (*path, key)))
        elif isinstance(value, list):
            stack.extend((item, (*path, i)) for i, item in enumerate(value))
    return None


def _reject_constant(name: str) -> object:
    raise JsonInputError(f"{name} is not a JSON value: send finite numbers")


def load_json(raw: bytes | bytearray | str, *, max_depth: int = MAX_DEPTH,
              exact_under: frozenset[str] = frozenset()) -> Any:
    """Parse a request body, refusing (JsonInputError) text that is not UTF-8 JSON, nests deeper than
    ``max_depth``, holds NUL or lone surrogates, integers beyond 64 bits or non-finite numbers.

    Integers under the top-level keys ``exact_under`` may exceed 64 bits (up to the digits Python converts):
    a Terraform state carried in a body holds HCL numbers, which are arbitrary precision (``1e20`` is the
    integer 100000000000000000000), and the store keeps them exactly."""
    try:
        doc = json.loads(raw, parse_constant=_reject_constant)
    except RecursionError:
        raise JsonInputError(f"the JSON body nests deeper than {max_depth} levels") from None
    except UnicodeDecodeError:
        raise JsonInputError("the body is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise JsonInputError(f"the body is not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except JsonInputError:
        raise
    except ValueError:  # e.g. an integer with more digits than int() converts
        raise JsonInputError("the body holds a number that is too long") from None
    _check(doc, max_depth, exact_under)
    return doc


def _check(doc: object, max_depth: int, exact_under: frozenset[str] = frozenset()) -> None:
    stack: list[tuple[object, tuple[str | int, ...]]] = [(doc, ())]
    while stack:
        value, path = stack.pop()
        if len(path) > max_depth:
            raise JsonInputError(f"the JSON body nests deeper than {max_depth} levels (at {json_path(path[:8])}...)")
        if isinstance(value, str):
            if _UNSTORABLE_CHAR.search(value):
                raise JsonInputError(_unstorable_message(json_path(path)))
        elif isinstance(value, bool) or value is None:
            continue
        elif isinstance(value, int):
            if not -INT64_MAX - 1 <= value <= INT64_MAX and not (path and path[0] in exact_under):
                raise JsonInputError(f"{json_path(path)} is an integer outside the 64-bit range")
        elif isinstance(value, dict):
            for key, item in value.items():
                if _UNSTORABLE_CHAR.search(key):
                    raise JsonInputError(_unstorable_message(json_path((*path, key)) + " (the key)"))
                stack.append((item, (*path, key)))
        elif isinstance(value, list):
            stack.extend((item, (*path, i)) for i, item in enumerate(value))


def _unstorable_message(where: str) -> str:
    return (f"{where} holds a NUL character or a lone UTF-16 surrogate, which cannot be stored: "
            "remove it or encode the value (for example as base64)")
