"""Address-scope benchmark: what 200 scopes on a token add to a grant and to a one-instance commit, at 50,000
instances, against a token without scopes in the same run.

Run from the repository root:

    .venv/bin/python -m bench.scopes_bench              # full size, rewrites its section of docs/benchmarks.md
    .venv/bin/python -m bench.scopes_bench --quick      # 2,000 instances, a few cycles, prints only

The real server (``app.web.create_app`` in database auth mode on a threaded werkzeug server on a loopback port,
over a scratch database) serves one state of one counted ``terraform_data`` (POSTed once). Two tokens of the
same environment drive it over HTTP: one without scopes and one with 200 (146 module prefixes, 4 output name
prefixes, 40 exact instances, 9 resource types of other names, and ``*:read``), whose exact scopes cover the
instances the cycles write. A cycle opens a run reserving one instance for writing (the grant, timed at the client) and
commits a slice changing only that instance (the commit, timed at the client). A third token, also without
scopes, runs the same cycles as a control: the difference between the two unscoped tokens is the noise floor
of the machine. The three take turns, in a rotating order, so the load of a busy machine falls on all alike;
the medians are compared.

What the scopes add inside the server is also timed in process, which a busy machine disturbs least: the
authentication of each token against the same database (``app.store.tenancy.authenticate``, which reads the
scopes with the token, and ``app.domain.scopes.scope_set``), alternating, and the checks themselves (the
grant's ``check_requested`` and the commit's ``check_written`` with 200 scopes).
"""

from __future__ import annotations

import json
import logging
import statistics
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
import requests
from psycopg import sql
from werkzeug.serving import make_server

from bench import common
from bench.states import counted_state, instance

SECTION = "## Address scopes"
CONTROL = "bench-control-token"
STATE = "main"
SCOPED_EXACT = 40


def scopes_for(count: int) -> list[str]:
    """200 scopes of the shapes a shared state's tokens carry; the exact ones cover the instances cycles write."""
    found = [f"module.team{i}.*:write" for i in range(146)]
    found += [f"output.team{i}_*:write" for i in range(4)]
    found += [f"terraform_data.item[{k}]:write" for k in range(SCOPED_EXACT)]
    found += [f"type{i}.*:read" for i in range(9)]
    found.append("*:read")
    assert len(found) == 200
    return found


@dataclass(frozen=True, slots=True)
class Sample:
    grant: float
    commit: float


class Server:
    """A scratch database and the app in database auth mode on a loopback port."""

    def __init__(self, server_url: str) -> None:
        self.server_url = server_url
        self.dbname = f"kl_bench_scopes_{uuid.uuid4().hex[:8]}"
        self.url = common.with_dbname(server_url, self.dbname)
        self.base = ""
        self._httpd: Any = None
        self._app: Any = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Server:
        from app.config import AuthMode, Settings
        from app.store.migrate import migrate
        from app.web import create_app

        with psycopg.connect(self.server_url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.dbname)))
        try:
            migrate(self.url)
            self._app = create_app(Settings(database_url=self.url, auto_migrate=False, log_level="WARNING",
                                            auth_mode=AuthMode.DATABASE, control_token=CONTROL))
            logging.getLogger("werkzeug").setLevel(logging.WARNING)
            port = common.free_port()
            self._httpd = make_server("127.0.0.1", port, self._app, threaded=True)
            self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
            self._thread.start()
            self.base = f"http://127.0.0.1:{port}"
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            if self._thread is not None:
                self._thread.join(timeout=10)
        if self._app is not None:
            self._app.extensions["kilolock"].db.close()
        with psycopg.connect(self.server_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.dbname)))


