"""Apply versions without stored bytes: the first read assembles and caches them, concurrent readers
coalesce, every read is a whole serial and byte-stable, and Terraform's next POST is accepted."""

from __future__ import annotations

import hashlib
import json
import threading

import psycopg
import requests

from analyzer.state import ParsedState, parse_state
from app.store import assembly
from app.store.db import Database
from tests.helpers import counted_state

STATE = "/v1/states/big"
COUNT = 2000


def post(http, url: str, payload: dict) -> tuple[int, dict]:  # type: ignore[type-arg,no-untyped-def]
    """POST JSON with a Flask test client or a requests session."""
    answer = http.post(url, json=payload)
    return answer.status_code, answer.json() if callable(answer.json) else answer.json


def open_run(http, base_url: str, actor: str, glob: str, base: int) -> str:  # type: ignore[no-untyped-def]
    status, body = post(http, f"{base_url}/v1/engine/states/big/runs", {
        "actor": actor, "base_serial": base, "reservations": [{"glob": glob, "mode": "write"}]})
    assert status == 201, body
    return str(body["run"]["id"])


def commit_one(http, base_url: str, index: int, value: str, base: int) -> int:  # type: ignore[no-untyped-def]
    """Change item[index] to ``value`` through a run that reserves only it; returns the new serial."""
    address = f"terraform_data.item[{index}]"
    run_id = open_run(http, base_url, f"dev{index}", address, base)
    doc = json.loads(counted_state(base, 1))
    doc["resources"][0]["instances"][0]["index_key"] = index
    doc["resources"][0]["instances"][0]["attributes"]["input"]["value"] = value
    status, body = post(http, f"{base_url}/v1/engine/runs/{run_id}/commit",
                        {"holder": f"dev{index}", "state": doc, "slice_addresses": [address]})
    assert status == 200, body
    return int(body["commit"]["serial"])


def values(body: bytes) -> tuple[int, dict[int, str]]:
    parsed = parse_state(body)
    assert isinstance(parsed, ParsedState)
    found = {}
    for row in parsed.instances:
        found[int(row.address.split("[")[1].rstrip("]"))] = json.loads(row.instance_json)["attributes"]["input"][
            "value"]
    return parsed.serial, found


def stored(url: str) -> list[tuple[int, str, bool, str | None]]:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT serial, source, raw_state IS NOT NULL, sha256 FROM state_versions "
                            "ORDER BY serial").fetchall()


def test_commits_store_no_bytes_and_one_get_assembles_the_head_once(client, clean_db):
    client.post(STATE, data=counted_state(1, COUNT))
    serial = 1
    for i in range(5):
        serial = commit_one(client, "", i, f"new-{i}", serial)
    assert serial == 6
    assert [(s, src, has) for s, src, has, _ in stored(clean_db)] == [
        (1, "http", True), *[(s, "apply", False) for s in range(2, 7)]]
    first = client.get(STATE).data
    got_serial, got = values(first)
    assert got_serial == 6 and len(got) == COUNT
    assert all(got[i] == f"new-{i}" for i in range(5)) and got[5] == "v-5"
    # Only the head was assembled, and it was cached with its digest.
    rows = stored(clean_db)
    assert [has for _, _, has, _ in rows] == [True, False, False, False, False, True]
    assert rows[-1][3] == hashlib.sha256(first).hexdigest()
    # Stable: the same bytes from GET every time, and from the engine lane's assembled view.
    assert client.get(STATE).data == first
    assert client.get("/v1/engine/states/big/assembled").data == first
    # An older apply version assembles on read too (its own serial, its own rows), also cached.
    old = client.get("/v1/engine/states/big/assembled?serial=3").data
    assert values(old)[0] == 3 and values(old)[1][1] == "new-1" and values(old)[1][2] == "v-2"
    assert client.get("/v1/engine/states/big/assembled?serial=3").data == old


def test_terraform_next_post_after_commits_is_accepted_and_replays_are_recognised(client, clean_db):
    client.post(STATE, data=counted_state(1, 10))
    commit_one(client, "", 3, "kl", 1)
    pulled = client.get(STATE).data
    doc = json.loads(pulled)
    assert doc["serial"] == 2 and doc["lineage"] == json.loads(counted_state(1, 10))["lineage"]
    # Terraform re-POSTing exactly what it pulled is a replay, not a conflict.
    assert client.post(STATE, data=pulled).status_code == 200
    doc["serial"] = 3
    doc["resources"][0]["instances"][0]["attributes"]["input"]["value"] = "terraform"
    answer = client.post(STATE, data=json.dumps(doc, indent=2).encode())
    assert answer.status_code == 200, answer.get_json()
    serial, got = values(client.get(STATE).data)
    assert serial == 3 and got[0] == "terraform" and got[3] == "kl"
    # A POST at the serial a commit already took (never pulled) is a conflict, as for any other head.
    commit_one(client, "", 4, "kl", 3)
    doc["serial"] = 4
    assert client.post(STATE, data=json.dumps(doc).encode()).status_code == 409


def test_concurrent_first_reads_coalesce_into_one_assembly(client, clean_db):
    client.post(STATE, data=counted_state(1, COUNT))
    commit_one(client, "", 7, "x", 1)
    with psycopg.connect(clean_db) as conn:
        (version_id,) = conn.execute("SELECT id FROM state_versions WHERE serial = 2").fetchone() or (0,)
    database = Database(clean_db, pool_size=8)
    results: list[assembly.Materialised | None] = []
    start = threading.Barrier(8)

    def read() -> None:
        start.wait()
        results.append(assembly.materialise(database, version_id))

    try:
        threads = [threading.Thread(target=read) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        database.close()
    assert len(results) == 8 and all(r is not None for r in results)
    assert sum(1 for r in results if r is not None and r.assembled) == 1
    assert len({r.raw for r in results if r is not None}) == 1


def test_gets_racing_commits_return_whole_serials_never_older_than_a_finished_commit(live_server, clean_db):
    base_url = live_server.url
    http = requests.Session()
    assert http.post(live_server.state_url("big"), data=counted_state(1, COUNT), timeout=60).status_code == 200
    commits = 12
    finished = [1]  # serial of the last commit that returned, as the committer saw it
    stop = threading.Event()
    problems: list[str] = []
    seen: dict[int, bytes] = {}
    lock = threading.Lock()

    def reader() -> None:
        session = requests.Session()
        while not stop.is_set():
            floor = finished[-1]
            body = session.get(live_server.state_url("big"), timeout=60).content
            serial, got = values(body)
            if serial < floor:
                problems.append(f"GET returned serial {serial} after serial {floor} was committed")
            # Commit k (serial k + 1) set item[k] = "c-k": a whole serial has exactly those before it.
            expected = {k: f"c-{k}" if k + 1 <= serial else f"v-{k}" for k in range(1, commits + 1)}
            wrong = {k: got.get(k) for k, v in expected.items() if got.get(k) != v}
            if wrong or len(got) != COUNT:
                problems.append(f"serial {serial} is not whole: {wrong}")
            with lock:
                if seen.setdefault(serial, body) != body:
                    problems.append(f"serial {serial} read as two different byte strings")

    readers = [threading.Thread(target=reader) for _ in range(4)]
    for t in readers:
        t.start()
    try:
        serial = 1
        for k in range(1, commits + 1):
            serial = commit_one(http, base_url, k, f"c-{k}", serial)
            finished.append(serial)
    finally:
        stop.set()
        for t in readers:
            t.join(timeout=120)
    assert not problems, problems[:5]
    assert serial == commits + 1
    assert values(http.get(live_server.state_url("big"), timeout=60).content)[0] == commits + 1
