"""The reservation glob grammar: what a glob is (``Glob``, by ``GlobKind``), its text (``parse_glob`` and
``canonical``, which reads back unchanged) and the problem message of a glob that does not parse.

The forms: ``*``, an exact instance address, a module or resource prefix followed by ``.*``, a resource type
followed by ``.*`` (``aws_iam_role.*``, ``module.M.aws_iam_role.*``: every instance of every resource of that
type in that module), or a root output ``output.NAME``, a name prefix ``output.PREFIX*`` or ``output.*``.
Output names are identifiers, so ``output.x`` is always an output: a root resource of type ``output`` cannot
be named by an exact or resource glob (only ``*`` covers it). What globs cover and when two conflict is
``analyzer.globs``, which re-exports these names.

Must not do I/O or compare addresses as raw strings: addresses are read through ``analyzer.addresses``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import NoReturn

from analyzer.addresses import (
    AddressError,
    InstanceAddress,
    ModuleStep,
    format_index_key,
    format_module_path,
    instance_address,
    is_identifier,
    parse_instance_address,
    parse_module_path,
    resource_address,
)

__all__ = ["Glob", "GlobError", "GlobKind", "as_address", "canonical", "parse_glob"]

# analyzer.addresses keeps its own alias private; this is the same union.
_Key = int | str | None
# (mode, type, name), mode being "managed" or "data", as in InstanceAddress.
_Resource = tuple[str, str, str]

_MANAGED = "managed"
_DATA = "data"
_EVERYTHING = "*"
_PREFIX_SUFFIX = ".*"
_OUTPUT = "output"
_OUTPUT_PREFIX = _OUTPUT + "."
_ALL_OUTPUTS = _OUTPUT_PREFIX + "*"


_ACCEPTED_FORMS = (
    "a glob is '*' (everything), an instance address ('aws_vpc.main', 'data.aws_ami.x', "
    "'module.net[\"a\"].aws_subnet.private[0]'), a module prefix ('module.web.*', 'module.net[\"a\"].*', "
    "'module.a.module.b.*'), a resource prefix ('aws_instance.web.*', 'module.x.aws_instance.web.*'), "
    "a resource type ('aws_instance.*', 'data.aws_ami.*', 'module.x.aws_instance.*') "
    "or a root output ('output.NAME', 'output.PREFIX*' for every output whose name starts with PREFIX, "
    "or 'output.*' for every output)"
)


class GlobError(ValueError):
    """A reservation glob that cannot be parsed; the message says what is wrong and lists the forms."""


class GlobKind(StrEnum):
    EVERYTHING = "everything"
    MODULE = "module"  # module.web.*: every address inside the module instance(s)
    RESOURCE = "resource"  # aws_instance.web.*: every instance of one resource, keyed or not
    TYPE = "type"  # aws_instance.*: every instance of every resource of one type in one module
    EXACT = "exact"  # one instance address
    OUTPUT = "output"  # output.NAME: one root output
    OUTPUT_PREFIX = "output_prefix"  # output.payments_*: every root output whose name starts with a prefix
    OUTPUTS = "outputs"  # output.*: every root output


@dataclass(frozen=True, slots=True)
class Glob:
    """A parsed reservation glob; ``str()`` and ``canonical()`` give its normalized text.

    ``module`` is the module path (empty for the root and for ``*``), ``resource`` is
    ``(mode, type, name)`` for resource and exact globs, and ``key`` is the instance key of an exact
    glob; ``output`` is the name of an ``output.NAME`` glob (the prefix of an ``output.PREFIX*`` one);
    ``resource_type`` is ``(mode, type)`` for a type glob (whose ``resource`` is None). Build globs with
    ``parse_glob`` or the ``everything``/``exact``/``module_prefix``/``resource_prefix``/``type_prefix``/
    ``root_output``/``output_prefix``/``all_outputs`` constructors; the constructor rejects shapes that
    have no text form.
    """

    kind: GlobKind
    module: tuple[ModuleStep, ...] = ()
    resource: _Resource | None = None
    key: _Key = None
    output: str | None = None
    resource_type: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        for step in self.module:
            _check_identifier(step.name, "module name")
            _check_key(step.key)
        _check_key(self.key)
        if self.resource is not None:
            mode, type_, name = self.resource
            if mode not in (_MANAGED, _DATA):
                raise ValueError(f"resource mode must be {_MANAGED!r} or {_DATA!r}, not {mode!r}")
            _check_identifier(type_, "resource type")
            if mode == _MANAGED and type_ in ("module", _DATA):
                # The text form would read back as a module step or a data source.
                raise ValueError(f"a managed resource type cannot be {type_!r}")
            if mode == _MANAGED and type_ == _OUTPUT and not self.module:
                # The text form would read back as a root output.
                raise ValueError(
                    f"a root resource of type {_OUTPUT!r} has no glob of its own ('output.NAME' is an output): "
                    "reserve it with '*'"
                )
            _check_identifier(name, "resource name")
        if self.resource_type is not None:
            mode, type_ = self.resource_type
            _check_resource_type(mode, type_, rooted=not self.module)
        if self.output is not None:
            _check_identifier(self.output, "output name")
        has_resource = self.resource is not None
        bare = not self.module and not has_resource and self.key is None
        has_output = self.output is not None
        typed = self.resource_type is not None
        shape_ok = not (typed and self.kind is not GlobKind.TYPE) and {
            GlobKind.EVERYTHING: bare and not has_output,
            GlobKind.MODULE: bool(self.module) and not has_resource and self.key is None and not has_output,
            GlobKind.RESOURCE: has_resource and self.key is None and not has_output,
            GlobKind.TYPE: typed and not has_resource and self.key is None and not has_output,
            GlobKind.EXACT: has_resource and not has_output,
            GlobKind.OUTPUT: bare and has_output,
            GlobKind.OUTPUT_PREFIX: bare and has_output,
            GlobKind.OUTPUTS: bare and not has_output,
        }[self.kind]
        if not shape_ok:
            raise ValueError(
                f"a {self.kind} glob cannot have module={self.module!r}, "
                f"resource={self.resource!r}, key={self.key!r}, output={self.output!r}"
            )

    @classmethod
    def everything(cls) -> Glob:
        """``*``: every address in the state."""
        return cls(GlobKind.EVERYTHING)

    @classmethod
    def exact(cls, address: str | InstanceAddress) -> Glob:
        """The glob naming exactly one instance address; raises AddressError if the text does not parse."""
        a = as_address(address)
        return cls(GlobKind.EXACT, a.module, (a.mode, a.type, a.name), a.key)

    @classmethod
    def module_prefix(cls, module: tuple[ModuleStep, ...]) -> Glob:
        """``module.….*``: every address inside the module instance(s) the steps name."""
        return cls(GlobKind.MODULE, module)

    @classmethod
    def resource_prefix(cls, module: tuple[ModuleStep, ...], mode: str, type_: str, name: str) -> Glob:
        """``….TYPE.NAME.*``: every instance of one resource, with or without an instance key."""
        return cls(GlobKind.RESOURCE, module, (mode, type_, name))

    @classmethod
    def type_prefix(cls, module: tuple[ModuleStep, ...], mode: str, type_: str) -> Glob:
        """``….TYPE.*``: every instance of every resource of one type declared in the module(s) the steps name
        (not in modules nested below them)."""
        return cls(GlobKind.TYPE, module, resource_type=(mode, type_))

    @classmethod
    def root_output(cls, name: str) -> Glob:
        """``output.NAME``: one root output of the state."""
        return cls(GlobKind.OUTPUT, output=name)

    @classmethod
    def output_prefix(cls, prefix: str) -> Glob:
        """``output.PREFIX*``: every root output whose name starts with ``prefix`` (itself an identifier)."""
        return cls(GlobKind.OUTPUT_PREFIX, output=prefix)

    @classmethod
    def all_outputs(cls) -> Glob:
        """``output.*``: every root output of the state."""
        return cls(GlobKind.OUTPUTS)

    @property
    def is_output(self) -> bool:
        """Whether this glob covers root outputs only (``output.NAME``, ``output.PREFIX*`` or ``output.*``)."""
        return self.kind in (GlobKind.OUTPUT, GlobKind.OUTPUT_PREFIX, GlobKind.OUTPUTS)

    @property
    def is_exact(self) -> bool:
        return self.kind is GlobKind.EXACT

    @property
    def is_everything(self) -> bool:
        return self.kind is GlobKind.EVERYTHING

    @property
    def address(self) -> InstanceAddress:
        """The one address an exact glob names; raises ValueError for any other kind."""
        if self.resource is None or self.kind is not GlobKind.EXACT:
            raise ValueError(f"{canonical(self)!r} is a {self.kind} glob, not an exact address")
        mode, type_, name = self.resource
        return InstanceAddress(module=self.module, mode=mode, type=type_, name=name, key=self.key)

    def __str__(self) -> str:
        return canonical(self)


def canonical(glob: Glob) -> str:
    """The normalized text of ``glob``, as stored and shown; ``parse_glob`` reads it back unchanged."""
    if glob.kind is GlobKind.EVERYTHING:
        return _EVERYTHING
    if glob.kind is GlobKind.OUTPUTS:
        return _ALL_OUTPUTS
    if glob.kind is GlobKind.OUTPUT:
        return _OUTPUT_PREFIX + str(glob.output)
    if glob.kind is GlobKind.OUTPUT_PREFIX:
        return _OUTPUT_PREFIX + str(glob.output) + _EVERYTHING
    module = format_module_path(glob.module)
    if glob.resource_type is not None:
        mode, type_ = glob.resource_type
        head = f"{module}." if module else ""
        return head + (f"{_DATA}.{type_}" if mode == _DATA else type_) + _PREFIX_SUFFIX
    if glob.resource is None:
        return module + _PREFIX_SUFFIX
    mode, type_, name = glob.resource
    if glob.kind is GlobKind.EXACT:
        return instance_address(module, mode, type_, name, glob.key)
    return resource_address(module, mode, type_, name) + _PREFIX_SUFFIX


def parse_glob(text: str) -> Glob:
    """Parse a reservation glob; raises GlobError naming the problem and the accepted forms."""
    if text == _EVERYTHING:
        return Glob.everything()
    if not text:
        _reject(text, "it is empty")
    if text.startswith(_OUTPUT_PREFIX):
        return _parse_output(text)
    is_prefix = text.endswith(_PREFIX_SUFFIX)
    body = text[: -len(_PREFIX_SUFFIX)] if is_prefix else text
    star = _stray_star(body)
    if star is not None:
        _reject(
            text,
            f"'*' at character {star + 1} is not allowed there: a wildcard is either the whole glob '*' "
            "or a final '.*' after a module path or a resource; there are no partial names or wildcard steps",
        )
    if not is_prefix:
        return _parse_exact(text)
    if not body:
        _reject(text, "'.*' must follow a module path or a resource")
    try:
        return Glob.module_prefix(parse_module_path(body))
    except AddressError:
        pass  # Not a module path: it may still be a resource, which the next parse explains if not.
    typed = _type_prefix(body)
    if typed is not None:
        return typed
    try:
        address = parse_instance_address(body)
    except AddressError as exc:
        _reject(
            text,
            _explain_prefix(body) or f"{body!r} before '.*' is neither a module path nor a resource ({exc})",
        )
    if address.key is not None:
        _reject(
            text,
            f"{str(address)!r} is a single instance with nothing inside it; write {str(address)!r} "
            f"for it or {address.resource_address + _PREFIX_SUFFIX!r} for every instance of the resource",
        )
    return Glob.resource_prefix(address.module, address.mode, address.type, address.name)


def _type_prefix(body: str) -> Glob | None:
    """``TYPE``, ``data.TYPE``, ``MODULE.TYPE`` or ``MODULE.data.TYPE`` before ``.*``, or None.

    ``module.data.aws_x`` is the managed type ``aws_x`` in the module call named ``data`` (a module path
    is read first, as Terraform reads ``module.NAME``); ``module.m.data.aws_x`` is a data source type."""
    head, _, word = body.rpartition(".")
    if not is_identifier(word) or word in ("module", _DATA):
        return None
    for mode, module_text in ((_MANAGED, head), (_DATA, _data_head(head))):
        if module_text is None or (module_text and not module_text.startswith("module.")):
            continue
        try:
            module = parse_module_path(module_text)
        except AddressError:
            continue
        if mode == _MANAGED and not module and word == _OUTPUT:
            return None  # a root type 'output' has no glob: 'output.*' is every root output
        return Glob.type_prefix(module, mode, word)
    return None


def _data_head(head: str) -> str | None:
    """The module path before a trailing ``data`` step, or None when there is none."""
    if head == _DATA:
        return ""
    return head[: -len(_DATA) - 1] if head.endswith("." + _DATA) else None


def as_address(address: str | InstanceAddress) -> InstanceAddress:
    """The parsed address (raises AddressError if the text does not parse)."""
    return address if isinstance(address, InstanceAddress) else parse_instance_address(address)


def _parse_output(text: str) -> Glob:
    if text == _ALL_OUTPUTS:
        return Glob.all_outputs()
    name = text[len(_OUTPUT_PREFIX):]
    if is_identifier(name):
        return Glob.root_output(name)
    if name.endswith(_EVERYTHING) and is_identifier(name[:-1]):
        return Glob.output_prefix(name[:-1])
    head = name.split(".", 1)[0].split("[", 1)[0]
    hint = (
        f"; write {_OUTPUT_PREFIX + head!r} for the whole output"
        if is_identifier(head)
        else ""
    )
    _reject(
        text,
        f"an output glob is 'output.NAME' with NAME an identifier, 'output.PREFIX*' or 'output.*': outputs "
        f"are root values with no instance keys or attributes, and the only wildcard is one final '*'{hint}",
    )


def _parse_exact(text: str) -> Glob:
    try:
        return Glob.exact(parse_instance_address(text))
    except AddressError as exc:
        problem = str(exc)
    try:
        module = parse_module_path(text)
    except AddressError:
        _reject(text, problem)
    _reject(
        text,
        f"{format_module_path(module)!r} names a module, not a resource instance; "
        f"write {format_module_path(module) + _PREFIX_SUFFIX!r} for every address inside it",
    )


def _explain_prefix(body: str) -> str | None:
    """A pointed hint for a module path plus a dangling ``module`` or ``data``."""
    head, _, word = body.rpartition(".")
    if _is_module_path(head):
        if word == "module":
            return f"{body!r} has no module name: write {body + '.NAME.*'!r}; '*' alone covers everything"
        if word == _DATA:
            return f"{body!r} has no data source type and name: write {body + '.TYPE.NAME.*'!r}"
    return None


def _is_module_path(text: str) -> bool:
    try:
        parse_module_path(text)
    except AddressError:
        return False
    return True


def _stray_star(body: str) -> int | None:
    """The index of the first ``*`` outside a quoted instance key, or None."""
    in_string = False
    escaped = False
    for i, ch in enumerate(body):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == "*":
            return i
    return None


def _reject(text: str, problem: str) -> NoReturn:
    raise GlobError(f"invalid glob {text!r}: {problem}; {_ACCEPTED_FORMS}")


def _check_identifier(text: str, what: str) -> None:
    if not is_identifier(text):
        raise ValueError(f"{what} {text!r} is not a valid identifier")


def _check_resource_type(mode: str, type_: str, *, rooted: bool) -> None:
    if mode not in (_MANAGED, _DATA):
        raise ValueError(f"resource mode must be {_MANAGED!r} or {_DATA!r}, not {mode!r}")
    _check_identifier(type_, "resource type")
    if mode == _MANAGED and (type_ in ("module", _DATA) or (rooted and type_ == _OUTPUT)):
        raise ValueError(f"a managed resource type glob cannot name the type {type_!r}")


def _check_key(key: _Key) -> None:
    # format_index_key raises TypeError for anything that is not an int, a str or None (bools included).
    format_index_key(key)
