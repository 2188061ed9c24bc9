"""Reading one typed member of a parsed JSON object from outside (Terraform's plan JSON, a GitHub payload).

Owns the type checks such a reader makes, so every reader agrees on them: a bool is not a number, a
required string is not empty, an object is any mapping. The caller names the error to raise, so each
document keeps its own problem messages. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeGuard, TypeVar

T = TypeVar("T")


def is_text(value: object) -> TypeGuard[str]:
    """A string with at least one character."""
    return isinstance(value, str) and bool(value)


def is_string(value: object) -> TypeGuard[str]:
    return isinstance(value, str)


def is_number(value: object) -> TypeGuard[int]:
    """A JSON integer: ``true`` and ``false`` are not numbers here, though Python's bool is an int."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_object(value: object) -> TypeGuard[Mapping[str, Any]]:
    return isinstance(value, Mapping)


def is_list(value: object) -> TypeGuard[list[Any]]:
    return isinstance(value, list)


def member(
    doc: Mapping[str, Any],
    key: str,
    wanted: Callable[[object], TypeGuard[T]],
    refuse: Callable[[], Exception],
    default: object = None,
) -> T:
    """``doc[key]`` (``default`` when absent) if it is what ``wanted`` accepts; else raises ``refuse()``."""
    value = doc.get(key, default)
    if not wanted(value):
        raise refuse()
    return value
