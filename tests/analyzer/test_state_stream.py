"""The instance-by-instance reader gives exactly the rows of the whole-document parse, or declines."""

from __future__ import annotations

import json

import pytest

from analyzer import state, statestream
from analyzer.statestream import Unstreamable, stream_state

LINEAGE = "11111111-2222-3333-4444-555555555555"


def _doc(resources: list[dict], **top: object) -> dict:
    return {"version": 4, "terraform_version": "1.15.5", "serial": 3, "lineage": LINEAGE,
            "outputs": {"o": {"value": {"a": [1, 2.5, "é"]}, "type": ["object", {"a": "dynamic"}]}},
            "resources": resources, "check_results": None, **top}


def _instances(count: int, value: object) -> list[dict]:
    return [{"index_key": i, "schema_version": 0, "attributes": {"id": f"i-{i}", "v": value, "n": i * 1.5},
             "sensitive_attributes": [], "dependencies": ["terraform_data.a"]} for i in range(count)]


RESOURCES = [
    {"mode": "managed", "type": "terraform_data", "name": "a", "provider": 'provider["terraform.io/builtin/terraform"]',
     "instances": [{"schema_version": 0, "attributes": {"id": "x", "input": None}}]},
    {"module": "module.m[\"k\"]", "mode": "managed", "type": "terraform_data", "name": "b",
     "provider": 'provider["terraform.io/builtin/terraform"]', "instances": _instances(40, "ünï ☃ 𝄞 <&>")},
    {"mode": "data", "type": "terraform_remote_state", "name": "c",
     "provider": 'provider["terraform.io/builtin/terraform"]',
     "instances": [{"schema_version": 0, "attributes": {"tiny": 1e-7, "big": 12345678901234567890123, "e": 1.5e300}},
                   {"index_key": "k", "deposed": "abcd1234", "status": "tainted", "attributes": {}}]},
    {"mode": "managed", "type": "terraform_data", "name": "empty", "provider": "p", "instances": []},
    {"mode": "managed", "type": "terraform_data", "name": "none", "provider": "p"},
    # Terraform's "each" between name and provider, an aliased provider, and a field after the instances.
    {"module": "module.x", "mode": "managed", "type": "terraform_data", "name": "e", "each": "map",
     "provider": 'provider["registry.terraform.io/hashicorp/aws"].west', "instances": _instances(3, "v"),
     "after": {"k": [1, None]}},
]


def _bodies() -> list[bytes]:
    doc = _doc(RESOURCES)
    return [
        (json.dumps(doc, indent=2) + "\n").encode(),
        json.dumps(doc, separators=(",", ":")).encode(),
        json.dumps(doc, ensure_ascii=False, indent="\t").encode(),
        json.dumps(doc, ensure_ascii=True).encode(),
        json.dumps(_doc([]), indent=2).encode(),
        json.dumps({k: v for k, v in doc.items() if k != "resources"}).encode(),
    ]


