"""Terraform instance addresses: formatting, parsing and structured prefix matching.

Owns the canonical text form of resource instance addresses, byte for byte as Terraform prints them
(``module.each["a"].terraform_data.inner[0]``), the parser that turns that text back into steps, and the
prefix rule that decides whether one address covers another.

Must not do I/O, know about state files or plans, or compare addresses as raw strings: every comparison
goes through parsed steps, because ``module.web`` is a string prefix of ``module.webapp``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NoReturn

__all__ = [
    "AddressError",
    "InstanceAddress",
    "ModuleStep",
    "declared_address",
    "format_index_key",
    "format_module_path",
    "has_prefix",
    "instance_address",
    "is_identifier",
    "parse_instance_address",
    "parse_module_path",
    "quote_hcl_string",
    "resource_address",
]

InstanceKey = int | str | None

MANAGED = "managed"
DATA = "data"

# Characters (or pairs) that toHCLQuotedString rewrites; anything else printable is copied through.
_NEEDS_ESCAPE = re.compile(r'[\n\r\t"\\]|[$%]\{')
_SIMPLE_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", '"': '\\"', "\\": "\\\\"}
_UNESCAPES = {"n": "\n", "r": "\r", "t": "\t", '"': '"', "\\": "\\"}
# HCL identifiers: a letter or underscore, then letters, digits, underscores and dashes.
_IDENTIFIER = re.compile(r"[^\W\d][\w-]*")
_INTEGER = re.compile(r"-?[0-9]+")
_HEX = frozenset("0123456789abcdefABCDEF")


class AddressError(ValueError):
    """A Terraform address that cannot be parsed; the message names the problem and its position."""


@dataclass(frozen=True, slots=True)
class ModuleStep:
    """One ``module.NAME`` step of a module instance path, with its instance key when expanded."""

    name: str
    key: InstanceKey = None

    def __str__(self) -> str:
        return f"module.{self.name}{format_index_key(self.key)}"


@dataclass(frozen=True, slots=True)
class InstanceAddress:
    """A parsed resource instance address; ``str()`` gives the canonical text back."""

    module: tuple[ModuleStep, ...]
    mode: str
    type: str
    name: str
    key: InstanceKey = None

    @property
    def module_path(self) -> str:
        """The canonical module instance string, ``""`` for the root module."""
        return format_module_path(self.module)

    @property
    def resource_address(self) -> str:
        """The address of the whole resource: this address without its instance key."""
        return resource_address(self.module_path, self.mode, self.type, self.name)

    def __str__(self) -> str:
        return self.resource_address + format_index_key(self.key)


def is_identifier(text: str) -> bool:
    """Whether ``text`` is a valid HCL identifier, as module, resource type and resource names must be."""
    return _IDENTIFIER.fullmatch(text) is not None


def quote_hcl_string(s: str) -> str:
    """Quote ``s`` exactly as Terraform's ``toHCLQuotedString`` does for string instance keys."""
    if s.isprintable() and _NEEDS_ESCAPE.search(s) is None:
        return f'"{s}"'
    out = ['"']
    last = len(s) - 1
    for i, ch in enumerate(s):
        escaped = _SIMPLE_ESCAPES.get(ch)
        if escaped is not None:
            out.append(escaped)
        elif ch in "$%":
            # Doubling the introducer keeps HCL from reading "${" / "%{" as a template sequence.
            out.append(ch + ch if i < last and s[i + 1] == "{" else ch)
        elif ch.isprintable():
            out.append(ch)
        else:
            code = ord(ch)
            out.append(f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def format_index_key(key: InstanceKey) -> str:
    """Format an instance key: ``""`` for none, ``[0]`` for an int, ``["a"]`` for a string."""
    if key is None:
        return ""
    if isinstance(key, str):
        return f"[{quote_hcl_string(key)}]"
    if isinstance(key, bool) or not isinstance(key, int):
        raise TypeError(f"an instance key must be an int, a str or None, not {key!r}")
    return f"[{key}]"


def format_module_path(steps: tuple[ModuleStep, ...]) -> str:
    """Join module steps into the canonical module instance string (``""`` for the root module)."""
    return ".".join(str(step) for step in steps)


def resource_address(module: str, mode: str, type_: str, name: str) -> str:
    """The canonical resource address; ``module`` is ``""`` for the root module."""
    if mode == MANAGED:
        local = f"{type_}.{name}"
    elif mode == DATA:
        local = f"data.{type_}.{name}"
    else:
        raise ValueError(f"resource mode must be {MANAGED!r} or {DATA!r}, not {mode!r}")
    return f"{module}.{local}" if module else local


def declared_address(type_: str, labels: tuple[str, ...], alias: str = "") -> str:
    """The configuration address a block header declares: ``T.N`` for a resource, ``data.T.N``,
    ``ephemeral.T.N`` and ``action.T.N``, ``var.N``, ``local.N`` (a local's ``locals`` entry), ``provider.N``
    or ``provider.N.ALIAS``, else the type and labels joined (``module.N``, ``output.N``, ``check.N``)."""
    if len(labels) == 2 and type_ == "resource":
        return f"{labels[0]}.{labels[1]}"
    if len(labels) == 2 and type_ in ("data", "ephemeral", "action"):
        return f"{type_}.{labels[0]}.{labels[1]}"
    if labels and type_ == "variable":
        return f"var.{labels[0]}"
    if labels and type_ == "locals":
        return f"local.{labels[0]}"
    if labels and type_ == "provider":
        return f"provider.{labels[0]}.{alias}" if alias else f"provider.{labels[0]}"
    return ".".join((type_, *labels))


def instance_address(module: str, mode: str, type_: str, name: str, index_key: InstanceKey) -> str:
    """The canonical resource instance address, as Terraform prints it."""
    return resource_address(module, mode, type_, name) + format_index_key(index_key)


def parse_instance_address(text: str) -> InstanceAddress:
    """Parse a resource instance address; raises AddressError saying what is wrong and where."""
    parsed = _Parser(text).parse()
    if parsed.resource is None:
        raise AddressError(
            f"invalid address {text!r}: it names the module {parsed.module_text()} but no resource in it; "
            "a resource instance address ends in TYPE.NAME or data.TYPE.NAME"
        )
    mode, type_, name = parsed.resource
    return InstanceAddress(module=parsed.module, mode=mode, type=type_, name=name, key=parsed.key)


def parse_module_path(text: str) -> tuple[ModuleStep, ...]:
    """Parse a module instance string such as ``module.a["x"].module.b``; ``""`` is the root module."""
    if text == "":
        return ()
    parsed = _Parser(text).parse()
    if parsed.resource is not None:
        raise AddressError(f"invalid module path {text!r}: it names a resource, not a module instance")
    return parsed.module


def has_prefix(address: str, prefix: str) -> bool:
    """Whether the instance ``address`` lies under ``prefix``, compared step by step.

    A prefix is a module path (``module.web`` covers every instance of that module call, keyed or not;
    ``module.web["a"]`` covers one instance), a resource (``terraform_data.item`` covers all its
    instances), or a full instance address, which covers only itself. As in Terraform's
    ``ModuleInstance.TargetContains``, only the last module step of a module prefix may leave its key
    out to mean "any key"; earlier steps and the module path of a resource prefix must match exactly.
    Raises AddressError when either argument does not parse.
    """
    target = parse_instance_address(address)
    pattern = _Parser(prefix).parse()
    if pattern.resource is None:
        return _module_covers(pattern.module, target.module)
    if pattern.module != target.module or pattern.resource != (target.mode, target.type, target.name):
        return False
    return pattern.key is None or pattern.key == target.key


def _module_covers(prefix: tuple[ModuleStep, ...], module: tuple[ModuleStep, ...]) -> bool:
    if len(module) < len(prefix):
        return False
    *leading, last = prefix
    if any(ours != theirs for ours, theirs in zip(leading, module, strict=False)):
        return False
    candidate = module[len(prefix) - 1]
    return candidate.name == last.name and (last.key is None or last.key == candidate.key)


@dataclass(frozen=True, slots=True)
class _Parsed:
    """An address or address prefix: module steps, then optionally (mode, type, name) and a key."""

    module: tuple[ModuleStep, ...]
    resource: tuple[str, str, str] | None
    key: InstanceKey

    def module_text(self) -> str:
        return format_module_path(self.module)


class _Parser:
    """A single left-to-right pass over one address; positions in errors are 1-based characters."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def parse(self) -> _Parsed:
        if not self.text:
            raise AddressError("invalid address '': it is empty")
        steps: list[ModuleStep] = []
        while True:
            word = self._identifier("a module step or a resource type")
            if word == "module":
                self._expect(".", "'.' after 'module'")
                name = self._identifier("a module name")
                key = self._optional_key()
                steps.append(ModuleStep(name, key))
                if self._at_end():
                    return _Parsed(tuple(steps), None, None)
                self._expect(".", "'.' after a module step")
                continue
            mode = MANAGED
            if word == DATA:
                mode = DATA
                self._expect(".", "'.' after 'data'")
                word = self._identifier("a data source type")
            self._expect(".", "'.' between resource type and name")
            name = self._identifier("a resource name")
            key = self._optional_key()
            if not self._at_end():
                self._fail("the end of the address after the resource")
            return _Parsed(tuple(steps), (mode, word, name), key)

    def _at_end(self) -> bool:
        return self.pos >= len(self.text)

    def _fail(self, expected: str) -> NoReturn:
        found = "the end of the text" if self._at_end() else repr(self.text[self.pos])
        self._error(f"expected {expected}, found {found}")

    def _error(self, problem: str) -> NoReturn:
        raise AddressError(f"invalid address {self.text!r} at character {self.pos + 1}: {problem}")

    def _expect(self, literal: str, expected: str) -> None:
        if not self.text.startswith(literal, self.pos):
            self._fail(expected)
        self.pos += len(literal)

    def _identifier(self, expected: str) -> str:
        match = _IDENTIFIER.match(self.text, self.pos)
        if match is None:
            self._fail(expected)
        self.pos = match.end()
        return match.group()

    def _optional_key(self) -> InstanceKey:
        if not self.text.startswith("[", self.pos):
            return None
        self.pos += 1
        key: int | str
        if self.text.startswith('"', self.pos):
            key = self._quoted_string()
        else:
            match = _INTEGER.match(self.text, self.pos)
            if match is None:
                self._fail('an instance key: an integer or a "quoted string"')
            key = int(match.group())
            self.pos = match.end()
        self._expect("]", "']' to close the instance key")
        return key

    def _quoted_string(self) -> str:
        text = self.text
        start = self.pos
        self.pos += 1
        out: list[str] = []
        while True:
            if self._at_end():
                self.pos = start
                self._error("this string key is never closed with '\"'")
            ch = text[self.pos]
            if ch == '"':
                self.pos += 1
                return "".join(out)
            if ch == "\\":
                out.append(self._escape())
            elif ch in "$%" and text.startswith(ch + ch + "{", self.pos):
                out.append(ch + "{")
                self.pos += 3
            elif ch in "$%" and text.startswith(ch + "{", self.pos):
                self._error(f"'{ch}{{' would start a template; write '{ch}{ch}{{' for a literal '{ch}{{'")
            elif ch in "\n\r":
                self._error("a string key cannot contain a line break; write \\n or \\r")
            else:
                out.append(ch)
                self.pos += 1

    def _escape(self) -> str:
        text = self.text
        kind = text[self.pos + 1 : self.pos + 2]
        simple = _UNESCAPES.get(kind)
        if simple is not None:
            self.pos += 2
            return simple
        width = {"u": 4, "U": 8}.get(kind)
        if width is None:
            self._fail('an escape: one of \\n \\r \\t \\" \\\\ \\uXXXX \\UXXXXXXXX')
        digits = text[self.pos + 2 : self.pos + 2 + width]
        if len(digits) != width or not _HEX.issuperset(digits) or int(digits, 16) > 0x10FFFF:
            self._fail(f"\\{kind} followed by {width} hex digits naming a Unicode code point")
        self.pos += 2 + width
        return chr(int(digits, 16))
