"""Reading a v4 state body instance by instance, so a large upload never exists as one parsed tree.

``stream_state`` walks the top-level object, the ``resources`` array and each resource's ``instances``
array itself, and hands every other value (one instance object, the outputs, a scalar) to ``json``'s own
C scanner. It decodes the body a window at a time, so besides the body and the rows it holds only one
window of text and one instance's tree. Each row comes out exactly as ``analyzer.staterows`` builds it from a
whole-document parse (the same helpers build it).

It reads only the shape Terraform writes: an object whose keys each occur once, resources whose
``mode``/``type``/``name``/``provider`` (and ``module``) come before their ``instances``. Anything else,
and every body that is not a usable v4 state, raises ``Unstreamable``: the caller then parses the whole
document, which gives the exact answer (and the exact error message) for those bodies.

A caller may also watch the rows as they are read (``watch``): once the top-level fields before
``resources`` are read, it is handed them and may return a consumer that then receives every row as soon as it
is built, so the caller can store rows while the rest of the body is still being read. The rows it got are
only usable when the parse returns: an ``Unstreamable`` or any error after them means they are not.

Must not do I/O; standard library only (orjson, when ``analyzer.staterows`` uses it, for the canonical dumps).
"""

from __future__ import annotations

import codecs
import json
import json.decoder
import json.scanner
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol, cast

from analyzer import staterows as st

__all__ = ["RowConsumer", "Unstreamable", "Watch", "stream_state"]

# Text decoded per step; a value longer than the window grows it (doubling), so no value is cut.
WINDOW_BYTES = 4 * 1024 * 1024
# A number that ends this close to the window's end may continue in the next bytes ("1.5e" + "10").
_NUMBER_TAIL = 16
_WHITESPACE = re.compile(r"[ \t\n\r]*")
# What follows an array element: its comma (and the whitespace before the next one) or the closing bracket.
_SEPARATOR = re.compile(r"[ \t\n\r]*([,\]])[ \t\n\r]*")
_HEADER_KEYS = ("mode", "type", "name", "provider")
# A resource's fields up to its ``instances`` array, in the order Terraform writes them, matched in one step:
# most resources of a large state hold one instance or a few, so reading their header key by key would cost
# more than reading their instances. Strings that may hold escapes are decoded by json's own scanner; a
# resource this does not match (another order, a header cut by the window's end) is read key by key.
_WS = r"[ \t\n\r]*"
_STRING = r'("(?:[^"\\]|\\.)*")'
_PLAIN = r'"([A-Za-z0-9_-]*)"'
_RESOURCE_HEAD = re.compile(
    rf'\{{{_WS}(?:"module"{_WS}:{_WS}{_STRING}{_WS},{_WS})?"mode"{_WS}:{_WS}"(managed|data)"{_WS},{_WS}'
    rf'"type"{_WS}:{_WS}{_PLAIN}{_WS},{_WS}"name"{_WS}:{_WS}{_PLAIN}{_WS},{_WS}'
    rf'(?:"each"{_WS}:{_WS}{_STRING}{_WS},{_WS})?"provider"{_WS}:{_WS}{_STRING}{_WS},{_WS}"instances"{_WS}:{_WS}(?=\[)'
)
_STREAMED = object()
_scanstring: Callable[[str, int, bool], tuple[Any, int]] = json.decoder.scanstring  # type: ignore[attr-defined]


class Unstreamable(Exception):  # noqa: N818 - a signal to the caller, not an error of the body
    """The body is not in the shape this reader handles; parse it whole instead."""


RowConsumer = Callable[[st.InstanceRow], object]
# Handed the top-level fields read before ``resources``; returns what receives each row, or None.
Watch = Callable[[Mapping[str, Any]], RowConsumer | None]


class _Rows(Protocol):
    def append(self, row: st.InstanceRow, /) -> None: ...
    def extend(self, rows: Iterable[st.InstanceRow], /) -> None: ...


class _Tee:
    """The parse's row list that also hands each row to a consumer as it is added."""

    __slots__ = ("_consume", "_rows")

    def __init__(self, rows: list[st.InstanceRow], consume: RowConsumer) -> None:
        self._rows = rows
        self._consume = consume

    def append(self, row: st.InstanceRow) -> None:
        self._rows.append(row)
        self._consume(row)

    def extend(self, rows: Iterable[st.InstanceRow]) -> None:
        for row in rows:
            self.append(row)


