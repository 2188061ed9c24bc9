"""The backend lane's wire contract, row by row, through the Flask test client."""

from __future__ import annotations

import json
import threading

import psycopg
import pytest
import requests

from tests.helpers import counted_state, lock_info, state

URL = "/v1/states/demo"


def events(database_url: str) -> list[tuple[str, str | None]]:
    with psycopg.connect(database_url) as conn:
        return [(k, lid) for k, lid in conn.execute("SELECT kind, lock_id FROM events ORDER BY id")]


def snapshot(database_url: str) -> tuple[object, ...]:
    """Everything a rejected request must leave untouched."""
    with psycopg.connect(database_url) as conn:
        return (
            conn.execute("SELECT name, lineage, current_serial, head_version_id, lock_id, lock_info "
                         "FROM states ORDER BY id").fetchall(),
            conn.execute("SELECT id, serial, sha256 FROM state_versions ORDER BY id").fetchall(),
            conn.execute("SELECT id, address, create_serial, delete_serial FROM resources ORDER BY id").fetchall(),
            conn.execute("SELECT state_version_id, name FROM outputs ORDER BY 1, 2").fetchall(),
        )


# --- GET ---------------------------------------------------------------------------------------

def test_get_of_a_never_written_state_is_404_not_an_empty_object(client):
    response = client.get(URL)
    assert response.status_code == 404
    assert response.data != b"{}"


def test_get_returns_the_posted_bytes_exactly_with_no_store(client):
    body = counted_state(1, 3)
    assert client.post(URL, data=body, content_type="application/json").status_code == 200
    response = client.get(URL)
    assert response.status_code == 200
    assert response.data == body
    assert response.headers["Cache-Control"] == "no-store"
    assert response.mimetype == "application/json"


def test_get_while_locked_but_never_written_is_404(client):
    assert client.open(URL, method="LOCK", data=lock_info("l1")).status_code == 200
    assert client.get(URL).status_code == 404


@pytest.mark.parametrize("path", ["/v1/states/a%2Fb", "/v1/states/..", "/v1/states/", "/v1/states",
                                  "/v1/states/has space", "/v1/states/-dash-first", "/v1/states/a/b"])
def test_unroutable_state_names_are_400_never_404(client, path):
    response = client.get(path)
    assert response.status_code == 400, (path, response.status_code)


def test_a_trailing_slash_is_tolerated_without_a_redirect(client):
    body = counted_state(1, 1)
    assert client.post(URL + "/", data=body).status_code == 200
    response = client.get(URL + "/")
    assert response.status_code == 200 and response.data == body


# --- POST --------------------------------------------------------------------------------------

def test_post_while_locked_needs_the_holders_id(client, clean_db):
    client.open(URL, method="LOCK", data=lock_info("held"))
    assert client.post(URL + "?ID=held", data=counted_state(1, 1)).status_code == 200
    before = snapshot(clean_db)
    wrong = client.post(URL + "?ID=other", data=counted_state(2, 1))
    assert wrong.status_code == 423
    assert json.loads(wrong.data)["ID"] == "held"
    missing = client.post(URL, data=counted_state(2, 1))
    assert missing.status_code == 423
    assert json.loads(missing.data)["Who"] == "alice@laptop"
    assert snapshot(clean_db) == before


def test_post_with_an_id_against_an_unlocked_state_is_refused(client, clean_db):
    client.post(URL, data=counted_state(1, 1))
    before = snapshot(clean_db)
    response = client.post(URL + "?ID=stale", data=counted_state(2, 1))
    assert response.status_code == 423
    assert json.loads(response.data)["ID"] == "stale"
    assert snapshot(clean_db) == before


def test_a_byte_identical_replay_of_the_head_succeeds_and_writes_nothing(client, clean_db):
    body = counted_state(1, 2)
    client.post(URL, data=body)
    before = snapshot(clean_db)
    kinds_before = events(clean_db)
    assert client.post(URL, data=body).status_code == 200
    client.open(URL, method="LOCK", data=lock_info("x"))
    assert client.post(URL + "?ID=x", data=body).status_code == 200
    assert client.post(URL, data=body).status_code == 200  # even without the ID: nothing changes
    assert snapshot(clean_db)[1:] == before[1:]
    assert [k for k, _ in events(clean_db)] == [k for k, _ in kinds_before] + ["lock"]


def test_same_serial_with_other_bytes_is_409_naming_both_serials(client, clean_db):
    client.post(URL, data=counted_state(5, 2))
    before = snapshot(clean_db)
    response = client.post(URL, data=counted_state(5, 2, value="other"))
    assert response.status_code == 409
    assert b"serial 5" in response.data
    assert snapshot(clean_db) == before


