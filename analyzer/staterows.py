"""The row shapes of a v4 Terraform state and the whole-document parser behind ``analyzer.state``.

Owns the translation of a v4 state body into Kilolock's row shapes: one ``InstanceRow`` per resource
instance object (current or deposed) and one ``OutputRow`` per root output (the reverse, rows into a state
file Terraform reads as its own, is ``analyzer.state_assembly``). Also owns the canonical JSON text and the
content hash that tell a real change from re-serialisation noise.

Must not do I/O or talk to a database, and must not interpret instance attributes: an instance object is
kept whole as canonical JSON so that fields it does not know (``private``, ``identity``, future ones)
survive the round trip. Parsing runs on every state upload, so it stays a single ``json.loads`` plus one
canonical dump per instance.

The one import beyond the standard library, ``orjson``, is optional and only speeds up those canonical
dumps (nearly twice as fast as ``json``'s encoder, the largest single cost of parsing a big state). It must
never change a byte of the canonical text, since ``attributes_hash`` is stored and compared across versions:
orjson writes the same text as ``json`` for every value except integers beyond 64 bits, lone surrogates and
very deep nesting, which it refuses (those values take the ``json`` path), and floats below 1e-4 or
non-finite, which it formats differently (a body holding one is dumped with ``json`` throughout;
``_FloatCheck`` spots them while loading). Without orjson everything runs on ``json``; the tests run both
paths against each other.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeGuard, TypeVar

from analyzer.addresses import (
    AddressError,
    ModuleStep,
    format_module_path,
    is_identifier,
    parse_module_path,
    quote_hcl_string,
    resource_address,
)
from analyzer.values import WholeNumber, json_number, normal_value

try:
    import orjson as orjson  # re-exported: analyzer.state reads whether it is there
except ImportError:  # the json path below is complete on its own; orjson only makes it faster
    orjson = None  # type: ignore[assignment]

T = TypeVar("T")

STATE_VERSION = 4
_SEND_V4 = "send a Terraform state file of format version 4 (what Terraform 0.12 and later write)"
_MODES = frozenset({"managed", "data"})
_STATUSES = frozenset({"", "tainted"})
_DEPOSED_KEY_LENGTH = 8

_encode_canonical = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
).encode
# Lone surrogates (legal in JSON text as "\ud800") cannot be encoded as UTF-8; escaping them keeps the text
# lossless and storable, and only the rare object that holds one pays for it.
_encode_canonical_ascii = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
).encode
# orjson writes a float with Python's repr digits, but switches to exponent notation at 1e-5 rather than 1e-4
# and does not pad the exponent to two digits ("1e-7" where repr writes "1e-07"): below this magnitude (and
# for infinities, which it writes as null) its text differs.
_ORJSON_FLOAT_MIN = 1e-4
_FLOAT_MAX = sys.float_info.max

_Canonical = Callable[[object], tuple[str, bytes]]

class StateFormatError(ValueError):
    """An uploaded state body that is not a usable v4 state; the message says what is wrong and what to do."""


@dataclass(frozen=True, slots=True)
class InstanceObjectAddress:
    """Which resource instance object a row is about: its instance address with the parts of it, and its
    deposed key ("" for the current object). The columns a parsed row and a stored lifecycle share."""

    address: str
    resource_address: str
    module: str
    mode: str
    type: str
    name: str
    index_key: int | str | None
    deposed: str


@dataclass(frozen=True, slots=True)
class InstanceRow(InstanceObjectAddress):
    """One resource instance object: the current object of an instance, or one of its deposed objects."""

    provider: str
    instance_json: str
    attributes_hash: str
    dependencies: tuple[str, ...]
    status: str


@dataclass(frozen=True, slots=True)
class OutputRow:
    """One root module output value, with its value and cty type kept as canonical JSON text."""

    name: str
    value_json: str
    type_json: str
    sensitive: bool


@dataclass(frozen=True, slots=True)
class ParsedState:
    """A v4 state split into rows; ``instances`` keep the order of the state file."""

    serial: int
    lineage: str
    terraform_version: str
    instances: tuple[InstanceRow, ...]
    outputs: tuple[OutputRow, ...]


@dataclass(frozen=True, slots=True)
class EncryptedState:
    """An OpenTofu encrypted state envelope: only its serial and lineage are readable."""

    serial: int
    lineage: str


def canonical_json(value: object) -> str:
    """Compact JSON with sorted keys and raw Unicode, numbers in ``analyzer.values``' canonical form:
    equal values always give equal text.

    Raises ValueError for values JSON cannot hold (NaN, infinities).
    """
    text, _ = _canonical(normal_value(value))
    return text


def _parse_state(raw: bytes, *, accelerated: bool) -> ParsedState | EncryptedState:
    floats = _FloatCheck()
    doc = _load(raw, floats)
    canonical = _canonical_accelerated if accelerated and floats.orjson_safe else _canonical
    if "version" not in doc:
        if "encrypted_data" in doc and "encryption_version" in doc:
            return _parse_envelope(doc)
        raise _invalid('the state has no "version" field')
    version = doc["version"]
    if type(version) is not int or version != STATE_VERSION:
        hint = " (written by Terraform 0.11 or older: run `terraform state pull` with Terraform 0.12+ first)"
        raise StateFormatError(
            f"the state has format version {version!r}, which Kilolock does not read"
            f"{hint if version in (1, 2, 3) else ''}; {_SEND_V4}"
        )
    serial = _serial(doc)
    lineage = _lineage(doc)
    terraform_version = doc.get("terraform_version", "")
    if not isinstance(terraform_version, str):
        raise _invalid(f'"terraform_version" must be a string, not {_kind(terraform_version)}')
    return ParsedState(
        serial=serial,
        lineage=lineage,
        terraform_version=terraform_version,
        instances=_parse_resources(doc.get("resources"), canonical),
        outputs=_parse_outputs(doc.get("outputs"), canonical),
    )


def _invalid(problem: str) -> StateFormatError:
    return StateFormatError(f"{problem}; {_SEND_V4}")


def _canonical(value: object) -> tuple[str, bytes]:
    text = _encode_canonical(value)
    try:
        return text, text.encode()
    except UnicodeEncodeError:
        text = _encode_canonical_ascii(value)
        return text, text.encode()


def _canonical_accelerated(value: object) -> tuple[str, bytes]:
    """``_canonical`` written by orjson: the same text, byte for byte, for a value whose floats are all at
    least ``_ORJSON_FLOAT_MIN`` in magnitude (or zero) and finite, as ``_FloatCheck`` guarantees for a loaded
    body. What orjson refuses (integers beyond 64 bits, lone surrogates, deep nesting) takes ``_canonical``.
    """
    try:
        data = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        return _canonical(value)
    return data.decode(), data


class _FloatCheck:
    """The ``parse_float`` hook of ``_load``: converts numbers into the canonical form of
    ``analyzer.values`` (``1.0`` is the integer 1, so a value reads the same whoever wrote it) and notes
    whether every float kept in the body is one orjson writes the same way as json (see
    ``_ORJSON_FLOAT_MIN``).
    """

    __slots__ = ("orjson_safe",)

    def __init__(self) -> None:
        self.orjson_safe = True

    def __call__(self, text: str) -> int | float:
        value = json_number(text)
        if type(value) is float and value and not _ORJSON_FLOAT_MIN <= abs(value) <= _FLOAT_MAX:
            self.orjson_safe = False
        return value


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON value")


def _load(raw: bytes, floats: _FloatCheck) -> dict[str, Any]:
    try:
        doc = json.loads(raw, parse_constant=_reject_constant, parse_float=floats)
    except RecursionError as exc:
        raise _invalid("the state is nested too deeply to read") from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError and int-size limits all land here
        raise _invalid(f"the state is not valid JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise _invalid(f"the state must be a JSON object, not {_kind(doc)}")
    return doc


def _usable_serial(value: object) -> TypeGuard[int]:
    """A serial a state may carry: a non-negative integer (not a boolean, not a float)."""
    return type(value) is int and value >= 0


def _usable_lineage(value: object) -> TypeGuard[str]:
    """A lineage a state may carry: a non-empty string."""
    return isinstance(value, str) and bool(value)


def _required(doc: dict[str, Any], key: str, usable: Callable[[object], TypeGuard[T]], what: str) -> T:
    value = doc.get(key)
    if not usable(value):
        found = "missing" if value is None else f"{value!r}"
        raise _invalid(f'the state\'s "{key}" must be {what}, but it is {found}')
    return value


def _serial(doc: dict[str, Any]) -> int:
    return _required(doc, "serial", _usable_serial, "a non-negative integer")


def _lineage(doc: dict[str, Any]) -> str:
    return _required(doc, "lineage", _usable_lineage, "a non-empty string")


def _parse_envelope(doc: dict[str, Any]) -> EncryptedState:
    serial = doc.get("serial")
    lineage = doc.get("lineage")
    if not (_usable_serial(serial) and _usable_lineage(lineage)):
        raise StateFormatError(
            "the encrypted state envelope has no usable serial and lineage, so it cannot be stored safely; "
            "use an OpenTofu release that writes them beside encrypted_data, or send an unencrypted "
            "state file of format version 4"
        )
    return EncryptedState(serial=serial, lineage=lineage)


def _parse_outputs(outputs: object, canonical: _Canonical) -> tuple[OutputRow, ...]:
    if outputs is None:
        return ()
    if not isinstance(outputs, dict):
        raise _invalid(f'"outputs" must be an object, not {_kind(outputs)}')
    rows = []
    for name, output in outputs.items():
        if not isinstance(output, dict) or "value" not in output or "type" not in output:
            raise _invalid(f'output "{name}" must be an object with "value" and "type"')
        sensitive = output.get("sensitive", False)
        if not isinstance(sensitive, bool):
            raise _invalid(f'output "{name}" has a non-boolean "sensitive" ({sensitive!r})')
        rows.append(
            OutputRow(
                name=name,
                value_json=_canonical_or_fail(output["value"], f'output "{name}"', canonical),
                type_json=_canonical_or_fail(output["type"], f'output "{name}"', canonical),
                sensitive=sensitive,
            )
        )
    return tuple(rows)


def _parse_resources(resources: object, canonical: _Canonical) -> tuple[InstanceRow, ...]:
    if resources is None:
        return ()
    if not isinstance(resources, list):
        raise _invalid(f'"resources" must be a list, not {_kind(resources)}')
    modules: dict[str, str] = {"": ""}
    seen: set[tuple[str, str]] = set()
    rows: list[InstanceRow] = []
    for position, resource in enumerate(resources):
        if not isinstance(resource, dict):
            raise _invalid(f"resources[{position}] must be an object, not {_kind(resource)}")
        rows.extend(_parse_resource(position, resource, modules, seen, canonical))
    return tuple(rows)


def _parse_resource(
    position: int, resource: dict[str, Any], modules: dict[str, str], seen: set[tuple[str, str]],
    canonical: _Canonical,
) -> list[InstanceRow]:
    header = _resource_header(position, resource, modules)
    instances = resource.get("instances")
    if instances is None:
        return []
    if not isinstance(instances, list):
        raise _invalid(f'{header.where} has "instances" that is {_kind(instances)}, not a list')
    return [_instance_row(header, instance, seen, canonical) for instance in instances]


@dataclass(frozen=True, slots=True)
class _ResourceHeader:
    """A resource element's checked fields, shared by the rows of its instances."""

    where: str
    res_address: str
    module: str
    mode: str
    type: str
    name: str
    provider: str
    hash_tail: bytes