class Client:
    def __init__(self, base: str, name: str, scopes: list[str] | None) -> None:
        ctl = {"Authorization": f"Bearer {CONTROL}"}
        body: dict[str, Any] = {"name": name, "environment": "prod"}
        if scopes:
            body["scopes"] = scopes
        created = requests.post(f"{base}/v1/api/tenants/bench/tokens", json=body, headers=ctl, timeout=60)
        created.raise_for_status()
        doc = created.json()
        self.name = name
        self.secret = str(doc["token_secret"])
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {doc['token_secret']}"
        path = f"{doc['workspace_id']}/{doc['environment_id']}/{STATE}"
        self.backend = f"{base}/v1/states/{path}"
        self.engine = f"{base}/v1/engine/states/{path}"
        self.runs = f"{base}/v1/engine/runs"

    def cycle(self, index: int, value: str, base_serial: int) -> tuple[int, Sample]:
        address = f"terraform_data.item[{index}]"
        started = time.perf_counter()
        opened = self.session.post(f"{self.engine}/runs", timeout=600, json={
            "actor": self.name, "base_serial": base_serial, "reservations": [{"glob": address, "mode": "write"}]})
        grant = time.perf_counter() - started
        if opened.status_code != 201:
            raise RuntimeError(f"{self.name}: opening a run on {address} answered {opened.status_code}: "
                               f"{opened.text[:300]}")
        run_id = opened.json()["run"]["id"]
        doc: dict[str, Any] = json.loads(counted_state(1, 1))
        doc["resources"][0]["instances"] = [instance(index, value)]
        started = time.perf_counter()
        done = self.session.post(f"{self.runs}/{run_id}/commit", timeout=600, json={
            "holder": self.name, "state": doc, "slice_addresses": [address], "prune_outputs": False})
        commit = time.perf_counter() - started
        if done.status_code != 200:
            raise RuntimeError(f"{self.name}: committing {address} answered {done.status_code}: {done.text[:300]}")
        return int(done.json()["commit"]["serial"]), Sample(grant, commit)


def in_process(rounds: int) -> tuple[float, float]:
    """Median seconds of the grant's and the commit's scope check with 200 scopes, in process."""
    from analyzer.globs import parse_glob
    from app.domain import scopes
    from app.domain.reservations import Mode

    chosen = scopes.scope_set(tuple(scopes.parse_scopes(scopes_for(0))))
    grants, commits = [], []
    for i in range(rounds):
        wanted = [(parse_glob(f"terraform_data.item[{i % SCOPED_EXACT}]"), Mode.WRITE)]
        started = time.perf_counter()
        scopes.check_requested(chosen, STATE, wanted)
        grants.append(time.perf_counter() - started)
        started = time.perf_counter()
        scopes.check_written(chosen, STATE, [f"terraform_data.item[{i % SCOPED_EXACT}]"], [])
        commits.append(time.perf_counter() - started)
    return statistics.median(grants), statistics.median(commits)


def authentication(db_url: str, secrets: dict[str, str], rounds: int) -> dict[str, float]:
    """Median seconds to authenticate each token (its row, its scopes parsed or found in the cache)."""
    from app.domain.scopes import scope_set
    from app.store import Database, tenancy

    db = Database(db_url, pool_size=2)
    found: dict[str, list[float]] = {name: [] for name in secrets}
    try:
        for i in range(rounds):
            for name in sorted(secrets, reverse=bool(i % 2)):
                started = time.perf_counter()
                token = tenancy.authenticate(db, secrets[name])
                assert token is not None
                scope_set(tuple(token.scopes))
                found[name].append(time.perf_counter() - started)
    finally:
        db.close()
    return {name: statistics.median(times) for name, times in found.items()}


