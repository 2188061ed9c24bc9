"""The one comparison of JSON values: when a value read from Postgres meets a value Terraform wrote.

The same value reaches Kilolock as different texts: Postgres ``jsonb`` prints ``["a", "b"]`` with spaces,
orders object keys by length, writes ``1e3`` as ``1000`` and ``1.5e-07`` as ``0.00000015``, and keeps
``1.0``; Terraform writes compact or indented JSON, numbers in plain decimal notation; Python's
``json`` writes ``1e+16`` for a large float. Text comparison of such values calls every one of them
changed. This module owns the single canonical form they are compared in:

- objects with sorted keys, compact separators, raw Unicode (escapes decoded, so ``"\\u00e9"`` is ``"é"``);
- numbers by their value: a number with no fractional part is an exact integer (``1``, ``1.0``, ``1e3``,
  ``-0.0`` and ``0`` are ``1``, ``1``, ``1000``, ``0``, ``0``; a float beyond 2**53 is the integer its
  shortest decimal names, as Postgres stores it), any other number is the float it parses to;
- ``null``, empty lists and empty objects as themselves (``null`` is neither ``[]`` nor ``{}``).

``analyzer.state`` parses state bodies with ``json_number`` as its float hook, so the instance text it
stores and the ``attributes_hash`` it computes are already in this form; the functions here compare texts
and values that did not come through that parser (rows read back from the database, plan JSON values).

Must stay pure (standard library only, no I/O) and must never log or return a value it compares.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

__all__ = ["WholeNumber", "canonical_text", "json_number", "load_json", "normal_value", "same_json", "same_value"]

# Below this magnitude every integral float converts to int exactly and its shortest repr is that integer.
_EXACT_INT = 2.0**53

_encode = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def _integral(value: float) -> int:
    """The integer an integral finite float stands for: its shortest decimal, which is what a JSON
    writer printed and what Postgres keeps (``int(1e300)`` is not ``10**300``; this is)."""
    return int(value) if -_EXACT_INT < value < _EXACT_INT else int(Decimal(repr(value)))


class WholeNumber(int):
    """An integer that was written with a fraction or an exponent (``1.0``, ``1e3``). It equals, hashes and
    serialises as the plain integer; only fields whose type is part of the format (a state's ``version`` and
    ``serial``, which Terraform reads as integers) tell it apart, by ``type(x) is int``."""

    __slots__ = ()


def json_number(text: str) -> int | float:
    """A JSON number with a fraction or an exponent, in the canonical form: an exact integer (a
    ``WholeNumber``) when it has no fractional part, else the float it parses to (infinities stay floats:
    callers reject them)."""
    value = float(text)
    if value.is_integer():  # False for inf and nan
        return WholeNumber(_integral(value))
    return value


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON value")


_decode = json.JSONDecoder(parse_float=json_number, parse_constant=_reject_constant).decode


def load_json(text: str | bytes) -> Any:
    """Parse JSON text into the canonical form. Raises ValueError for text that is not JSON or holds NaN
    or an infinity."""
    return _decode(text.decode() if isinstance(text, bytes) else text)


def normal_value(value: Any) -> Any:
    """A value built in Python (or parsed elsewhere) in the canonical form: integral floats become ints,
    tuples lists. Raises ValueError for NaN, infinities and values JSON cannot hold."""
    if isinstance(value, bool) or value is None or isinstance(value, str | int):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError("NaN and infinities are not JSON values")
        return _integral(value) if value.is_integer() else value
    if isinstance(value, dict):
        return {str(k): normal_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [normal_value(v) for v in value]
    raise ValueError(f"a {type(value).__name__} is not a JSON value")


def canonical_text(value: Any) -> str:
    """The canonical text of a value (a parsed one, or one built in Python)."""
    return _encode(normal_value(value))


def same_value(a: Any, b: Any) -> bool:
    """Whether two parsed values are the same JSON value. ``True`` and ``1`` differ; so do ``null``,
    ``[]`` and ``{}``."""
    return canonical_text(a) == canonical_text(b)


def same_json(a: str | bytes, b: str | bytes) -> bool:
    """Whether two JSON texts hold the same value, whoever wrote them (Postgres, Terraform, Python).
    Raises ValueError when either is not JSON."""
    if a == b:
        return True
    return same_value(load_json(a), load_json(b))