def _resource_header(position: int, resource: dict[str, Any], modules: dict[str, str]) -> _ResourceHeader:
    where = f"resources[{position}]"
    mode = resource.get("mode")
    type_ = resource.get("type")
    name = resource.get("name")
    provider = resource.get("provider")
    if mode not in _MODES:
        raise _invalid(f'{where} has mode {mode!r}; it must be "managed" or "data"')
    if not isinstance(type_, str) or not is_identifier(type_):
        raise _invalid(f"{where} has an invalid type {type_!r}")
    if not isinstance(name, str) or not is_identifier(name):
        raise _invalid(f"{where} has an invalid name {name!r}")
    if mode == "managed" and type_ in ("module", "data"):
        raise _invalid(f"{where} is a managed resource of reserved type {type_!r}")
    if not isinstance(provider, str) or not provider:
        raise _invalid(f'{where} ({type_}.{name}) has no "provider" string')
    module = _module(resource.get("module", ""), where, modules)
    return _ResourceHeader(where, resource_address(module, mode, type_, name), module, mode, type_, name,
                           provider, _hash_tail(mode, module, name, provider, type_))


# The hash covers {"instance", "mode", "module", "name", "provider", "type"} as canonical JSON; sorted,
# "instance" comes first, so the resource part is one shared tail and each instance is hashed without
# building (or re-serialising) a wrapper object. The tail's text around the name is the same for every
# resource of one type, provider and module (most of a large state): kept here, a bounded number of them.
_TAIL_PARTS: dict[tuple[str, str, str, str], tuple[bytes, bytes]] = {}
_TAIL_PARTS_MAX = 1024
_NAME_SLOT = ',"name":"",'


