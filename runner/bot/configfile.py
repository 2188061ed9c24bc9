"""The shape of ``.kilolock.yml`` as models of the serialisation layer (``app.wiremodels``): which keys exist at
the top level, in a project and in a ``drift:`` mapping, each key's type, and the problem that names it.

A model reads what a key holds on its own (a boolean, a duration, a list of requirement names, variable
names); ``runner.bot.config`` checks what needs the checkout or the file's text (directories, backend blocks,
trigger globs, the line of each ``owners:`` rule) and puts every problem in the file's order. Problems quote
the refused value, as a person fixing their own file needs it.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, ValidationInfo
from pydantic_core import PydanticCustomError

from app.domain.durations import parse_duration
from app.wiremodels import Problem, Wire, refusal
from runner.core import childenv

DEFAULT_MERGE_WAIT = 600
MAX_MERGE_WAIT = 6 * 3600
# Scheduled drift windows: the scheduler ticks every few minutes, so shorter windows would be missed,
# and a check older than a month says little about now.
MIN_DRIFT_EVERY = 15 * 60
MAX_DRIFT_EVERY = 31 * 86400
MIN_HOLD_EXPIRY = 3600
MAX_HOLD_EXPIRY = 366 * 86400
REQUIREMENTS = ("approved", "last_push_approved", "owners_approved", "mergeable", "undiverged")
DEFAULT_REQUIREMENTS = ("approved", "mergeable")


def _refused() -> PydanticCustomError:
    """The field's own Problem applies (with the value as given)."""
    return PydanticCustomError("refused", "refused")


def whole_seconds(value: Any) -> int | None:
    """A whole number of seconds, or a duration text (``app.domain.durations``) of whole seconds; else None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if not isinstance(value, str):
        return None
    try:
        seconds = parse_duration(value)
    except ValueError:
        return None
    return int(seconds) if seconds.is_integer() else None


def _seconds_between(low: int, high: int, *, none_ok: bool = False) -> Any:
    def check(value: Any) -> int | None:
        if value is None and none_ok:
            return None
        seconds = whole_seconds(value)
        if seconds is None or not low <= seconds <= high:
            raise _refused()
        return seconds
    return AfterValidator(check)


def _version(value: Any) -> Any:
    if value != 1:
        raise _refused()
    return value


def _non_blank(value: str | None) -> str | None:
    if value is None:
        return None
    if not value.strip():
        raise _refused()
    return value.strip()


def _not_null(value: Any) -> Any:
    if value is None:
        raise _refused()
    return value


def _known_requirements(value: list[str]) -> list[str]:
    unknown = [v for v in value if v not in REQUIREMENTS]
    if unknown:
        raise refusal(f"apply_requirements: unknown requirement(s) {', '.join(map(repr, unknown))} (known: "
                      f"{', '.join(REQUIREMENTS)})")
    return [r for r in REQUIREMENTS if r in value]


def _env_name(name: Any, info: ValidationInfo) -> Any:
    problem = childenv.passthrough_problem(name)
    if problem:
        raise refusal(f"{info.field_name}: {problem}")
    return name


class _File(Wire):
    """Keys of a person's file: unknown ones are problems, as is any value of the wrong type."""

    model_config = ConfigDict(extra="forbid")


Flag = Annotated[bool, Problem("{field} must be true or false, got {value}")]
# A project's flag: absent (None) inherits the top level's; an explicit null is refused like any non-boolean.
OwnFlag = Annotated[bool | None, BeforeValidator(_not_null), Problem("{field} must be true or false, got {value}")]
Name = Annotated[str | None, AfterValidator(_non_blank), Problem("{field} must be a non-empty string, got {value}")]
EnvNames = Annotated[list[Annotated[Any, AfterValidator(_env_name)]] | None,
                     Problem('{field} must be a list of variable names (AWS_PROFILE, "TF_VAR_*"), got {value}')]


class DriftKeys(_File):
    """``drift: {every: 6h, issue: true}``."""

    every: Annotated[Any, _seconds_between(MIN_DRIFT_EVERY, MAX_DRIFT_EVERY),
                     Problem("every must be a duration between 15m and 31d such as 30m, 6h or 1d, got {value}")] = None
    issue: Flag = False


class ProjectKeys(_File):
    """One item of ``projects:``; ``dir``, ``files``, ``drift`` and ``owners`` are read by the config."""

    dir: Any = None
    name: Name = None
    state: Name = None
    files: Any = None
    apply_on_merge: OwnFlag = None
    apply_on_comment: OwnFlag = None
    drift: Any = None
    env: EnvNames = None
    owners: Any = None


class FileKeys(_File):
    """The top level of the file, in the order its problems are listed."""

    version: Annotated[Any, AfterValidator(_version), Problem("version must be 1, got {value}")] = 1
    apply_on_merge: Flag = True
    apply_on_push: Flag = False
    merge_wait: Annotated[Any, _seconds_between(0, MAX_MERGE_WAIT), Problem(
        "merge_wait must be a duration between 0 and 6h such as 600, 90s, 10m or 1h, got {value}")
    ] = DEFAULT_MERGE_WAIT
    apply_on_comment: Flag = False
    apply_requirements: Annotated[list[str], AfterValidator(_known_requirements), Problem(
        "apply_requirements must be a list such as [approved, mergeable, undiverged] (or []), got {value}")
    ] = Field(default_factory=lambda: list(DEFAULT_REQUIREMENTS))
    drift: Any = None
    env: EnvNames = None
    hold_expiry: Annotated[Any, _seconds_between(MIN_HOLD_EXPIRY, MAX_HOLD_EXPIRY, none_ok=True), Problem(
        "hold_expiry must be a duration from 1h to 366d (7d, 48h), got {value}")] = None
    untrusted_previews: Flag = False
    apply_branch: Annotated[Name, Problem("top level: apply_branch must be a non-empty string, got {value}")] = None
    owners: Any = None
    projects: Any = None