class _Window:
    """The body decoded as UTF-8 a window at a time; ``text[pos:]`` is what has not been read yet."""

    __slots__ = ("_decoder", "_offset", "_raw", "eof", "pos", "scan", "text", "floats")

    def __init__(self, raw: bytes | bytearray | memoryview, floats: st._FloatCheck) -> None:
        self._raw = memoryview(raw)
        self._decoder = codecs.getincrementaldecoder("utf-8")("strict")
        self._offset = 0
        self.text = ""
        self.pos = 0
        self.eof = False
        self.floats = floats
        decoder = json.JSONDecoder(parse_constant=st._reject_constant, parse_float=floats)
        self.scan: Callable[[str, int], tuple[Any, int]] = json.scanner.make_scanner(decoder)  # type: ignore[arg-type]

    def more(self) -> bool:
        """Decode the next bytes (at least as many as are unread, so a long value is read in few steps)."""
        if self.eof:
            return False
        size = max(WINDOW_BYTES, len(self.text) - self.pos)
        piece = self._raw[self._offset:self._offset + size]
        self._offset += len(piece)
        self.eof = self._offset >= len(self._raw)
        try:
            decoded = self._decoder.decode(piece, self.eof)
        except UnicodeDecodeError as exc:
            raise Unstreamable from exc
        self.text = self.text[self.pos:] + decoded
        self.pos = 0
        return True

    def peek(self) -> str:
        """The next character after whitespace ('' at the end of the body)."""
        while True:
            self.pos = _WHITESPACE.match(self.text, self.pos).end()  # type: ignore[union-attr]
            if self.pos < len(self.text):
                return self.text[self.pos]
            if not self.more():
                return ""

    def expect(self, char: str) -> None:
        if self.peek() != char:
            raise Unstreamable
        self.pos += 1

    def value(self) -> Any:
        """The next JSON value, parsed by json's scanner."""
        self.peek()
        while True:
            try:
                value, end = self.scan(self.text, self.pos)
            except (StopIteration, ValueError, RecursionError) as exc:
                if self.more():
                    continue
                raise Unstreamable from exc
            if end > len(self.text) - _NUMBER_TAIL and self.more():
                continue
            self.pos = end
            return value

    def key(self) -> str:
        """The next object key and its colon."""
        if self.peek() != '"':
            raise Unstreamable
        while True:
            try:
                key, end = _scanstring(self.text, self.pos + 1, True)
            except ValueError as exc:
                if self.more():
                    continue
                raise Unstreamable from exc
            self.pos = end
            self.expect(":")
            return cast(str, key)

    def members(self) -> Iterator[str]:
        """The keys of the object that starts here; the caller reads each value before the next key."""
        for _ in self._elements("{", "}"):
            yield self.key()

    def items(self) -> Iterator[None]:
        """One step per element of the array that starts here; the caller reads each element."""
        return self._elements("[", "]")

    def _elements(self, opening: str, closing: str) -> Iterator[None]:
        """One step per comma-separated element of the container that starts here with ``opening``."""
        self.expect(opening)
        if self.peek() == closing:
            self.pos += 1
            return
        while True:
            yield None
            char = self.peek()
            self.pos += 1
            if char == closing:
                return
            if char != ",":
                raise Unstreamable


def stream_state(raw: bytes | bytearray | memoryview, *, accelerated: bool,
                 watch: Watch | None = None) -> st.ParsedState:
    """The rows of a v4 state body, read instance by instance; Unstreamable when the body must be parsed
    whole (an odd shape, or any problem with it: the whole parse reports it). ``watch``, when given, is
    called once, when the ``resources`` array starts (see the module's docstring)."""
    try:
        return _stream(raw, accelerated, watch)
    except (st.StateFormatError, RecursionError) as exc:
        raise Unstreamable from exc


def _canonical_for(floats: st._FloatCheck, accelerated: bool) -> st._Canonical:
    # Per value rather than per body: for a value whose floats orjson writes like json, both encoders give
    # the same text, so the choice cannot change a byte.
    return st._canonical_accelerated if accelerated and floats.orjson_safe else st._canonical


def _stream(raw: bytes | bytearray | memoryview, accelerated: bool, watch: Watch | None) -> st.ParsedState:
    floats = st._FloatCheck()
    window = _Window(raw, floats)
    doc: dict[str, Any] = {}
    rows: list[st.InstanceRow] = []
    outputs: tuple[st.OutputRow, ...] = ()
    for key in window.members():
        if key in doc:
            raise Unstreamable
        if key == "resources" and window.peek() == "[":
            consume = None if watch is None else watch(doc)
            _stream_resources(window, rows if consume is None else _Tee(rows, consume), accelerated)
            doc[key] = _STREAMED
        elif key == "outputs":
            floats.orjson_safe = True
            doc[key] = window.value()
            outputs = st._parse_outputs(doc[key], _canonical_for(floats, accelerated))
        else:
            doc[key] = window.value()
    if window.peek() != "":
        raise Unstreamable  # trailing data
    version = doc.get("version")
    if type(version) is not int or version != st.STATE_VERSION:
        raise Unstreamable
    resources = doc.get("resources")
    if resources is not None and resources is not _STREAMED:
        raise Unstreamable
    terraform_version = doc.get("terraform_version", "")
    if not isinstance(terraform_version, str):
        raise Unstreamable
    return st.ParsedState(
        serial=st._serial(doc),
        lineage=st._lineage(doc),
        terraform_version=terraform_version,
        instances=tuple(rows),
        outputs=outputs,
    )


