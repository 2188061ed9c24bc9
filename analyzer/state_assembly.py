"""Instance and output rows back into a v4 state file that Terraform reads as its own.

Owns the assembly: resources sorted the way Terraform sorts them, instance objects with their fields in
Terraform's order, indented and escaped the way Terraform's Go encoder writes them, so a state assembled
from rows is byte-comparable with one Terraform wrote. The row shapes and their parsing are
``analyzer.state``'s. Must not do I/O.

``stream_state`` writes the file as a sequence of byte pieces from rows that arrive already in
Terraform's order (``row_order``), one resource at a time and at most ``_RUN_ROWS`` of its instances
together, so a caller reading rows from a database cursor never holds the parsed state: only the current
run's trees and one piece of text.
``assemble_state`` sorts rows given in any order and joins the pieces. Both write exactly the text of
``json.dumps(document, indent=2)`` with Go's escapes: each instance object is encoded on its own and
indented to its depth (a JSON string never holds a raw newline, so indenting the lines of a value is the
same as encoding it in place). A run of instances whose text orjson writes as ``json`` would is parsed
by one orjson call (and, when its objects agree with their rows and share one field set, checked and put
in Terraform's field order by C loops over the run) and written by one, as an array nested to the items'
depth, whose lines are those of the items indented there one by one.

The optional ``orjson`` (see ``analyzer.state``) encodes an instance when it is sure to write the same text
as ``json``: no number that could be an integer beyond 64 bits or a float below 1e-4 or from 1e16 in
magnitude, no ``\\u`` escape of a surrogate, and no nesting orjson refuses. ``_may_differ`` spots those in
the instance's text (conservatively: a match inside a string only costs the ``json`` path).
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Callable, Generator, Iterable, Iterator
from itertools import repeat
from typing import Any, NamedTuple

from analyzer.addresses import resource_address
from analyzer.gcpause import gc_paused
from analyzer.staterows import STATE_VERSION, InstanceRow, OutputRow

try:
    import orjson
except ImportError:  # json alone writes every piece; orjson only makes it faster
    orjson = None  # type: ignore[assignment]

__all__ = ["ASSEMBLY_FORMAT", "AssemblyRow", "assemble_state", "header_prefix", "resource_core", "row_order",
           "stream_state"]

# The layout of the text ``stream_state`` writes. An assembly cached under one number is spliced into the
# next version's (``analyzer.state_splice``) only while the number is the same, so any change to what
# ``stream_state`` writes for given rows must come with a new number.
ASSEMBLY_FORMAT = 1

# Terraform's instanceObjectStateV4 field order, so an assembled state reads like one Terraform wrote.
_INSTANCE_FIELD_ORDER = (
    "index_key",
    "status",
    "deposed",
    "schema_version",
    "attributes",
    "attributes_flat",
    "sensitive_attributes",
    "identity_schema_version",
    "identity",
    "private",
    "dependencies",
    "create_before_destroy",
)
# Go's encoding/json escapes these inside strings. None of them can occur outside a JSON string, so a plain
# replacement in the encoded text (one character each, so piece by piece as well as on the whole file)
# escapes them exactly where Terraform would.
_GO_ESCAPES = (
    (b"<", b"\\u003c"),
    (b">", b"\\u003e"),
    (b"&", b"\\u0026"),
    ("\u2028".encode(), b"\\u2028"),
    ("\u2029".encode(), b"\\u2029"),
)
_ASCII_GO_ESCAPES = _GO_ESCAPES[:3]
_LINE_SEPARATOR_LEAD = b"\xe2"  # the first byte of U+2028 and U+2029 in UTF-8
# Text where orjson's numbers or escapes could differ from json's: a run of 16 digits (an integer beyond
# 64 bits, or a float of 1e16 and more in plain notation), a plain decimal below 1e-3, a number with an
# exponent, a surrogate escape. Postgres writes jsonb numbers in plain notation, so its text needs no
# exponent check (``plain_numbers``), which would match many hexadecimal identifiers.
_MAY_DIFFER = re.compile(r"[0-9]{16}|0\.000|[0-9][eE][-+]?[0-9]|\\u[dD][89abAB]")
_MAY_DIFFER_PLAIN = re.compile(r"[0-9]{16}|0\.000|\\u[dD][89abAB]")
# The same tests on UTF-8 text without a regular expression per instance: a run of 16 digits is a run of
# 16 zeros once every digit reads as a zero, the others are plain substrings (the surrogate test runs
# only where a ``\u`` escape is).
_DIGITS_AS_ZEROS = bytes.maketrans(b"123456789", b"000000000")
_SIXTEEN_DIGITS = b"0" * 16
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abAB]")
_EXPONENT = re.compile(rb"[0-9][eE][-+]?[0-9]")
# A piece's size: a reader that keeps every piece (a first GET, until its cache write) also has the one being
# written and its escaped copy, which stay small beside them at this size.
_PIECE_BYTES = 1 << 18
_RUN_ROWS = 500  # instances of one resource encoded together
_ORDERS_KEPT = 64  # distinct field sets whose order an encoder remembers
_INSTANCE_FIELDS = frozenset(_INSTANCE_FIELD_ORDER)
_INSTANCE_JSON = operator.attrgetter("instance_json")
_INDEX_KEY = operator.attrgetter("index_key")
_DEPOSED = operator.attrgetter("deposed")
_GET_INDEX_KEY = operator.methodcaller("get", "index_key")
_GET_DEPOSED = operator.methodcaller("get", "deposed")
# orjson writes items in an array nested four deep at an instance item's depth: each after
# _INSTANCE_INDENT, joined by ",", between these.
_NESTED_OPEN = b"[\n  [\n    [\n      ["
_NESTED_CLOSE = b"\n      ]\n    ]\n  ]\n]"
_INSTANCE_INDENT = b"\n        "  # an instance object is an item of an array four levels down
_RESOURCE_INDENT = b"\n    "
# The text around the resources: a file is the header, RESOURCES_OPEN, the resource cores joined by
# RESOURCE_SEP, then CLOSE_TAIL (or, without resources, EMPTY_TAIL). A core is a resource object without
# its closing: its head up to ``"instances": [`` and its instance items joined by ",".
RESOURCES_OPEN = b',\n  "resources": ['
RESOURCE_SEP = b"\n      ]\n    },"
CHECK_TAIL = b'\n  "check_results": null\n}\n'
CLOSE_TAIL = b"\n      ]\n    }\n  ]," + CHECK_TAIL
EMPTY_TAIL = b"]," + CHECK_TAIL


class AssemblyRow(NamedTuple):
    """What the assembly reads of one instance object's row: its resource, its key and its object's JSON
    text (UTF-8 bytes, or str). ``stream_state`` takes these or ``InstanceRow``s alike."""

    module: str
    mode: str
    type: str
    name: str
    address: str
    index_key: int | str | None
    deposed: str
    provider: str
    instance_json: str | bytes


def row_order(row: InstanceRow) -> tuple[str, str, str, str, int, int, str, str]:
    """The order of rows in an assembled state: resources by module, mode, type and name; instances by key
    (none, then integers, then strings), the current object before deposed ones."""
    return (row.module, row.mode, row.type, row.name, *_instance_order(row))


def assemble_state(
    *,
    serial: int,
    lineage: str,
    terraform_version: str,
    instances: Iterable[InstanceRow],
    outputs: Iterable[OutputRow],
) -> bytes:
    """Build a v4 state file from rows in any order, ordered, indented and escaped the way Terraform writes
    one. Resources without rows are not written (Terraform prunes them).

    Raises ValueError when rows contradict each other: one resource with two providers, an
    (address, deposed) pair given twice, or an ``instance_json`` whose key or deposed field disagrees with
    its row.
    """
    with gc_paused():
        rows = sorted(instances, key=row_order)
        kept_outputs = list(outputs)
        fields: dict[str, Any] = {"serial": serial, "lineage": lineage, "terraform_version": terraform_version}
        try:
            return b"".join(stream_state(**fields, instances=rows, outputs=kept_outputs))
        except UnicodeEncodeError:
            # Only a lone surrogate gets here; escaping all non-ASCII beats writing invalid UTF-8.
            return b"".join(stream_state(**fields, instances=rows, outputs=kept_outputs, ensure_ascii=True))


def stream_state(
    *,
    serial: int,
    lineage: str,
    terraform_version: str,
    instances: Iterable[InstanceRow] | Iterable[AssemblyRow],
    outputs: Iterable[OutputRow],
    ensure_ascii: bool = False,
    plain_numbers: bool = False,
    piece_bytes: int = _PIECE_BYTES,
) -> Generator[bytes, None, None]:
    """The state file ``assemble_state`` builds, as pieces of about ``piece_bytes`` each, from rows already
    sorted by ``row_order`` and consumed one at a time.

    ``plain_numbers`` says no instance text writes a number with an exponent (Postgres's jsonb text).
    Raises ValueError as ``assemble_state`` does, and also for rows out of order; UnicodeEncodeError for
    a lone surrogate unless ``ensure_ascii``. A caller that sent some pieces already must treat either as
    a failed file.
    """
    encoder = _Encoder(ensure_ascii=ensure_ascii, plain_numbers=plain_numbers)
    header = {
        "version": STATE_VERSION,
        "terraform_version": terraform_version,
        "serial": serial,
        "lineage": lineage,
        "outputs": {o.name: _output_object(o) for o in sorted(outputs, key=_output_name)},
    }
    out = bytearray(encoder.dump(header)[:-2])  # without the closing "\n}"
    out += RESOURCES_OPEN
    group: tuple[str, str, str, str] | None = None
    provider = ""
    previous: tuple[int, int, str, str] | None = None
    run: list[InstanceRow | AssemblyRow] = []  # the current resource's rows not yet encoded
    continued = False  # whether some of the current resource's instances are written already
    rows: Iterator[InstanceRow | AssemblyRow] = iter(instances)
    try:
        for row in rows:
            key = (row.module, row.mode, row.type, row.name)
            index_key = row.index_key
            order = (1, index_key, "", row.deposed) if type(index_key) is int else _instance_order(row)
            if key != group:
                if run:
                    out += encoder.items(run, continued)
                    run = []
                if group is not None:
                    if key < group:
                        raise ValueError(f"{resource_address(*key)}: rows are not in the state's resource order")
                    out += RESOURCE_SEP
                group, provider, previous, continued = key, row.provider, None, False
                out += _RESOURCE_INDENT
                out += _resource_head(row, encoder)
            elif row.provider != provider:
                out += encoder.items(run, continued)  # the rows before fail first, as one at a time would
                raise ValueError(f"{resource_address(*key)} has instances with two providers: {provider} and "
                                 f"{row.provider}")
            if previous is not None and order <= previous:
                out += encoder.items(run, continued)
                if order == previous:
                    raise ValueError(f"{row.address} (deposed {row.deposed!r}) appears twice among the rows")
                raise ValueError(f"{row.address}: rows are not in the state's instance order")
            previous = order
            run.append(row)
            if len(run) >= _RUN_ROWS:
                out += encoder.items(run, continued)
                run, continued = [], True
                if len(out) >= piece_bytes:
                    yield _go_escaped(out)
                    out = bytearray()
    except BaseException:
        # A generator of rows (a database cursor) is closed as the error leaves, not when the error's
        # traceback goes: the caller may end its transaction first.
        close = getattr(rows, "close", None)
        if close is not None:
            close()
        raise
    if run:
        out += encoder.items(run, continued)
    out += CLOSE_TAIL if group is not None else EMPTY_TAIL
    yield _go_escaped(out)


class _Encoder:
    """One value in, ``json.dumps(value, indent=2)`` out (as UTF-8, or ASCII with ``ensure_ascii``), by
    orjson where it writes the same text."""

    __slots__ = ("ensure_ascii", "may_differ", "orders")

    def __init__(self, *, ensure_ascii: bool, plain_numbers: bool) -> None:
        self.ensure_ascii = ensure_ascii
        # An instance's keys -> Terraform's order of them, and what reads its values in that order.
        self.orders: dict[tuple[str, ...], tuple[tuple[str, ...], Callable[[dict[str, Any]], tuple[Any, ...]]]] = {}
        self.may_differ = None if orjson is None or ensure_ascii else (
            _MAY_DIFFER_PLAIN if plain_numbers else _MAY_DIFFER)

    def load(self, text: str | bytes) -> tuple[Any, bool]:
        """The value of ``text``, and whether orjson may encode it."""
        if self.may_differ is not None and not self._differs(text):
            try:
                return orjson.loads(text), True
            except orjson.JSONDecodeError:  # nested too deeply for orjson: json decides
                pass
        return json.loads(text), False

    def _differs(self, text: str | bytes) -> bool:
        """``may_differ.search(text)``, without the regular expression's cost on UTF-8 text."""
        assert self.may_differ is not None
        if isinstance(text, str):
            return self.may_differ.search(text) is not None
        if b"0.000" in text or (b"\\u" in text and _SURROGATE_ESCAPE.search(text) is not None):
            return True
        if self.may_differ is _MAY_DIFFER and _EXPONENT.search(text) is not None:
            return True
        return _SIXTEEN_DIGITS in text.translate(_DIGITS_AS_ZEROS)

    def dump(self, value: Any, fast: bool = False) -> bytes:
        if fast:
            try:
                return orjson.dumps(value, option=orjson.OPT_INDENT_2)
            except orjson.JSONEncodeError:
                pass
        return json.dumps(value, indent=2, ensure_ascii=self.ensure_ascii).encode()

    def items(self, rows: list[InstanceRow | AssemblyRow], continued: bool) -> bytes:
        """The instance items of ``rows`` (one resource's, in order) as ``stream_state`` writes them: each
        indented to its depth, joined by ",", after a "," when ``continued``. By one orjson call each way
        for all of them when the text allows it, else one instance at a time."""
        with gc_paused():  # the run's trees are acyclic and freed by reference counting
            text = self._bulk(rows) if self.may_differ is not None and len(rows) > 1 else None
            if text is None:
                text = b",".join([_INSTANCE_INDENT + self.instance(row).replace(b"\n", _INSTANCE_INDENT)
                                  for row in rows])
        return b"," + text if continued else text

    def _bulk(self, rows: list[InstanceRow | AssemblyRow]) -> bytes | None:
        """``items`` of UTF-8 rows by orjson alone, the objects written in one call as an array nested to
        the items' depth, so orjson indents them; None where the one-at-a-time path must decide (a text
        that may differ, a str text, nesting orjson refuses)."""
        texts = list(map(_INSTANCE_JSON, rows))
        try:
            joined = b",".join(texts)
        except TypeError:  # str texts
            return None
        if self._differs(joined):  # the separator cannot complete a match across two texts
            return None
        try:
            ordered = self._ordered_run(rows, joined)
            if ordered is None:  # one at a time, which raises what is wrong with a row
                loads = orjson.loads
                ordered = [self.ordered(row, loads(text)) for row, text in zip(rows, texts, strict=True)]
            return orjson.dumps([[[ordered]]], option=orjson.OPT_INDENT_2)[len(_NESTED_OPEN):-len(_NESTED_CLOSE)]
        except (orjson.JSONDecodeError, orjson.JSONEncodeError):
            return None

    def _ordered_run(self, rows: list[InstanceRow | AssemblyRow], joined: bytes) -> list[dict[str, Any]] | None:
        """What ``ordered`` gives for each of ``rows``, whose texts joined by "," are ``joined``, by one parse
        and a few C loops over the run rather than Python calls per instance: for runs whose objects agree
        with their rows and share one field set (as a resource's instances do). None otherwise."""
        instances = orjson.loads(b"[" + joined + b"]")
        count = len(rows)
        if len(instances) != count or not all(map(dict.__instancecheck__, instances)):
            return None
        if list(map(_GET_INDEX_KEY, instances)) != list(map(_INDEX_KEY, rows)):
            return None
        got, wanted = list(map(_GET_DEPOSED, instances)), list(map(_DEPOSED, rows))
        if not (got.count(None) == count and wanted.count("") == count) and [d or "" for d in got] != wanted:
            return None
        shapes = list(map(tuple, instances))
        if shapes.count(shapes[0]) != count:
            return None
        order, values = self._order(shapes[0])
        return list(map(dict, map(zip, repeat(order), map(values, instances))))

    def instance(self, row: InstanceRow | AssemblyRow) -> bytes:
        instance, fast = self.load(row.instance_json)
        return self.dump(self.ordered(row, instance), fast)

    def ordered(self, row: InstanceRow | AssemblyRow, instance: dict[str, Any]) -> dict[str, Any]:
        """``instance`` with its fields in Terraform's order (the ones it does not know after, as they
        come); raises ValueError when its key or deposed field disagrees with the row."""
        if instance.get("index_key") != row.index_key or (instance.get("deposed") or "") != row.deposed:
            raise ValueError(f"{row.address}: instance_json disagrees with the row's index_key or deposed")
        order, values = self._order(tuple(instance))
        return dict(zip(order, values(instance), strict=True))

    def _order(self, keys: tuple[str, ...]) -> tuple[tuple[str, ...], Callable[[dict[str, Any]], tuple[Any, ...]]]:
        """An instance's keys in Terraform's order, and what reads its values in that order."""
        known = self.orders.get(keys)
        if known is None:
            order = tuple(f for f in _INSTANCE_FIELD_ORDER if f in keys) + tuple(
                k for k in keys if k not in _INSTANCE_FIELDS)
            known = (order, _values_in(order))
            if len(self.orders) < _ORDERS_KEPT:
                self.orders[keys] = known
        return known


def _values_in(order: tuple[str, ...]) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    """A function giving an object's values for the keys of ``order``, in that order, as one tuple (one C
    call, where a lookup per key costs a Python call each)."""
    if len(order) > 1:
        return operator.itemgetter(*order)
    return lambda instance: tuple(instance[key] for key in order)  # itemgetter of one key gives no tuple


def _resource_head(row: InstanceRow | AssemblyRow, encoder: _Encoder) -> bytes:
    """A resource object up to the opening of its ``instances`` array, indented as an item of
    ``resources``."""
    head: dict[str, Any] = {}
    if row.module:
        head["module"] = row.module
    head.update(mode=row.mode, type=row.type, name=row.name, provider=row.provider)
    text = encoder.dump(head)[:-2].replace(b"\n", _RESOURCE_INDENT)
    return text + b',\n      "instances": ['


def _go_escaped(text: bytearray) -> bytes:
    data = bytes(text)
    # One byte found by memchr rules out both three-byte separators, whose search costs more.
    for raw, escaped in _GO_ESCAPES if _LINE_SEPARATOR_LEAD in data else _ASCII_GO_ESCAPES:
        if raw in data:
            data = data.replace(raw, escaped)
    return data


def _instance_order(row: InstanceRow | AssemblyRow) -> tuple[int, int, str, str]:
    key = row.index_key
    if key is None:
        return (0, 0, "", row.deposed)
    if isinstance(key, int):
        return (1, key, "", row.deposed)
    return (2, 0, key, row.deposed)


def _output_object(output: OutputRow) -> dict[str, Any]:
    obj: dict[str, Any] = {"value": json.loads(output.value_json), "type": json.loads(output.type_json)}
    if output.sensitive:
        obj["sensitive"] = True
    return obj


def _output_name(output: OutputRow) -> str:
    return output.name


def header_prefix(*, serial: int, lineage: str, terraform_version: str, outputs: Iterable[OutputRow]) -> bytes:
    """The text ``stream_state`` writes before the first resource: the header and ``RESOURCES_OPEN``."""
    text = b"".join(stream_state(serial=serial, lineage=lineage, terraform_version=terraform_version,
                                 instances=(), outputs=outputs))
    if not text.endswith(EMPTY_TAIL):
        raise ValueError("the header does not end as an empty state's does")
    return text[:-len(EMPTY_TAIL)]


_BLANK_PREFIX = header_prefix(serial=0, lineage="", terraform_version="", outputs=())


def resource_core(rows: Iterable[InstanceRow], *, plain_numbers: bool = False) -> bytes:
    """The core ``stream_state`` writes for one resource's rows (in ``row_order``): the same text, since it
    is cut out of ``stream_state``'s own output. Raises ValueError as ``stream_state`` does, and when the
    rows are not of exactly one resource."""
    text = b"".join(stream_state(serial=0, lineage="", terraform_version="", instances=rows, outputs=(),
                                 plain_numbers=plain_numbers))
    if not text.startswith(_BLANK_PREFIX) or not text.endswith(CLOSE_TAIL):
        raise ValueError("no rows for a resource")
    core = text[len(_BLANK_PREFIX):-len(CLOSE_TAIL)]
    if RESOURCE_SEP + _RESOURCE_INDENT + b"{" in core:
        raise ValueError("rows of more than one resource")
    return core