@pytest.fixture(params=[64, 4 * 1024 * 1024], ids=["tiny-window", "default-window"])
def window(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    # A tiny window cuts numbers, strings, escapes and multi-byte characters at every possible place.
    monkeypatch.setattr(statestream, "WINDOW_BYTES", request.param)
    return request.param


@pytest.mark.parametrize("accelerated", [True, False])
@pytest.mark.parametrize("body", _bodies(), ids=range(len(_bodies())))
def test_stream_gives_the_whole_parse_rows(body: bytes, accelerated: bool, window: int) -> None:
    assert stream_state(body, accelerated=accelerated) == state._parse_state(body, accelerated=accelerated)


def test_every_window_size_gives_the_same_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    body = json.dumps(_doc(RESOURCES[:3]), ensure_ascii=False, indent=1).encode()
    expected = state._parse_state(body, accelerated=True)
    for size in range(1, 200, 7):
        monkeypatch.setattr(statestream, "WINDOW_BYTES", size)
        assert stream_state(bytearray(body), accelerated=True) == expected


def _odd(doc: dict) -> bytes:
    return json.dumps(doc).encode()


ODD_SHAPES = {
    "module after instances": b'{"version":4,"serial":1,"lineage":"l","resources":[{"mode":"managed","type":"t",'
                              b'"name":"n","provider":"p","instances":[{"attributes":{}}],"module":"module.x"}]}',
    "duplicate top-level key": b'{"version":4,"serial":1,"serial":2,"lineage":"l","resources":[]}',
    "duplicate resource key": b'{"version":4,"serial":1,"lineage":"l","resources":[{"mode":"managed","mode":"data",'
                              b'"type":"t","name":"n","provider":"p","instances":[]}]}',
    "encrypted envelope": b'{"serial":1,"lineage":"l","encrypted_data":"x","encryption_version":"v0"}',
    "version 3": b'{"version":3,"serial":1,"lineage":"l"}',
    "trailing data": b'{"version":4,"serial":1,"lineage":"l"} {}',
    "not json": b'{"version":4,"serial":1,',
    "bom": b"\xef\xbb\xbf" + _odd(_doc([])),
    "utf-16": _odd(_doc([])).decode().encode("utf-16"),
    "bad utf-8": b'{"version":4,"serial":1,"lineage":"\xff"}',
    "nan": b'{"version":4,"serial":1,"lineage":"l","outputs":{"o":{"value":NaN,"type":"number"}}}',
    "bad mode": b'{"version":4,"serial":1,"lineage":"l","resources":[{"mode":"x","type":"t","name":"n",'
                b'"provider":"p","instances":[]}]}',
    "twice": b'{"version":4,"serial":1,"lineage":"l","resources":[{"mode":"managed","type":"t","name":"n",'
             b'"provider":"p","instances":[{"attributes":{}},{"attributes":{}}]}]}',
    "instances twice": b'{"version":4,"serial":1,"lineage":"l","resources":[{"mode":"managed","type":"t",'
                       b'"name":"n","provider":"p","instances":[],"instances":[]}]}',
    "control character in a provider": b'{"version":4,"serial":1,"lineage":"l","resources":[{"mode":"managed",'
                                       b'"type":"t","name":"n","provider":"p\x01","instances":[]}]}',
    "resources not a list": b'{"version":4,"serial":1,"lineage":"l","resources":{}}',
    "deep": b'{"version":4,"serial":1,"lineage":"l","outputs":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
}


@pytest.mark.parametrize("body", ODD_SHAPES.values(), ids=ODD_SHAPES.keys())
def test_other_shapes_are_declined_and_parse_as_before(body: bytes) -> None:
    """What the reader declines, ``parse_state`` parses whole: its answer (or error) is the whole parse's."""
    with pytest.raises(Unstreamable):
        stream_state(body, accelerated=True)
    try:
        expected: object = state._parse_state(body, accelerated=True)
    except state.StateFormatError as exc:
        with pytest.raises(state.StateFormatError) as got:
            state.parse_state(body)
        assert str(got.value) == str(exc)
    else:
        assert state.parse_state(body) == expected


def test_instances_before_their_resource_fields_are_read_whole() -> None:
    body = _odd(_doc([{"mode": "managed", "type": "t", "name": "n", "instances": [{"attributes": {"x": 1}}],
                       "provider": "p"}]))
    parsed = stream_state(body, accelerated=True)
    assert parsed == state._parse_state(body, accelerated=True)
    assert [row.address for row in parsed.instances] == ["t.n"]


@pytest.mark.parametrize("accelerated", [True, False], ids=["orjson", "json"])
def test_a_watcher_gets_the_fields_before_resources_and_each_row_as_it_is_read(accelerated: bool) -> None:
    body = json.dumps(_doc(RESOURCES)).encode()
    seen: list[dict[str, object]] = []
    handed: list[state.InstanceRow] = []

    def watch(doc: object) -> statestream.RowConsumer:
        seen.append(dict(doc))  # type: ignore[call-overload]
        return handed.append

    parsed = stream_state(body, accelerated=accelerated, watch=watch)
    assert [set(fields) for fields in seen] == [{"version", "terraform_version", "serial", "lineage", "outputs"}]
    assert seen[0]["serial"] == 3
    assert handed == list(parsed.instances) == list(state._parse_state(body, accelerated=accelerated).instances)


def test_a_watchers_consumer_runs_while_the_body_is_read() -> None:
    body = json.dumps(_doc(RESOURCES)).encode()

    def refuse(row: state.InstanceRow) -> None:
        raise LookupError(row.address)

    # The first row's consumer stops the parse: rows are handed on as they are read, not after.
    with pytest.raises(LookupError, match=r"^terraform_data\.a$"):
        stream_state(body, accelerated=False, watch=lambda _doc: refuse)


def test_a_watcher_that_declines_leaves_the_parse_as_it_was() -> None:
    doc = _doc(RESOURCES)
    body = json.dumps({"resources": doc.pop("resources"), **doc}).encode()  # resources before the serial
    seen: list[object] = []
    parsed = state.parse_state_watched(body, lambda fields: seen.append(dict(fields)))
    assert seen == [{}]
    assert parsed == state.parse_state(body)
    assert state.parse_state_watched(b'{"version": 3}', lambda _doc: None) is None  # the whole parse answers
