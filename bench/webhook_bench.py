"""Webhook benchmark: bursts of signed GitHub ``pull_request`` deliveries against a real server and Redis.

Run from the repository root:

    .venv/bin/python -m bench.webhook_bench                  # full size, rewrites its section in docs/benchmarks.md
    .venv/bin/python -m bench.webhook_bench --quick          # smoke test, prints only
    .venv/bin/python -m bench.webhook_bench --out /tmp/w.md  # full size, section written elsewhere

Each delivery is GitHub's published ``pull_request`` ``synchronize`` example with its own PR number and
head SHA, signed with ``X-Hub-Signature-256`` and sent with its own ``X-GitHub-Delivery``, so each one is
verified, recorded in Postgres and enqueued as its own RQ job. A **burst** sends 100 at once, each on its
own connection (as GitHub connects per delivery), all opened at one instant from asyncio event loops in
spawned client processes (so the clients never share an interpreter with the server and cost the cores
little); the time is the client's, from connecting to the end of the answer. Measured, after a warm-up
burst: bursts of new deliveries, the same deliveries again (redeliveries: acknowledged, nothing enqueued),
and one delivery at a time for the floor. Two servers: the real Flask app on a threaded werkzeug server
inside this process (as the other benches), and gunicorn (gthread) in its own processes, as in production.

The scratch database comes from ``bench.backend_bench.Harness``. Redis is the machine's (``--redis-url``,
default ``redis://127.0.0.1:6379/7``): the database index must be empty at the start, and is emptied at the
end. Any answer other than 202 (new) or 200 "already processed" (redelivery), a job missing from the queue
or a delivery not recorded as queued aborts with exit status 1 and writes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import http.client
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import redis
import requests
from rq import Queue
from werkzeug.serving import make_server

from app.config import Settings
from app.queue import QUEUE_NAME
from app.web import create_app
from bench import common
from bench.backend_bench import Harness
from bench.common import DEFAULT_OUT, REPO, BenchError, log, ms, table

DEFAULT_REDIS = "redis://127.0.0.1:6379/7"
SECTION = "## Webhook"
SECRET = "bench-" + "s" * 32
PAYLOAD = REPO / "tests" / "fixtures" / "webhooks" / "pull_request" / "synchronize.payload.json"
TARGET_P99 = 0.200
GUNICORN_WORKERS = 2
GUNICORN_THREADS = 16

perf = time.perf_counter


@dataclass(frozen=True)
class Sizes:
    burst: int
    rounds: int
    sequential: int


FULL = Sizes(burst=100, rounds=5, sequential=100)
QUICK = Sizes(burst=100, rounds=1, sequential=20)


@dataclass
class Delivery:
    delivery_id: str
    body: bytes
    headers: dict[str, str]
    number: int


@dataclass
class Cell:
    server: str
    kind: str          # burst, redelivery burst, sequential
    rounds: int
    latencies: list[float] = field(default_factory=list)
    per_round_p99: list[float] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)
    cpu_per_delivery: float = 0.0  # server CPU seconds per delivery in the bursts (user + system)


def pct(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


class Deliveries:
    """Signed ``synchronize`` deliveries, each with its own PR number, head SHA and delivery id."""

    def __init__(self) -> None:
        self.template = json.loads(PAYLOAD.read_bytes())
        self.next_number = 1000

    def make(self, n: int) -> list[Delivery]:
        made = []
        for _ in range(n):
            self.next_number += 1
            doc = json.loads(json.dumps(self.template))
            sha = hashlib.sha1(f"bench-{self.next_number}-{uuid.uuid4()}".encode()).hexdigest()
            doc["number"] = doc["pull_request"]["number"] = self.next_number
            doc["pull_request"]["head"]["sha"] = doc["after"] = sha
            body = json.dumps(doc).encode()
            delivery_id = str(uuid.uuid4())
            signature = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
            made.append(Delivery(delivery_id, body, {
                "X-GitHub-Event": "pull_request", "X-GitHub-Delivery": delivery_id,
                "X-Hub-Signature-256": signature, "Content-Type": "application/json",
                "User-Agent": "GitHub-Hookshot/bench"}, self.next_number))
        return made


def send(url: str, delivery: Delivery, expect: int) -> float:
    """One delivery on a fresh connection; the client-side time to the end of the answer."""
    parts = urlsplit(url)
    started = perf()
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=60)
    try:
        connection.request("POST", parts.path, body=delivery.body, headers=delivery.headers)
        response = connection.getresponse()
        content = response.read()
    except OSError as exc:
        raise BenchError(f"delivery {delivery.delivery_id} failed: {exc}") from exc
    finally:
        connection.close()
    elapsed = perf() - started
    if response.status != expect:
        raise BenchError(f"delivery {delivery.delivery_id} answered HTTP {response.status}, expected {expect}: "
                         f"{content[:300]!r}")
    return elapsed


async def _send_async(host: str, port: int, path: str, delivery: Delivery, expect: int) -> float:
    """One delivery on its own connection (asyncio), the client-side time to the end of the answer."""
    started = perf()
    reader, writer = await asyncio.open_connection(host, port)
    head = "".join(f"{k}: {v}\r\n" for k, v in delivery.headers.items())
    writer.write(f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: {len(delivery.body)}\r\n"
                 f"Connection: close\r\n{head}\r\n".encode() + delivery.body)
    await writer.drain()
    # The answer ends at Content-Length, as for any HTTP client; the server's close may come later.
    head_bytes = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head_bytes.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    answer = head_bytes + await reader.readexactly(length)
    elapsed = perf() - started
    writer.close()
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0
    if status != expect:
        raise BenchError(f"delivery {delivery.delivery_id} answered HTTP {status}, expected {expect}: "
                         f"{answer[:300]!r}")
    return elapsed


def _client_share(url: str, deliveries: list[Delivery], expect: int, start_at: float) -> list[float] | str:
    """Runs in a client process: send this share at once from one event loop, starting at ``start_at``
    (an event loop, not a thread per delivery, so the client costs the shared cores little)."""
    parts = urlsplit(url)

    async def share() -> list[float]:
        await asyncio.sleep(max(start_at - time.time(), 0.0))
        return list(await asyncio.gather(*(_send_async(parts.hostname or "127.0.0.1", parts.port or 80, parts.path,
                                                       d, expect) for d in deliveries)))

    try:
        return asyncio.run(share())
    except (BenchError, OSError, asyncio.IncompleteReadError) as exc:
        return f"{exc.__class__.__name__}: {exc}"


class Clients:
    """Client processes (spawned, so no server thread or pool is forked), each sending its share of a
    burst from its own threads: the clients' work never competes for the server's interpreter."""

    def __init__(self, processes: int) -> None:
        self.processes = processes
        self.pool = multiprocessing.get_context("spawn").Pool(processes)

    def burst(self, url: str, deliveries: list[Delivery], expect: int) -> tuple[list[float], float]:
        shares = [deliveries[i::self.processes] for i in range(self.processes)]
        start_at = time.time() + 1.0  # every process and thread is waiting by then
        results = self.pool.starmap(_client_share, [(url, share, expect, start_at) for share in shares])
        wall_end = time.time()
        latencies: list[float] = []
        for result in results:
            if isinstance(result, str):
                raise BenchError(result)
            latencies += result
        return latencies, max(wall_end - start_at, 0.0)

    def close(self) -> None:
        self.pool.close()
        self.pool.join()


class Checker:
    """Verifies that what the server answered is what it did: jobs queued, deliveries recorded."""

    def __init__(self, redis_url: str, database_url: str) -> None:
        self.redis = redis.Redis.from_url(redis_url)
        self.database_url = database_url

    def check(self, deliveries: list[Delivery]) -> None:
        queue = Queue(QUEUE_NAME, connection=self.redis, serializer="rq.serializers.JSONSerializer")
        queued = set(queue.get_job_ids())
        numbers = {d.number for d in deliveries}
        found = {int(job.kwargs["number"]) for job in queue.jobs if int(job.kwargs.get("number", 0)) in numbers}
        if found != numbers or len(queued) < len(numbers):
            raise BenchError(f"{len(numbers - found)} of {len(numbers)} jobs missing from the queue")
        import psycopg

        with psycopg.connect(self.database_url) as conn:
            row = conn.execute("SELECT count(*) FROM webhook_deliveries WHERE delivery_id = ANY(%s) "
                               "AND status = 'queued' AND cardinality(job_ids) = 1",
                               ([d.delivery_id for d in deliveries],)).fetchone()
        if row is None or row[0] != len(deliveries):
            raise BenchError(f"{row[0] if row else 0} of {len(deliveries)} deliveries recorded as queued")

    def queue_length(self) -> int:
        return int(Queue(QUEUE_NAME, connection=self.redis, serializer="rq.serializers.JSONSerializer").count)


def measure(server: str, url: str, sz: Sizes, made: Deliveries, checker: Checker, clients: Clients,
            cpu: Callable[[], float], log: Callable[[str], None]) -> list[Cell]:
    # Warm-up, not measured: code paths, the server's threads, and the Postgres pool, which opens its
    # connections on demand (a server that has seen traffic has them open).
    warm = made.make(10)
    for d in warm:
        send(url, d, 202)
    checker.check(warm)
    warm = made.make(sz.burst)
    clients.burst(url, warm, 202)
    checker.check(warm)

    sequential = Cell(server, "one at a time", 1)
    seq = made.make(sz.sequential)
    started = perf()
    sequential.latencies = [send(url, d, 202) for d in seq]
    sequential.wall.append(perf() - started)
    checker.check(seq)
    log(f"  {server}, sequential x{sz.sequential}: p50 {ms(pct(sequential.latencies, 50))} ms, "
        f"p99 {ms(pct(sequential.latencies, 99))} ms")

    bursts = Cell(server, f"burst of {sz.burst} new", sz.rounds)
    redeliveries = Cell(server, f"burst of {sz.burst} redeliveries", sz.rounds)
    for r in range(sz.rounds):
        batch = made.make(sz.burst)
        cpu_before = cpu()
        latencies, wall = clients.burst(url, batch, 202)
        bursts.cpu_per_delivery += (cpu() - cpu_before) / (sz.burst * sz.rounds)
        checker.check(batch)
        bursts.latencies += latencies
        bursts.per_round_p99.append(pct(latencies, 99))
        bursts.wall.append(wall)
        log(f"  {server}, burst {r + 1}/{sz.rounds}: p50 {ms(pct(latencies, 50))} ms, p99 {ms(pct(latencies, 99))} "
            f"ms, max {ms(max(latencies))} ms, all {sz.burst} in {ms(wall)} ms")
        before = checker.queue_length()
        latencies, wall = clients.burst(url, batch, 200)
        if checker.queue_length() != before:
            raise BenchError("redeliveries enqueued jobs")
        redeliveries.latencies += latencies
        redeliveries.per_round_p99.append(pct(latencies, 99))
        redeliveries.wall.append(wall)
    return [bursts, redeliveries, sequential]


# --- servers ------------------------------------------------------------------------------------


class InProcess:
    """The app on a threaded werkzeug server in this process, over the Harness's scratch database."""

    def __init__(self, database_url: str, redis_url: str) -> None:
        settings = Settings(database_url=database_url, auto_migrate=False, log_level="WARNING",
                            github_webhook_secret=SECRET, redis_url=redis_url,
                            github_repositories=("Codertocat/Hello-World",))
        self.app = create_app(settings)
        self.pool_size = settings.db_pool_size
        port = common.free_port()
        self.httpd = make_server("127.0.0.1", port, self.app, threaded=True)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{port}/webhooks/github"

    def cpu(self) -> float:
        """CPU seconds of this process: the server's threads (the client processes are elsewhere)."""
        return time.process_time()

    def close(self) -> None:
        self.httpd.shutdown()
        self.thread.join(timeout=10)
        self.app.extensions["kilolock"].db.close()