def test_a_serial_below_the_head_is_409_stale(client, clean_db):
    client.post(URL, data=counted_state(7, 2))
    before = snapshot(clean_db)
    response = client.post(URL, data=counted_state(6, 3))
    assert response.status_code == 409
    assert b"serial 6" in response.data and b"serial 7" in response.data
    assert snapshot(clean_db) == before


@pytest.mark.parametrize("body", [b"not json", b"[1,2]", b'{"version": 3, "serial": 1, "lineage": "x"}', b"",
                                  b'{"version": 4, "serial": "one", "lineage": "x", "resources": []}'])
def test_bad_bodies_are_400_and_change_nothing(client, clean_db, body):
    client.post(URL, data=counted_state(1, 1))
    before = snapshot(clean_db)
    response = client.post(URL, data=body)
    assert response.status_code == 400
    assert snapshot(clean_db) == before


def test_a_v3_state_is_rejected_naming_its_version(client):
    response = client.post(URL, data=b'{"version": 3, "serial": 1, "lineage": "x", "modules": []}')
    assert response.status_code == 400
    assert b"3" in response.data


def test_the_opentofu_encrypted_envelope_is_stored_opaque_and_round_trips(client, clean_db):
    envelope = json.dumps({"serial": 3, "lineage": "abc", "meta": {"key_provider.pbkdf2.k": "eyJ9"},
                           "encrypted_data": "c2VjcmV0", "encryption_version": "v0"}).encode()
    assert client.post(URL, data=envelope).status_code == 200
    assert client.get(URL).data == envelope
    with psycopg.connect(clean_db) as conn:
        assert conn.execute("SELECT encrypted FROM state_versions").fetchone() == (True,)
        assert conn.execute("SELECT count(*) FROM resources").fetchone() == (0,)


def test_a_body_over_the_limit_is_413(live_server_factory):
    server = live_server_factory(max_body_bytes=1000)
    response = requests.post(server.state_url("big"), data=counted_state(1, 50), timeout=10)
    assert response.status_code == 413
    assert requests.get(server.state_url("big"), timeout=10).status_code == 404


# --- LOCK --------------------------------------------------------------------------------------

def test_lock_conflict_answers_423_with_the_holders_stored_bytes(client):
    holder = lock_info("first", who="alice@laptop")
    assert client.open(URL, method="LOCK", data=holder).status_code == 200
    response = client.open(URL, method="LOCK", data=lock_info("second", who="bob@desk"))
    assert response.status_code == 423
    assert response.data == holder


def test_a_same_id_relock_is_a_replay_and_succeeds(client):
    assert client.open(URL, method="LOCK", data=lock_info("same")).status_code == 200
    assert client.open(URL, method="LOCK", data=lock_info("same")).status_code == 200


@pytest.mark.parametrize("body", [b"", b"nope", b"{}", b'{"ID": ""}', b'{"ID": 5}', b"[]"])
def test_lock_without_a_usable_id_is_400(client, clean_db, body):
    response = client.open(URL, method="LOCK", data=body)
    assert response.status_code == 400
    assert snapshot(clean_db)[0] == []


def test_a_lock_without_created_gets_an_rfc3339_created_for_conflicts(client):
    client.open(URL, method="LOCK", data=json.dumps({"ID": "bare", "Who": "script"}).encode())
    conflict = client.open(URL, method="LOCK", data=lock_info("other"))
    info = json.loads(conflict.data)
    assert info["ID"] == "bare"
    assert info["Created"].endswith("Z") and "T" in info["Created"]


def test_fifty_concurrent_locks_grant_exactly_one(live_server):
    url = live_server.state_url("contended")
    results: list[int] = []
    barrier = threading.Barrier(50)

    def contend(i: int) -> None:
        barrier.wait()
        results.append(requests.request("LOCK", url, data=lock_info(f"id-{i}"), timeout=30).status_code)

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [200] + [423] * 49


# --- UNLOCK ------------------------------------------------------------------------------------

def test_owner_unlock_compares_only_the_id(client):
    client.open(URL, method="LOCK", data=lock_info("mine"))
    wrong = client.open(URL, method="UNLOCK", data=lock_info("theirs"))
    assert wrong.status_code == 423
    assert json.loads(wrong.data)["ID"] == "mine"
    same_id_other_fields = json.dumps({"ID": "mine", "Who": "someone else", "Operation": "x"}).encode()
    assert client.open(URL, method="UNLOCK", data=same_id_other_fields).status_code == 200
    assert client.open(URL, method="LOCK", data=lock_info("next")).status_code == 200


