"""The models of the documents people and programs send: request bodies and ``.kilolock.yml``, read into
typed values through pydantic, and the same models' JSON schemas. What the product stored itself goes
through :mod:`app.wire` instead, which loads pydantic only when a document is read or written.

A model states each field's type strictly (no coercion: ``"1"`` is not a number, ``true`` is not an
integer). When a document does not fit, :func:`parse` raises :class:`WireError` with the product's own
message for the first field that failed, in field order: the :class:`Problem` attached to that field
(``Annotated[int, Problem("serial must be an integer")]``), or the message a validator raised with
:func:`refusal`, or, for a field without one, its dotted path and pydantic's short text. Messages never
quote the refused value. :func:`schema_of` renders a model's JSON schema for documentation: no titles, and
a field that may be ``null`` is documented by its type alone (null means absent everywhere here).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode, JsonSchemaValue, models_json_schema
from pydantic_core import ErrorDetails, PydanticCustomError, core_schema

_OWN = "kilolock"


@dataclass(frozen=True, slots=True)
class Problem:
    """A field's refusal message: ``message`` for any error, or the one ``by_type`` names for a pydantic
    error type (``missing``, ``string_too_short``, ...)."""

    message: str  # "{field}" stands for the field's name, "{value}" for the refused value's repr
    by_type: Mapping[str, str] = field(default_factory=dict)

    def text(self, error_type: str) -> str:
        return self.by_type.get(error_type, self.message)


@dataclass(frozen=True, slots=True)
class Needed:
    """Marks a field the documentation lists as required: the request is refused without it (its own
    validator says so), although the model gives it a default to refuse with the product's message."""


NEEDED = Needed()


def _document_needed(schema: dict[str, Any], model: type[Any]) -> None:
    needed = [name for name, info in model.model_fields.items() if any(isinstance(m, Needed) for m in info.metadata)]
    have = list(schema.get("required", []))
    for name in needed:
        schema.get("properties", {}).get(name, {}).pop("default", None)
    if needed or have:
        schema["required"] = have + [n for n in needed if n not in have]


class WireError(ValueError):
    """A document that does not fit its model; ``message`` says which field and what is expected."""

    def __init__(self, message: str, loc: tuple[int | str, ...] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.loc = loc


class Wire(BaseModel):
    """Base of every model: strict types, immutable, unknown keys ignored. ``refusal`` is the message for a
    document that is not a JSON object at all."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore", json_schema_extra=_document_needed)
    refusal: ClassVar[str] = "the document must be a JSON object"


M = TypeVar("M", bound=Wire)


def refusal(message: str) -> PydanticCustomError:
    """The error a validator raises to refuse with exactly ``message``."""
    return PydanticCustomError(_OWN, message)


def _problem_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> tuple[Problem, str] | None:
    """The innermost Problem along ``loc`` and the name of its field, walking nested models (lists and
    optionals of them too)."""
    found: tuple[Problem, str] | None = None
    current: Any = model
    for step in loc:
        if isinstance(step, int):
            continue
        fields = getattr(current, "model_fields", None)
        if fields is None or step not in fields:
            break
        info = fields[step]
        problem = next((m for m in reversed(info.metadata) if isinstance(m, Problem)), None)  # the outermost
        found = (problem, step) if problem is not None else found
        current = _nested_model(info.annotation)
    return found


def _nested_model(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        nested = _nested_model(arg)
        if nested is not None:
            return nested
    return None


def explain(model: type[Wire], error: ErrorDetails) -> str:
    """The product's message for one pydantic error of ``model``."""
    loc = tuple(error["loc"])
    if error["type"] == _OWN:
        return error["msg"]
    if not loc:
        return model.refusal
    if error["type"] == "extra_forbidden":
        return f"unknown key {loc[-1]!r} (known: {', '.join(sorted(model.model_fields))})"
    found = _problem_at(model, loc)
    if found is not None:
        problem, name = found
        text = problem.text(error["type"]).replace("{field}", name)
        return text.replace("{value}", repr(error.get("input"))) if "{value}" in text else text
    return f"{'.'.join(str(s) for s in loc)}: {error['msg'][:1].lower()}{error['msg'][1:]}"


def parse(model: type[M], doc: object) -> M:
    """``doc`` read into ``model``, or WireError with the message of its first refused field."""
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_context=False, include_input=False)[0]
        raise WireError(explain(model, first), tuple(first["loc"])) from None


def collect(model: type[M], doc: Mapping[str, Any]) -> tuple[M, list[tuple[str, str]]]:
    """Every problem of ``doc`` at once, for a file a person edits, each with the key it is about ("" for
    an unknown key; the model must forbid extras to see them): unknown keys first, by name, then the fields
    in order. And the model read from what is left once each refused value is taken out (so it holds its
    default). Raises WireError when even that fails (a required field)."""
    try:
        return model.model_validate(doc), []
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False)
    errors.sort(key=lambda e: (e["type"] != "extra_forbidden",
                               str(e["loc"][-1]) if e["type"] == "extra_forbidden" else ""))
    problems = [("" if e["type"] == "extra_forbidden" else str(e["loc"][0]), explain(model, e)) for e in errors]
    return parse(model, _without(doc, [tuple(e["loc"]) for e in errors])), problems


def _without(doc: Any, locs: list[tuple[int | str, ...]]) -> Any:
    """``doc`` with the value at each location taken out (a list item by its index, a key from its mapping)."""
    if not locs or any(not loc for loc in locs):
        return doc
    if isinstance(doc, Mapping):
        return {k: _without(v, [loc[1:] for loc in locs if loc[0] == k]) for k, v in doc.items()
                if (k,) not in locs}
    if isinstance(doc, list):
        return [_without(v, [loc[1:] for loc in locs if loc[0] == i]) for i, v in enumerate(doc)
                if (i,) not in locs]
    return doc


def dump(value: Wire) -> dict[str, Any]:
    """A model as its JSON document (fields at their defaults left out)."""
    return value.model_dump(mode="json", exclude_defaults=True)


class _Documented(GenerateJsonSchema):
    """Schemas for readers: no generated titles; an optional field documented by its own type."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def model_schema(self, schema: core_schema.ModelSchema) -> JsonSchemaValue:
        rendered = super().model_schema(schema)
        rendered.pop("title", None)
        return rendered

    def nullable_schema(self, schema: core_schema.NullableSchema) -> JsonSchemaValue:
        return self.generate_inner(schema["schema"])

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        rendered = super().default_schema(schema)
        if rendered.get("default", ...) is None:
            rendered.pop("default")
        return rendered


def schemas_of(models: tuple[type[BaseModel], ...], ref_template: str,
               mode: JsonSchemaMode = "validation") -> dict[str, Any]:
    """The JSON schemas of ``models`` and the models they nest, by model name, referring to each other
    through ``ref_template`` (e.g. ``#/components/schemas/{model}``)."""
    _, combined = models_json_schema([(m, mode) for m in models], ref_template=ref_template,
                                     schema_generator=_Documented)
    return dict(combined.get("$defs", {}))