def run(database_url: str, count: int, cycles: int) -> dict[str, Any]:
    with Server(database_url) as server:
        ctl = {"Authorization": f"Bearer {CONTROL}"}
        tenant = requests.post(f"{server.base}/v1/api/tenants", json={"slug": "bench"}, headers=ctl, timeout=60)
        tenant.raise_for_status()
        plain, scoped = Client(server.base, "plain", None), Client(server.base, "scoped", scopes_for(count))
        control = Client(server.base, "control", None)
        common.log(f"POST a state of {count:,} instances")
        posted = plain.session.post(plain.backend, data=counted_state(1, count), timeout=600)
        posted.raise_for_status()
        serial = 1
        samples: dict[str, list[Sample]] = {"plain": [], "scoped": [], "control": []}
        clients = [plain, scoped, control]
        for c in range(cycles + 1):  # the first cycle of each warms the caches and is not counted
            for client in clients[c % 3:] + clients[:c % 3]:
                serial, sample = client.cycle(c % SCOPED_EXACT, f"v{c}-{client.name}", serial)
                if c:
                    samples[client.name].append(sample)
            if c % 10 == 0:
                common.log(f"cycle {c}/{cycles}")
        auth = authentication(server.url, {"plain": plain.secret, "scoped": scoped.secret,
                                           "control": control.secret}, 1000)
    return {name: {"grant": statistics.median(s.grant for s in found),
                   "commit": statistics.median(s.commit for s in found), "auth": auth[name]}
            for name, found in samples.items()}


def render(command: str, machine: list[tuple[str, str]], count: int, cycles: int, found: dict[str, Any],
           checks: tuple[float, float], load_after: str) -> str:
    plain, scoped, control = found["plain"], found["scoped"], found["control"]
    auth = scoped["auth"] - plain["auth"]

    def added(check: float, request: float) -> str:
        return f"{(check + auth) * 1e6:.0f} µs ({(check + auth) / request * 100:.2f}%)"

    rows = [[what, common.ms(plain[key]), common.ms(scoped[key]), f"{(scoped[key] / plain[key] - 1) * 100:+.1f}%",
             f"{(control[key] / plain[key] - 1) * 100:+.1f}%", f"{check * 1e6:.0f} µs", added(check, plain[key])]
            for what, key, check in (("grant (open a run, one instance)", "grant", checks[0]),
                                     ("one-instance commit", "commit", checks[1]))]
    return "\n".join([
        SECTION, "",
        f"What 200 address scopes on a token add to a grant and to a one-instance commit on a state of {count:,} "
        f"instances, against a token without scopes in the same run: {cycles} cycles per token, the two tokens "
        "alternating, medians at the client over HTTP. In process, medians of 2,000 rounds: the scope check, and "
        "what the scopes add in all (the check plus the authentication's extra cost: "
        f"{plain['auth'] * 1e6:.0f} µs without scopes, {scoped['auth'] * 1e6:.0f} µs with 200) with its share of "
        "the unscoped request.", "",
        f"Command: `{command}`", "",
        common.table(["", ""], machine + [("Load average at the end", load_after)]), "",
        common.table(["request", "no scopes (ms)", "200 scopes (ms)", "difference at the client",
                      "control: another unscoped token", "scope check", "added in the server"], rows), "",
        "The difference at the client is what the scopes add plus the noise of a busy machine between alternating "
        "cycles; the last column is what the scopes cost the server. Parsing the scopes happens once per distinct list "
        "(cached), and each check walks a glob index of the scopes, so its cost does not grow with their number.",
        "",
    ])


def main(argv: Sequence[str] | None = None) -> int:
    parser = common.bench_parser("scopes_bench", __doc__ or "", section=SECTION,
                                 quick_help="2,000 instances and a few cycles, prints only", json_help=None)
    parser.add_argument("--cycles", type=int, default=None, help="cycles per token (default: 150, --quick 6)")
    args = parser.parse_args(argv)
    out, command = common.start_run(args, "scopes_bench", argv)
    count, cycles = (2000, args.cycles or 6) if args.quick else (50_000, args.cycles or 150)
    machine = common.machine_info(args.database_url)
    found = run(args.database_url, count, cycles)
    checks = in_process(2000)
    section = render(command, machine, count, cycles, found, checks, common.load_average())
    common.publish(out, SECTION, section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
