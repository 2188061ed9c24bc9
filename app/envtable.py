"""Settings tables: one row per environment variable, and the one reader that turns a table into values.

Owns: the row shape (the field it fills, the variable, its parser, a one-line doc and the default as
``docs/configuration.md`` states it), binding rows to a settings dataclass (:func:`bind`: a default is
written once, on the dataclass field, and the row reads it from there), the parsers shared by every table,
and reading a table from a mapping while collecting every problem. ``app.config`` (the service) and
``runner.core.config`` (the ``kl`` client) each hold one table; ``tests/test_docs.py`` checks both against the
documentation.

Must not: read ``os.environ`` (the config modules hand the environment in) or know any one setting.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import MISSING, dataclass, fields, replace
from pathlib import Path
from typing import Any, Final

UNBOUND: Final = object()  # a row's default before :func:`bind` gives it the field's


@dataclass(frozen=True, slots=True)
class Setting:
    """One environment variable. ``parse`` gets the raw text (never empty or blank; those mean
    ``default``) and raises ValueError whose arguments each complete the sentence "``VARIABLE`` …".
    ``default`` is the settings field's own, filled in by :func:`bind`."""

    field: str
    variable: str
    parse: Callable[[str], Any]
    doc: str
    shown: str | None = None  # the default as the docs state it, when not the value itself
    default: Any = UNBOUND

    @property
    def documented_default(self) -> str:
        """What the docs' default column starts with for this variable."""
        if self.shown is not None:
            return self.shown
        if self.default is None or self.default == ():
            return "unset"
        if isinstance(self.default, bool):
            return f"`{str(self.default).lower()}`"
        return f"`{self.default}`"

    def read(self, env: Mapping[str, str], problems: list[str]) -> Any:
        """The parsed value of this variable in ``env``, or the default; a bad value adds to ``problems``."""
        if self.default is UNBOUND:
            raise RuntimeError(f"{self.variable}: a row outside a bound table has no default")
        raw = env.get(self.variable, "")
        if not raw.strip():
            return self.default
        try:
            return self.parse(raw)
        except ValueError as exc:
            problems.extend(f"{self.variable} {message}" for message in exc.args)
            return self.default


def bind(settings: type[Any], rows: Iterable[Setting]) -> tuple[Setting, ...]:
    """``rows`` as the table of the dataclass ``settings``: one row per field, in field order, each with the
    field's default. Raises RuntimeError (at import) when a field has no row, a row no field, or a field no
    plain default."""
    table = tuple(rows)
    declared = {f.name: f.default for f in fields(settings)}
    if [row.field for row in table] != list(declared):
        raise RuntimeError(f"{settings.__name__}: the table's rows {[row.field for row in table]} are not its "
                           f"fields {list(declared)}")
    if any(default is MISSING for default in declared.values()):
        raise RuntimeError(f"{settings.__name__}: every field needs a plain default")
    return tuple(replace(row, default=declared[row.field]) for row in table)


def read_table(table: Iterable[Setting], env: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """Every field of ``table`` read from ``env``, and the problems met (empty when all is well)."""
    problems: list[str] = []
    values = {row.field: row.read(env, problems) for row in table}
    return values, problems


def text(raw: str) -> str:
    return raw.strip()


def verbatim(raw: str) -> str:
    """Credentials and names passed on as given (only an empty value counts as unset)."""
    return raw


def path(raw: str) -> Path:
    return Path(raw.strip()).expanduser()


def url(raw: str) -> str:
    return raw.strip().rstrip("/")


def whole(minimum: int = 1) -> Callable[[str], int]:
    """A whole number of at least ``minimum``."""

    def parse(raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise ValueError(f"must be a whole number, got {raw.strip()!r}") from None
        if value < minimum:
            raise ValueError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def boolean(raw: str) -> bool:
    word = raw.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"must be true or false, got {raw.strip()!r}")


def one_of(choices: Sequence[str], *, upper: bool = False, aliases: Mapping[str, str] | None = None,
           note: str = "") -> Callable[[str], str]:
    """One of ``choices``, in any case (folded to upper or lower case as the choices are written)."""

    def parse(raw: str) -> str:
        word = raw.strip().upper() if upper else raw.strip().lower()
        word = (aliases or {}).get(word, word)
        if word not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}{note}; got {raw.strip().lower()!r}")
        return word

    return parse


def comma_list(raw: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in raw.split(",") if item.strip())