def _stream_resources(window: _Window, rows: _Rows, accelerated: bool) -> None:
    modules: dict[str, str] = {"": ""}
    seen: set[tuple[str, str]] = set()
    floats = window.floats
    for position, _ in enumerate(window.items()):
        floats.orjson_safe = True
        window.peek()
        head = _RESOURCE_HEAD.match(window.text, window.pos)
        if head is not None:
            _stream_resource(window, position, head, modules, rows, seen, accelerated)
            continue
        resource: dict[str, Any] = {}
        for key in window.members():
            if key in resource:
                raise Unstreamable
            if resource.get("instances") is _STREAMED and key in ("module", *_HEADER_KEYS):
                raise Unstreamable  # a field its rows depend on came after them
            if key == "instances" and window.peek() == "[" and all(k in resource for k in _HEADER_KEYS):
                _stream_instances(window, st._resource_header(position, resource, modules), rows, seen,
                                  accelerated)
                resource[key] = _STREAMED
            else:
                resource[key] = window.value()
        if resource.get("instances") is not _STREAMED:  # no instances, or read whole: the usual rules
            rows.extend(st._parse_resource(position, resource, modules, seen, _canonical_for(floats, accelerated)))


def _string(text: str, start: int) -> str:
    """The JSON string whose opening quote is at ``text[start]`` (the pattern matched it whole)."""
    try:
        return cast(str, _scanstring(text, start + 1, True)[0])
    except ValueError as exc:  # a control character: the whole parse names it
        raise Unstreamable from exc


def _stream_resource(
    window: _Window, position: int, head: re.Match[str], modules: dict[str, str], rows: _Rows,
    seen: set[tuple[str, str]], accelerated: bool,
) -> None:
    """The resource whose header ``_RESOURCE_HEAD`` matched: its instances, then any fields after them."""
    text = window.text
    resource: dict[str, Any] = {"mode": head.group(2), "type": head.group(3), "name": head.group(4),
                                "provider": _string(text, head.start(6))}
    if head.group(1) is not None:
        resource["module"] = _string(text, head.start(1))
    if head.group(5) is not None:
        resource["each"] = _string(text, head.start(5))
    window.pos = head.end()
    _stream_instances(window, st._resource_header(position, resource, modules), rows, seen, accelerated)
    resource["instances"] = _STREAMED
    char = window.peek()
    window.pos += 1
    while char == ",":
        key = window.key()
        if key in resource or key == "module":
            raise Unstreamable  # a repeated key, or a field its rows depend on after them
        resource[key] = window.value()
        char = window.peek()
        window.pos += 1
    if char != "}":
        raise Unstreamable


def _stream_instances(
    window: _Window, header: st._ResourceHeader, rows: _Rows, seen: set[tuple[str, str]],
    accelerated: bool,
) -> None:
    """The rows of the ``instances`` array that starts here. The hot loop of a large upload, so it works on
    the window's text directly: one scanner call and one separator match per instance."""
    floats = window.floats
    fast = st._canonical_accelerated if accelerated else st._canonical
    slow = st._canonical
    instance_row = st._instance_row
    append = rows.append
    window.expect("[")
    if window.peek() == "]":
        window.pos += 1
        return
    text, pos = window.text, window.pos
    scan, separator = window.scan, _SEPARATOR.match
    while True:
        floats.orjson_safe = True
        try:
            instance, end = scan(text, pos)
            found = separator(text, end)
        except (StopIteration, ValueError):
            found = None
        if found is None or found.end() > len(text) - _NUMBER_TAIL:
            # Near the window's end (or a problem): the careful path reads this element and its separator.
            window.pos = pos
            instance = window.value()
            char = window.peek()
            window.pos += 1
            append(instance_row(header, instance, seen, fast if floats.orjson_safe else slow))
            if char == "]":
                return
            if char != ",":
                raise Unstreamable
            window.peek()
            text, pos = window.text, window.pos
            continue
        append(instance_row(header, instance, seen, fast if floats.orjson_safe else slow))
        pos = found.end()
        if found.group(1) == "]":
            window.pos = pos
            return
