"""The streamed assembly writes exactly the bytes of one ``json.dumps`` over the whole document.

The reference below builds the document as one tree and dumps it at once (how states were assembled
before they were streamed); every shape of value, key, module and instance must come out byte for byte
the same, with orjson and without it, in pieces of any size.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from analyzer import state_assembly
from analyzer.state import InstanceRow, OutputRow, ParsedState, parse_state
from analyzer.state_assembly import AssemblyRow, assemble_state, row_order, stream_state

_FIELDS = ("index_key", "status", "deposed", "schema_version", "attributes", "attributes_flat",
           "sensitive_attributes", "identity_schema_version", "identity", "private", "dependencies",
           "create_before_destroy")


def _reference(parsed: ParsedState, instances: list[InstanceRow] | None = None) -> bytes:
    groups: dict[tuple[str, str, str, str], list[InstanceRow]] = {}
    for row in instances if instances is not None else parsed.instances:
        groups.setdefault((row.module, row.mode, row.type, row.name), []).append(row)
    resources = []
    for (module, mode, type_, name), rows in sorted(groups.items()):
        rows.sort(key=row_order)
        resource: dict[str, Any] = {"module": module} if module else {}
        resource.update(mode=mode, type=type_, name=name, provider=rows[0].provider)
        objects = []
        for row in rows:
            instance = json.loads(row.instance_json)
            ordered = {f: instance[f] for f in _FIELDS if f in instance}
            ordered.update(instance)
            objects.append(ordered)
        resource["instances"] = objects
        resources.append(resource)
    outputs = {}
    for o in sorted(parsed.outputs, key=lambda o: o.name):
        outputs[o.name] = {"value": json.loads(o.value_json), "type": json.loads(o.type_json)}
        if o.sensitive:
            outputs[o.name]["sensitive"] = True
    doc = {"version": 4, "terraform_version": parsed.terraform_version, "serial": parsed.serial,
           "lineage": parsed.lineage, "outputs": outputs, "resources": resources, "check_results": None}
    text = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    for raw, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                         ("\u2029", "\\u2029")):
        text = text.replace(raw, escaped)
    return text.encode()


_AWKWARD = [None, True, False, 0, -1, 2**63 - 1, -(2**63), 2**64 + 7, 10**30, 1.5, -0.25, 1e-7, 0.00005,
            0.0001, 1e16, 1.2345678901234567e300, "", "plain", "üñí©ødé ✓ 😀", "<b>&amp;</b>", "\u2028\u2029",
            "".join(chr(c) for c in range(0x20)) + "\x7f\"\\/", "3e5 a1e-4 0.0001", [], {}, [[[]]], {"": {}},
            {"z": 1, "a": [1, {"b": None}], "m": {"k": "v"}}, list(range(5))]


def _state() -> dict[str, Any]:
    def instance(key: object, attrs: dict[str, Any], **extra: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"schema_version": 0, "attributes": attrs, "sensitive_attributes": [], **extra}
        return body if key is None else {"index_key": key, **body}

    values = {f"v{i}": v for i, v in enumerate(_AWKWARD)}
    resources = [
        {"mode": "managed", "type": "terraform_data", "name": "solo", "provider": 'provider["x/y"]',
         "instances": [instance(None, {"id": "1", "input": values})]},
        {"module": "module.net[\"a\"]", "mode": "managed", "type": "terraform_data", "name": "per",
         "provider": 'provider["x/y"]',
         "instances": [instance(k, {"id": str(k), "v": v})
                       for k, v in zip(["b", "a", "é", "<"], _AWKWARD[:4], strict=True)]},
        {"mode": "managed", "type": "terraform_data", "name": "count", "provider": 'provider["x/y"]',
         "instances": [instance(i, {"id": str(i), "v": v}, dependencies=["terraform_data.solo"])
                       for i, v in zip([10, 2, 0, 1], _AWKWARD[5:9], strict=True)]
                      + [instance(2, {"id": "old"}, deposed="00000001", status="tainted")]},
        {"mode": "data", "type": "terraform_data", "name": "d", "provider": 'provider["x/y"]',
         "instances": [instance(None, {"deep": {"a": [{"b": [{"c": _AWKWARD}]}]}})]},
    ]
    outputs = {f"o{i}": {"value": v, "type": "dynamic", **({"sensitive": True} if i % 3 == 0 else {})}
               for i, v in enumerate(_AWKWARD)}
    return {"version": 4, "terraform_version": "1.15.5", "serial": 7, "lineage": "lin-é", "outputs": outputs,
            "resources": resources}


def _parsed() -> ParsedState:
    parsed = parse_state(json.dumps(_state()).encode())
    assert isinstance(parsed, ParsedState)
    return parsed


def _streamed(parsed: ParsedState, **options: Any) -> bytes:
    rows = sorted(parsed.instances, key=row_order)
    return b"".join(stream_state(serial=parsed.serial, lineage=parsed.lineage,
                                 terraform_version=parsed.terraform_version, instances=rows,
                                 outputs=parsed.outputs, **options))


@pytest.mark.parametrize("accelerated", [True, False])
@pytest.mark.parametrize("piece_bytes", [1, 700, 1 << 20])
def test_streamed_assembly_is_byte_for_byte_the_whole_document_dump(
        monkeypatch: pytest.MonkeyPatch, accelerated: bool, piece_bytes: int) -> None:
    if not accelerated:
        monkeypatch.setattr(state_assembly, "orjson", None)
    parsed = _parsed()
    assert _streamed(parsed, piece_bytes=piece_bytes) == _reference(parsed)


def test_postgres_style_text_takes_the_fast_path_only_where_it_writes_the_same() -> None:
    parsed = _parsed()
    # jsonb writes plain numbers and sorts keys by length: the text Postgres hands the assembly.
    plain = [replace(row, instance_json=_jsonb_like(json.loads(row.instance_json))) for row in parsed.instances]
    expected = _reference(parsed, plain)
    got = b"".join(stream_state(serial=parsed.serial, lineage=parsed.lineage,
                                terraform_version=parsed.terraform_version, instances=sorted(plain, key=row_order),
                                outputs=parsed.outputs, plain_numbers=True))
    assert got == expected


@pytest.mark.parametrize("plain_numbers", [True, False])
def test_rows_with_utf8_text_assemble_as_instance_rows_do(plain_numbers: bool) -> None:
    parsed = _parsed()
    rows = sorted(parsed.instances, key=row_order)
    if plain_numbers:
        rows = [replace(row, instance_json=_jsonb_like(json.loads(row.instance_json))) for row in rows]
    lean = [AssemblyRow(r.module, r.mode, r.type, r.name, r.address, r.index_key, r.deposed, r.provider,
                        r.instance_json.encode()) for r in rows]
    common: dict[str, Any] = {"serial": parsed.serial, "lineage": parsed.lineage,
                              "terraform_version": parsed.terraform_version, "outputs": parsed.outputs,
                              "plain_numbers": plain_numbers}
    assert b"".join(stream_state(instances=lean, **common)) == b"".join(stream_state(instances=rows, **common))


@pytest.mark.parametrize("run_rows", [1, 2, 3, 500])
def test_instances_encoded_together_write_what_one_at_a_time_writes(
        monkeypatch: pytest.MonkeyPatch, run_rows: int) -> None:
    parsed = _parsed()
    many = [replace(parsed.instances[0], address=f"terraform_data.many[{i}]", name="many", index_key=i,
                    instance_json=json.dumps({"index_key": i, "schema_version": 0,
                                              "attributes": {"id": str(i), "v": _AWKWARD[i % 5]}}))
            for i in range(7)]
    rows = sorted([*parsed.instances, *many], key=row_order)
    plain = [replace(row, instance_json=_jsonb_like(json.loads(row.instance_json))) for row in rows]
    lean = [AssemblyRow(r.module, r.mode, r.type, r.name, r.address, r.index_key, r.deposed, r.provider,
                        r.instance_json.encode()) for r in plain]
    monkeypatch.setattr(state_assembly, "_RUN_ROWS", run_rows)
    got = b"".join(stream_state(serial=parsed.serial, lineage=parsed.lineage, piece_bytes=300,
                                terraform_version=parsed.terraform_version, instances=lean,
                                outputs=parsed.outputs, plain_numbers=True))
    assert got == _reference(parsed, plain)


@pytest.mark.parametrize("plain_numbers", [True, False])
def test_the_utf8_fast_path_check_agrees_with_the_pattern(plain_numbers: bool) -> None:
    encoder = state_assembly._Encoder(ensure_ascii=False, plain_numbers=plain_numbers)
    if encoder.may_differ is None:
        pytest.skip("orjson is not installed")
    texts = ["123456789012345", "1234567890123456", "a1234567890123456b", "0.000", "10.0001", "0.001",
             "1e5", "1E+5", "2e-3", "e5", "\\ud800", "\\uD83D", "\\u00e9", "\\ue000", "ü1234567890123456",
             "12345678.12345678", "-0.0001"] + [json.dumps(v, ensure_ascii=False) for v in _AWKWARD]
    for text in texts:
        assert encoder._differs(text.encode()) == (encoder.may_differ.search(text) is not None), text


def _jsonb_like(value: Any) -> str:
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: (len(kv[0].encode()), kv[0].encode()))
        return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {_jsonb_like(v)}" for k, v in items) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_jsonb_like(v) for v in value) + "]"
    if isinstance(value, float):
        return format(value, "f") if abs(value) < 1e16 else str(int(value))
    return json.dumps(value, ensure_ascii=False)


def test_assemble_state_sorts_any_order_into_the_same_bytes() -> None:
    parsed = _parsed()
    shuffled = list(reversed(parsed.instances))
    assert assemble_state(serial=parsed.serial, lineage=parsed.lineage, terraform_version=parsed.terraform_version,
                          instances=shuffled, outputs=parsed.outputs) == _reference(parsed)


def test_an_empty_state_streams_as_terraform_writes_it() -> None:
    empty = ParsedState(serial=1, lineage="l", terraform_version="1.15.5", instances=(), outputs=())
    assert _streamed(empty) == _reference(empty)
    out = ParsedState(serial=1, lineage="l", terraform_version="", instances=(),
                      outputs=(OutputRow(name="a", value_json='"x"', type_json='"string"', sensitive=False),))
    assert _streamed(out) == _reference(out)


def test_rows_out_of_order_are_refused_rather_than_written() -> None:
    rows: list[InstanceRow] = sorted(_parsed().instances, key=row_order)
    common: dict[str, Any] = {"serial": 1, "lineage": "l", "terraform_version": "", "outputs": ()}
    with pytest.raises(ValueError, match="resource order"):
        b"".join(stream_state(instances=[rows[-1], rows[0]], **common))
    counted = [r for r in rows if r.name == "count"]
    with pytest.raises(ValueError, match="instance order"):
        b"".join(stream_state(instances=[counted[1], counted[0]], **common))


def test_rows_are_closed_before_an_error_leaves_the_stream() -> None:
    """A generator of rows (a database cursor) is closed as the error leaves, not when its traceback goes, so
    the cursor is done with before the caller ends the transaction."""
    rows: list[InstanceRow] = sorted(_parsed().instances, key=row_order)
    common: dict[str, Any] = {"serial": 1, "lineage": "l", "terraform_version": "", "outputs": ()}
    closed: list[bool] = []

    def cursor() -> Iterator[InstanceRow]:
        try:
            yield rows[-1]
            yield rows[0]
            yield rows[1]
        finally:
            closed.append(True)

    try:
        b"".join(stream_state(instances=cursor(), **common))
    except ValueError:
        assert closed == [True]
    else:
        raise AssertionError("rows out of order were written")


@pytest.mark.parametrize("accelerated", [True, False])
def test_instances_of_no_field_or_one_field_keep_their_text(monkeypatch: pytest.MonkeyPatch,
                                                            accelerated: bool) -> None:
    if not accelerated:
        monkeypatch.setattr(state_assembly, "orjson", None)
    parsed = _parsed()
    odd = [replace(parsed.instances[0], address=f"terraform_data.{name}", name=name, index_key=None,
                   instance_json=text)
           for name, text in (("bare", "{}"), ("one", '{"schema_version": 0}'), ("two", '{"private": "x", "a": 1}'))]
    rows = sorted([*parsed.instances, *odd], key=row_order)
    got = b"".join(stream_state(serial=parsed.serial, lineage=parsed.lineage,
                                terraform_version=parsed.terraform_version, instances=rows, outputs=parsed.outputs))
    assert got == _reference(parsed, rows)
