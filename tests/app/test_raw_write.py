"""A POSTed state's bytes are stored by binary COPY in slices and come back byte for byte."""

from __future__ import annotations

import hashlib

import psycopg

from app.store import rawwrite
from tests.helpers import instance, resource, state

URL = "/v1/states/rawcopy"


def test_a_body_sent_in_many_slices_comes_back_byte_exact(client, clean_db, monkeypatch):
    monkeypatch.setattr(rawwrite, "SLICE_BYTES", 1000)  # the body goes in dozens of slices
    body = state(4, [resource("a", [instance(i, f"välue-{i} ☃ <&>") for i in range(300)])],
                 lineage="a1b2c3d4-0000-1111-2222-333333333333")
    assert len(body) > 50 * rawwrite.SLICE_BYTES
    response = client.post(URL, data=body)
    assert response.status_code == 200, response.data
    got = client.get(URL)
    assert got.status_code == 200
    assert got.data == body
    with psycopg.connect(clean_db) as conn:
        row = conn.execute(
            "SELECT serial, lineage, terraform_version, size_bytes, encrypted, source, sha256 FROM state_versions"
        ).fetchone()
    assert row is not None
    serial, lineage, terraform_version, size, encrypted, source, digest = row
    assert (serial, lineage, terraform_version, size, encrypted, source) == (
        4, "a1b2c3d4-0000-1111-2222-333333333333", "1.15.5", len(body), False, "http")
    assert digest == hashlib.sha256(body).hexdigest()
    # A replay of the same bytes is recognised by that digest.
    assert client.post(URL, data=body).status_code == 200