def _hash_tail(mode: str, module: str, name: str, provider: str, type_: str) -> bytes:
    """``,"mode":…,"module":…,"name":…,"provider":…,"type":…}``: the resource's fields as canonical JSON,
    without the opening brace. ``name`` is an identifier (checked), so its JSON is the name in quotes, and
    in the rest of the text, strings whose quotes are escaped, the slot for it occurs only once."""
    key = (mode, module, provider, type_)
    parts = _TAIL_PARTS.get(key)
    if parts is None:
        # Every field is a string here, which is already canonical: no normal_value pass.
        canonical = _canonical if orjson is None else _canonical_accelerated
        fields = {"mode": mode, "module": module, "name": "", "provider": provider, "type": type_}
        before, slot, after = ("," + canonical(fields)[0][1:]).partition(_NAME_SLOT)
        if not slot:  # never, by the reasoning above: the whole text then, as it is
            fields["name"] = name
            return ("," + canonical(fields)[0][1:]).encode()
        if len(_TAIL_PARTS) >= _TAIL_PARTS_MAX:
            _TAIL_PARTS.clear()
        parts = _TAIL_PARTS[key] = ((before + ',"name":"').encode(), ('",' + after).encode())
    return parts[0] + name.encode() + parts[1]


def _instance_row(
    header: _ResourceHeader, instance: object, seen: set[tuple[str, str]], canonical: _Canonical
) -> InstanceRow:
    res_address = header.res_address
    if type(instance) is not dict:
        raise _invalid(f"{res_address} has an instance that is {_kind(instance)}")
    key = instance.get("index_key")
    if key is None:
        address = res_address
    elif type(key) is int:
        address = f"{res_address}[{key}]"
    elif type(key) is str:
        address = f"{res_address}[{quote_hcl_string(key)}]"
    elif isinstance(key, WholeNumber):
        # Go reads every JSON number as float64, so Terraform accepts 1.0 as the key [1]; so do we.
        key = int(key)
        address = f"{res_address}[{key}]"
    else:
        raise _invalid(f"{res_address} has an instance with the invalid index_key {key!r}")
    deposed = instance.get("deposed")
    if deposed is None:
        deposed = ""
    elif type(deposed) is not str or (deposed and len(deposed) != _DEPOSED_KEY_LENGTH):
        raise _invalid(f"{address} has a malformed deposed key {deposed!r}")
    status = instance.get("status")
    if status is None:
        status = ""
    elif status not in _STATUSES:
        raise _invalid(f'{address} has status {status!r}; only "tainted" is valid')
    identity = (address, deposed)
    if identity in seen:
        which = f"deposed object {deposed}" if deposed else "current object"
        raise _invalid(f"{address} has its {which} twice in the state")
    seen.add(identity)
    text, data = _canonical_instance(instance, address, canonical)
    # Positional, in field order: a keyword call costs a third more, which shows at 50,000 instances.
    return InstanceRow(
        address, res_address, header.module, header.mode, header.type, header.name, key, deposed,
        header.provider, text, _sha256(b'{"instance":' + data + header.hash_tail).hexdigest(),
        _dependencies(instance.get("dependencies"), address),
        status,
    )


