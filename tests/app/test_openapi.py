"""The served OpenAPI document matches the registered routes, and a property-based fuzz of every
operation it describes never gets a 5xx and never changes a row when the request is refused."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from urllib.parse import quote, urlencode

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.config import AuthMode
from app.web.openapi import OPERATIONS, PATH, Operation
from tests.helpers import counted_state

CONTROL = "c" * 40
_IGNORED_METHODS = {"HEAD", "OPTIONS"}
_DOCUMENTED_PREFIXES = ("/v1/engine", "/v1/api")


@pytest.fixture
def db_app(settings):  # type: ignore[no-untyped-def]
    from app.web import create_app

    application = create_app(replace(settings, auth_mode=AuthMode.DATABASE, control_token=CONTROL,
                                     session_secret="s" * 40, auth_failure_limit=10_000, max_wait_seconds=0))
    yield application
    application.extensions["kilolock"].db.close()


def _openapi_path(rule: str) -> str:
    return re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", r"{\1}", rule)


def test_the_document_is_served_and_lists_every_engine_and_control_route(db_app):
    client = db_app.test_client()
    response = client.get(PATH)
    assert response.status_code == 200
    doc = response.get_json()
    assert doc["openapi"].startswith("3.1")
    documented = {(method.upper(), path) for path, ops in doc["paths"].items() for method in ops}
    registered = {(method, _openapi_path(rule.rule)) for rule in db_app.url_map.iter_rules()
                  if rule.rule.startswith(_DOCUMENTED_PREFIXES)
                  for method in (rule.methods or set()) - _IGNORED_METHODS}
    assert registered - documented == set(), "routes missing from the OpenAPI document"
    assert documented - registered == set(), "OpenAPI entries with no route behind them"
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert op["responses"] and op["summary"], (method, path)
            names = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert names == set(re.findall(r"{([a-z_]+)}", path)), (method, path)


def test_the_engine_api_page_points_at_the_document():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "engine-api.md").read_text()
    assert PATH in text


# --- the fuzz ---------------------------------------------------------------------------------------------

def _rows(database_url: str) -> tuple[object, ...]:
    """What a refused request must not change (the audit trail may record a refusal, by design)."""
    with psycopg.connect(database_url) as conn:
        return tuple(conn.execute(q).fetchall() for q in (
            "SELECT id, name, current_serial, head_version_id, lock_id FROM states ORDER BY id",
            "SELECT id, serial FROM state_versions ORDER BY id",
            "SELECT id, address, delete_serial FROM resources ORDER BY id",
            "SELECT id, status, finished_at FROM apply_runs ORDER BY id",
            "SELECT id, glob, mode, expires_at FROM resource_reservations ORDER BY id",
            "SELECT id, slug FROM tenants ORDER BY id",
            "SELECT id, revoked_at FROM api_tokens ORDER BY id",
        ))


_hostile_text = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["", "prod", "..", "a/b", "%2F", "x\x00y", "\ud800", "ws_a/env_b/prod", "*", "output.*",
                     "module.web.*", "9" * 40, "-1", "1e308", "NaN", "true", "null", " " * 3, "\r\nX: y"]),
)
_json_scalar = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                         st.floats(allow_nan=False, allow_infinity=False), _hostile_text)
_json_value = st.recursive(_json_scalar, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(_hostile_text, inner, max_size=4)), max_leaves=12)


def _body_strategy(op: Operation) -> st.SearchStrategy[bytes | None]:
    shaped = st.fixed_dictionaries({}, optional={k: _json_value for k in (op.body or {})})
    wanted = st.fixed_dictionaries({"actor": _hostile_text, "holder": st.just("fuzz"), "reservations": st.lists(
        st.fixed_dictionaries({"glob": _hostile_text, "mode": st.sampled_from(["read", "write", "x"])}),
        max_size=3)})
    return st.one_of(
        st.none(),
        shaped.map(lambda d: json.dumps(d).encode()),
        wanted.map(lambda d: json.dumps(d).encode()),
        _json_value.map(lambda v: json.dumps(v).encode()),
        st.binary(max_size=64),
        st.sampled_from([b"[" * 5000, b'{"a": ' * 3000, b'{"globs": ["\\ud800"]}', b'{"actor": "\\u0000"}']),
    )


def _path_value(name: str, run_id: str) -> st.SearchStrategy[str]:
    known = {"name": "prod", "run_id": run_id, "slug": "acme", "token_id": "tok_none", "ticket": "wt_1",
             "hold_id": run_id}[name]
    return st.one_of(st.just(known), _hostile_text.filter(lambda s: s != ""))


@pytest.mark.parametrize("op", OPERATIONS, ids=[f"{o.method}:{o.path}" for o in OPERATIONS])
def test_fuzz_every_operation_never_5xx_and_refusals_change_no_row(db_app, clean_db, op):
    client = db_app.test_client()
    control = {"Authorization": f"Bearer {CONTROL}"}
    assert client.post("/v1/api/tenants", json={"slug": "acme", "name": "Acme"}, headers=control).status_code == 201
    made = client.post("/v1/api/tenants/acme/tokens", json={"name": "ci", "environment": "prod"},
                       headers=control).get_json()
    token = {"Authorization": f"Bearer {made['token_secret']}"}
    assert client.post("/v1/states/prod", data=counted_state(1, 3), headers=token).status_code == 200
    opened = client.post("/v1/engine/states/prod/runs", headers=token, json={
        "actor": "fuzz", "reservations": [{"glob": "terraform_data.item[0]", "mode": "write"}]})
    assert opened.status_code == 201
    run_id = opened.get_json()["run"]["id"]
    headers = control if "control" in op.tags else token

    @settings(max_examples=10, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        path = op.path
        for p in op.params:
            if p.where == "path":
                value = data.draw(_path_value(p.name, run_id), label=p.name)
                encoded = quote(value, safe="/" if p.name == "name" else "", errors="surrogatepass")
                path = path.replace("{" + p.name + "}", encoded)
        query = {p.name: data.draw(_hostile_text, label=p.name) for p in op.params
                 if p.where == "query" and data.draw(st.booleans(), label=f"send {p.name}")}
        body = data.draw(_body_strategy(op), label="body") if op.method != "get" else None
        url = path + ("?" + urlencode(query, errors="surrogatepass") if query else "")
        before = _rows(clean_db)
        response = client.open(url, method=op.method.upper(), data=body, headers=headers,
                               content_type="application/json")
        assert response.status_code < 500, (op.method, url, body, response.get_data()[:300])
        if response.status_code >= 400:
            envelope = response.get_json(silent=True)
            assert envelope is not None and envelope["ok"] is False, response.get_data()[:200]
            assert _rows(clean_db) == before, (op.method, url, body, response.status_code)

    run()
