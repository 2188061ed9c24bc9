"""The one serialisation layer of what the product writes and reads back itself: the plan file, the engine's
answers, the bot's stored results and outcomes. Frozen dataclasses go through :func:`write` and come back
through :func:`read`, pydantic over the dataclasses as they are. pydantic is loaded on the first document,
so a command that reads none (most of ``kl``) never imports it.

The documents people send (request bodies, ``.kilolock.yml``) have their own models in
:mod:`app.wiremodels`, with the product's refusal messages.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from pydantic import TypeAdapter

T = TypeVar("T")


class ReadError(ValueError):
    """A document of another shape than its type: ``problems`` holds where (a dotted path, "" for the whole
    document) and what, for each field that did not fit, never the values found there."""

    def __init__(self, problems: tuple[tuple[str, str], ...]) -> None:
        super().__init__("; ".join(f"{where or 'the document'}: {what}" for where, what in problems))
        self.problems = problems

    def summary(self, whole: str, shown: int = 5) -> str:
        """The first ``shown`` problems, the whole document called ``whole``, and how many more there are."""
        found = [f"{where or whole}: {what}" for where, what in self.problems]
        more = f"; {len(found) - shown} more" if len(found) > shown else ""
        return "; ".join(found[:shown]) + more


@cache
def _adapter(kind: Any) -> TypeAdapter[Any]:
    from pydantic import TypeAdapter

    return TypeAdapter(kind)


def read(kind: type[T], doc: object) -> T:
    """A document this product wrote back into its frozen dataclass ``kind``: lax, as the stored JSON has
    lists where the types have tuples; keys it does not know are ignored (unless the dataclass's
    ``__pydantic_config__`` forbids them) and missing ones take their defaults. Raises ReadError on a
    document of another shape."""
    value: T = read_as(kind, doc)
    return value


def read_as(hint: object, doc: object) -> Any:
    """``read`` for a type hint that is not a class (``tuple[int, ...]``, ``Outcome | None``)."""
    from pydantic import ValidationError

    try:
        return _adapter(hint).validate_python(doc)
    except ValidationError as exc:
        raise ReadError(tuple((".".join(str(p) for p in e["loc"]), e["msg"]) for e in exc.errors())) from exc


def write(value: object, hint: object = None) -> Any:
    """``value`` (a frozen dataclass, or what ``hint`` describes) as the JSON document ``read`` takes back:
    dataclasses as objects in field order, tuples as lists, enums as their values."""
    return _adapter(type(value) if hint is None else hint).dump_python(value, mode="json")