_sha256 = hashlib.sha256


def _module(raw: object, where: str, modules: dict[str, str]) -> str:
    if not isinstance(raw, str):
        raise _invalid(f'{where} has a "module" that is {_kind(raw)}, not a string')
    module = modules.get(raw)
    if module is None:
        try:
            steps: tuple[ModuleStep, ...] = parse_module_path(raw)
        except AddressError as exc:
            raise _invalid(f"{where} has an invalid module address: {exc}") from exc
        module = modules[raw] = format_module_path(steps)
    return module


def _dependencies(raw: object, address: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if type(raw) is not list or not all(type(dependency) is str for dependency in raw):
        raise _invalid(f'{address} has "dependencies" that is not a list of strings')
    return tuple(raw)


# Instance metadata Terraform writes or leaves out depending on how it reached the state: a
# sliced apply's local state drops ``identity_schema_version: 0`` that an HTTP-backend apply
# kept, for instance. Terraform reads an absent key exactly like these empty values, so they
# are dropped before hashing and storing; otherwise a re-serialised no-op would look changed.
_EMPTY_METADATA: dict[str, tuple[object, ...]] = {
    "sensitive_attributes": ([],), "private": ("", None), "dependencies": ([], None),
    "create_before_destroy": (False, None), "status": ("", None), "identity": ({}, None),
}


_EMPTY_METADATA_ITEMS = tuple(_EMPTY_METADATA.items())


def normalize_instance(instance: dict[str, Any]) -> dict[str, Any]:
    """The instance without metadata keys whose value means the same as their absence, and with the lists
    Terraform reads as sets (``_SET_METADATA``) in sorted order."""
    # A copy made only when a key goes, and no comprehensions: this runs once per instance of every upload.
    kept = None
    for key, empty in _EMPTY_METADATA_ITEMS:
        if key in instance and instance[key] in empty:
            if kept is None:
                kept = instance.copy()
            del kept[key]
    if "identity_schema_version" in instance and not instance.get("identity") \
            and instance["identity_schema_version"] in (0, None):
        if kept is None:
            kept = instance.copy()
        del kept["identity_schema_version"]
    for key in _SET_METADATA:
        items = instance.get(key)
        if type(items) is list and len(items) > 1:
            keys = [_set_order(item) for item in items]
            if any(a > b for a, b in zip(keys, keys[1:], strict=False)):
                if kept is None:
                    kept = instance.copy()
                kept[key] = [item for _, item in sorted(zip(keys, items, strict=True), key=lambda pair: pair[0])]
    return instance if kept is None else kept


# Lists Terraform reads as sets: the instance's dependencies and its sensitive attribute paths. Terraform
# writes them sorted; another writer's order means nothing, so they are stored (and hashed) in that order.
_SET_METADATA = ("dependencies", "sensitive_attributes")


def _set_order(item: object) -> str:
    return item if type(item) is str else canonical_json(item)


def _canonical_instance(instance: dict[str, Any], address: str, canonical: _Canonical) -> tuple[str, bytes]:
    try:
        return canonical(normalize_instance(instance))
    except ValueError as exc:  # an out-of-range number such as 1e999 parsed as infinity
        raise _invalid(f"{address} holds a value JSON cannot carry ({exc})") from exc


def _canonical_or_fail(value: object, where: str, canonical: _Canonical) -> str:
    try:
        return canonical(value)[0]
    except ValueError as exc:
        raise _invalid(f"{where} holds a value JSON cannot carry ({exc})") from exc


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"