class Gunicorn:
    """gunicorn (gthread) serving ``app.web:create_app()`` in its own process group."""

    def __init__(self, database_url: str, redis_url: str) -> None:
        port = common.free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("KL_")}
        env.update({"KL_DATABASE_URL": database_url, "KL_REDIS_URL": redis_url, "KL_AUTO_MIGRATE": "false",
                    "KL_GITHUB_WEBHOOK_SECRET": SECRET, "KL_LOG_LEVEL": "WARNING",
                    "KL_DB_POOL_SIZE": str(GUNICORN_THREADS)})
        command = [str(Path(sys.executable).with_name("gunicorn")), "--bind", f"127.0.0.1:{port}",
                   "--workers", str(GUNICORN_WORKERS), "--threads", str(GUNICORN_THREADS), "--worker-class",
                   "gthread", "--backlog", "256", "--log-level", "warning", "app.web:create_app()"]
        self.proc = subprocess.Popen(command, cwd=REPO, env=env, start_new_session=True,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.url = f"http://127.0.0.1:{port}/webhooks/github"
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise BenchError("gunicorn did not start: " + (self.proc.stderr.read().decode()[-2000:]
                                                               if self.proc.stderr else ""))
            time.sleep(0.1)

    def cpu(self) -> float:
        """CPU seconds (user + system) of the gunicorn master and its workers, from /proc."""
        tick = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            pid, ppid = int(stat.parent.name), int(fields[1])
            if pid == self.proc.pid or ppid == self.proc.pid:
                total += (int(fields[11]) + int(fields[12])) / tick
        return total

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


# --- report -------------------------------------------------------------------------------------


def results_table(cells: Sequence[Cell]) -> str:
    rows = []
    for c in cells:
        rows.append([c.server, c.kind, str(len(c.latencies)), ms(pct(c.latencies, 50)), ms(pct(c.latencies, 95)),
                     ms(pct(c.latencies, 99)), ms(max(c.latencies)),
                     ", ".join(ms(p) for p in c.per_round_p99) or "–",
                     ms(statistics.median(c.wall)) if c.wall else "–",
                     f"{c.cpu_per_delivery * 1e3:.2f}" if c.cpu_per_delivery else "–"])
    return table(["server", "deliveries", "n", "p50 ms", "p95 ms", "p99 ms", "max ms", "p99 per burst ms",
                  "wall per burst ms (median)", "server CPU ms per delivery"], rows)


def render(command: str, machine: list[tuple[str, str]], sz: Sizes, cells: Sequence[Cell], elapsed: float,
           pool_size: int, processes: int) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    bursts = [c for c in cells if c.kind.endswith("new")]
    cpu_text = ", ".join(f"{c.server} {c.cpu_per_delivery * 1e3:.2f} ms" for c in bursts)
    verdicts = "; ".join(
        f"{c.server}: p99 {ms(pct(c.latencies, 99))} ms over all {len(c.latencies)} deliveries "
        f"({'meets' if pct(c.latencies, 99) < TARGET_P99 else 'misses'} the target), "
        f"{sum(p < TARGET_P99 for p in c.per_round_p99)} of {len(c.per_round_p99)} bursts with p99 under "
        f"{TARGET_P99 * 1000:.0f} ms" for c in bursts)
    machine_rows = table(["", ""], [[k, v] for k, v in machine])
    text = f"""{SECTION}

Produced by `bench/webhook_bench.py` on {when} in {elapsed:.0f} s (see `bench/README.md`). Target: a burst of
{sz.burst} webhook deliveries answered with p99 < {TARGET_P99 * 1000:.0f} ms. Result: {verdicts}.

Each delivery is GitHub's published `pull_request` `synchronize` example with its own PR number and head SHA,
signed (`X-Hub-Signature-256`) with its own `X-GitHub-Delivery`, so every one is verified, recorded in
Postgres (`webhook_deliveries`) and enqueued as its own RQ job on the machine's Redis; after each burst the
script checks that all {sz.burst} jobs are on the queue and all deliveries are recorded as queued. A burst
sends {sz.burst} at once: every delivery on its own connection (as GitHub connects per delivery), all
opened at one instant from asyncio event loops in {processes} spawned client processes (so the client never
competes for the server's interpreter, and costs the shared cores little). Times are the client's, connect
to end of answer, {sz.rounds} bursts per server, after a warm-up burst that is not measured (the Postgres
pool opens its connections on demand; a server that has seen traffic has them open). The same {sz.burst} are
then redelivered in a burst (answered 200
"already processed", nothing enqueued). "One at a time" is {sz.sequential} deliveries in sequence, the floor
without contention.

Servers: **werkzeug**, the real app on a threaded werkzeug server inside the benchmark process (as the
other benches; Postgres pool {pool_size}); **gunicorn**, `gunicorn --worker-class gthread --workers
{GUNICORN_WORKERS} --threads {GUNICORN_THREADS} 'app.web:create_app()'` in its own processes (pool
{GUNICORN_THREADS} per worker), as in production.

Command: `{command}`

### Machine

{machine_rows}

### Results

{results_table(cells)}

### Reading

The request does three things: an HMAC-SHA256 of the body, one short Postgres transaction (record the
delivery, enqueue, mark it queued with its job id; one commit) and a few Redis round trips (RQ looks the job
id up, then enqueues). No GitHub API call, git or Terraform runs in the request. One delivery alone takes
the "one at a time" time; under a burst the rest is waiting for a CPU: the {os.cpu_count()} cores are shared by the
server, Postgres, Redis and the client processes, and each delivery costs the server process(es) the CPU
time in the last column ({cpu_text}; Flask, psycopg, RQ), so a burst of {sz.burst} needs {sz.burst} times that
on the server's interpreters (one for werkzeug, {GUNICORN_WORKERS} for gunicorn) before the last answer.
Bursts that ran while other work loaded the machine (see the load averages) take longer; compare bursts of
one run. Redeliveries stop after the `INSERT … ON CONFLICT` finds the delivery, and never touch Redis.
"""
    return _wrap(text)


def _wrap(text: str, width: int = 110) -> str:
    """Re-flow the prose paragraphs (tables, headings and the command line stay as they are)."""
    out = []
    for block in text.split("\n\n"):
        first = block.lstrip()
        if first.startswith(("|", "#", "```", "Command:")):
            out.append(block)
        else:
            out.append(textwrap.fill(" ".join(block.split()), width=width, break_on_hyphens=False,
                                     break_long_words=False))
    return "\n\n".join(out)


# --- main ---------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = common.bench_parser("webhook_bench", __doc__ or "", section=SECTION, default_out=DEFAULT_OUT,
                     quick_help="one burst per server; writes no document unless --out",
                     json_help="also dump every raw latency as JSON here")
    p.add_argument("--redis-url", default=os.environ.get("KL_BENCH_REDIS_URL", DEFAULT_REDIS),
                   help="Redis database for the queue; must be empty, and is emptied at the end "
                        "(default: %(default)s)")
    p.add_argument("--client-processes", type=int, default=2,
                   help="processes the burst's client threads are spread over (default: %(default)s)")
    p.add_argument("--servers", default="werkzeug,gunicorn", help="which servers to run (default: %(default)s)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sz = QUICK if args.quick else FULL
    out, command = common.start_run(args, "webhook_bench", argv)

    queue_redis = redis.Redis.from_url(args.redis_url)
    try:
        if queue_redis.dbsize():
            log(f"benchmark refused: {args.redis_url} is not empty; point --redis-url at an unused database index")
            return 1
    except redis.RedisError as exc:
        log(f"benchmark failed: Redis at {args.redis_url} is unreachable: {exc}")
        return 1
    started = perf()
    cells: list[Cell] = []
    pool_size = Settings().db_pool_size
    try:
        machine = common.machine_info(args.database_url)
        machine.append(("Redis (INFO server)", str(queue_redis.info("server").get("redis_version", "?"))))
        with Harness(args.database_url) as h:
            log(f"scratch database {h.dbname}")
            checker = Checker(args.redis_url, h.url)
            made = Deliveries()
            clients = Clients(args.client_processes)
            for server in [s.strip() for s in args.servers.split(",") if s.strip()]:
                running: InProcess | Gunicorn = (InProcess(h.url, args.redis_url) if server == "werkzeug"
                                                 else Gunicorn(h.url, args.redis_url))
                try:
                    log(f"{server} at {running.url}")
                    cells += measure(server, running.url, sz, made, checker, clients, running.cpu, log)
                finally:
                    running.close()
            clients.close()
    except BenchError as exc:
        log(f"benchmark failed: {exc}")
        return 1
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    finally:
        queue_redis.flushdb()
        queue_redis.close()
    elapsed = perf() - started
    machine.append(("Load average at end", common.load_average()))
    print(results_table(cells))
    if args.json is not None:
        args.json.write_text(json.dumps([{"server": c.server, "kind": c.kind, "latencies": c.latencies,
                                          "wall": c.wall} for c in cells], indent=1))
    if out is not None:
        section = render(command, machine, sz, cells, elapsed, pool_size, args.client_processes)
        common.write_section(out, SECTION, section)
        log(f"wrote the '{SECTION}' section of {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