@pytest.mark.parametrize("body", [b"", b"{}", b'{"ID":"whatever","Operation":"","Info":"","Who":"","Version":"",'
                                              b'"Created":"0001-01-01T00:00:00Z","Path":""}'])
def test_force_unlock_shapes_release_and_are_audited(client, clean_db, body):
    client.open(URL, method="LOCK", data=lock_info("stuck"))
    response = client.open(URL, method="UNLOCK", data=body, content_type="application/json")
    assert response.status_code == 200
    assert ("lock_force_release", "stuck") in events(clean_db)
    assert client.open(URL, method="LOCK", data=lock_info("fresh")).status_code == 200


def test_unlock_of_an_unlocked_or_unknown_state_is_200(client):
    assert client.open(URL, method="UNLOCK", data=b"").status_code == 200
    assert client.open(URL, method="UNLOCK", data=lock_info("x")).status_code == 200


def test_the_state_unlock_alias_accepts_plain_ids_query_ids_and_empty_bodies(client):
    alias = "/v1/state-unlock/demo"
    client.open(URL, method="LOCK", data=lock_info("a1"))
    assert client.post(alias, data=b"wrong-id").status_code == 423
    assert client.post(alias, data=b"a1").status_code == 200
    client.open(URL, method="LOCK", data=lock_info("a2"))
    assert client.post(alias + "?ID=a2").status_code == 200
    client.open(URL, method="LOCK", data=lock_info("a3"))
    assert client.post(alias, data=b'"a3"').status_code == 200
    client.open(URL, method="LOCK", data=lock_info("a4"))
    assert client.post(alias, data=b"", content_type="application/json").status_code == 200
    assert client.open(URL, method="LOCK", data=lock_info("a5")).status_code == 200


def test_after_a_force_unlock_the_old_holders_writes_are_refused(client, clean_db):
    client.open(URL, method="LOCK", data=lock_info("A"))
    client.post(URL + "?ID=A", data=counted_state(1, 1))
    client.open(URL, method="UNLOCK", data=b"")
    client.open(URL, method="LOCK", data=lock_info("B"))
    assert client.post(URL + "?ID=A", data=counted_state(2, 1)).status_code == 423
    assert client.open(URL, method="UNLOCK", data=lock_info("A")).status_code == 423
    assert client.post(URL + "?ID=B", data=counted_state(2, 1)).status_code == 200


# --- DELETE ------------------------------------------------------------------------------------

def test_delete_removes_the_state_and_everything_hanging_off_it(client, clean_db):
    client.post(URL, data=state(1, [], outputs={"o": {"value": 1, "type": "number"}}))
    client.post(URL, data=counted_state(2, 3))
    assert client.delete(URL).status_code == 200
    assert client.get(URL).status_code == 404
    assert snapshot(clean_db) == ([], [], [], [])
    assert ("state_delete", None) in events(clean_db)


def test_delete_is_refused_while_locked_and_404_when_unknown(client, clean_db):
    client.post(URL, data=counted_state(1, 1))
    client.open(URL, method="LOCK", data=lock_info("L"))
    before = snapshot(clean_db)
    assert client.delete(URL).status_code == 423
    assert snapshot(clean_db) == before
    assert client.delete(URL + "?ID=L").status_code == 200
    assert client.delete("/v1/states/never").status_code == 404


# --- audit -------------------------------------------------------------------------------------

def test_every_mutation_is_audited_and_reads_are_not(client, clean_db):
    client.open(URL, method="LOCK", data=lock_info("L1"))
    client.post(URL + "?ID=L1", data=counted_state(1, 1))
    client.open(URL, method="UNLOCK", data=lock_info("L1"))
    client.get(URL)
    client.get("/v1/engine/states/demo/resources")
    client.delete(URL)
    assert events(clean_db) == [("lock", "L1"), ("state_write", "L1"), ("unlock", "L1"), ("state_delete", None)]
    with psycopg.connect(clean_db) as conn:
        actor, serial = conn.execute("SELECT actor, serial FROM events WHERE kind = 'state_write'").fetchone()
    assert serial == 1 and actor


def test_healthz_reports_the_database_without_auth(live_server_factory):
    server = live_server_factory(auth_mode=__import__("app.config").config.AuthMode.STATIC, auth_token="s3cret")
    response = requests.get(server.url + "/healthz", timeout=10)
    assert response.status_code == 200
    assert response.json() == {"ok": True, "database": "ok"}
