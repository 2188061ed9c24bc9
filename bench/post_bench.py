"""Whole-state POST benchmark: Terraform's ``POST /v1/states/NAME`` of a large state beside its floor.

Run from the repository root:

    .venv/bin/python -m bench.post_bench                                 # 50k and 200k, 3 rounds; rewrites its section
    .venv/bin/python -m bench.post_bench --sizes 50000 --rounds 1 --out /tmp/p.md   # one size, one round

For each size it builds three bodies with the project's generator (``bench.states.counted_state``: one
``terraform_data``-shaped resource with N instances): serial 1, serial 2 with every instance's value changed,
and serial 3 with one instance changed. It creates a scratch database (``bench.backend_bench``'s ``Harness``),
serves the app with gunicorn in its own process (``bench.body_memory_bench.start_server``, one worker) and,
each round, times over HTTP: the first POST into an empty state, the POST that replaces every row, and the
POST that changes one instance; then it deletes the state (not timed). Each answer is checked (status, and a
GET returning the last body's bytes). The floor is ``json.loads`` + ``hashlib.sha256`` of the serial-1 body in
the benchmark process, best of 3, measured again each round. The report gives the median of the rounds, the
range, and each median's ratio to the median floor of the same run.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import requests

from bench import common
from bench.backend_bench import Harness
from bench.body_memory_bench import start_server, stop_server
from bench.common import BenchError, log, table
from bench.scale_bench import POST_TARGET, best_of, mb, s, timed_request
from bench.states import counted_state

SECTION = "## Whole-state POST of large states"
DEFAULT_SIZES = "50000,200000"
perf = time.perf_counter


@dataclass
class PostResult:
    instances: int
    body_bytes: int = 0
    load: str = ""
    floor: list[float] = field(default_factory=list)
    empty: list[float] = field(default_factory=list)
    every_new: list[float] = field(default_factory=list)
    one_changed: list[float] = field(default_factory=list)


def measure(database_url: str, n: int, rounds: int) -> PostResult:
    res = PostResult(instances=n, load=common.load_average())
    first = counted_state(1, n)
    every = counted_state(2, n, value="w")
    one = counted_state(3, n, value="w", changed=n // 2)
    res.body_bytes = len(first)
    with Harness(database_url) as h:
        server = start_server(h.url, max_large_bodies=2, large_body_bytes=8 * 1024 * 1024)
        try:
            session = requests.Session()
            for k in range(rounds):
                res.floor.append(best_of(3, lambda: (json.loads(first), hashlib.sha256(first).digest())))
                url = f"{server.url}/v1/states/post-{k}"
                res.empty.append(timed_request(session, "POST", url, body=first)[0])
                res.every_new.append(timed_request(session, "POST", url, body=every)[0])
                res.one_changed.append(timed_request(session, "POST", url, body=one)[0])
                if timed_request(session, "GET", url)[1] != one:
                    raise BenchError("GET of the POSTed head did not return its bytes")
                timed_request(session, "DELETE", url)
                log(f"  {n} round {k + 1}: floor {res.floor[-1]:.2f}s, empty {res.empty[-1]:.2f}s, "
                    f"every row new {res.every_new[-1]:.2f}s, one changed {res.one_changed[-1]:.2f}s "
                    f"(load {common.load_average()})")
        finally:
            stop_server(server)
    return res


def spread(values: Sequence[float]) -> str:
    return f"{s(statistics.median(values))} ({s(min(values))}-{s(max(values))})"


def rows(r: PostResult) -> list[list[str]]:
    floor = statistics.median(r.floor)
    out = [["`json.loads` + sha256 of the body (the floor)", spread(r.floor), "1.00x", "-"]]
    for label, runs in (("first POST into an empty state", r.empty), ("POST replacing every row", r.every_new),
                        ("POST changing one instance", r.one_changed)):
        x = statistics.median(runs) / floor
        verdict = "met" if x <= POST_TARGET else "MISSED"
        out.append([label, spread(runs), f"{x:.2f}x", f"<= {POST_TARGET:g}x: {verdict}"])
    return out


def render(command: str, machine: list[tuple[str, str]], results: Sequence[PostResult], rounds: int) -> str:
    parts = [
        SECTION, "",
        f"Produced by `bench/post_bench.py` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: gunicorn with "
        "one worker over a scratch database, driven over HTTP; one `terraform_data`-shaped resource with N "
        f"instances. Median of {rounds} rounds (range in brackets); ratio = median POST / median floor of the "
        "same run.", "",
        "### Machine", "", table(["", "value"], [list(m) for m in machine]), "",
        "### Command", "", "```", command, "```", "",
    ]
    for r in results:
        parts += [f"### {r.instances:,} instances ({mb(r.body_bytes)})", "", f"Load average before: {r.load}.", "",
                  table(["measure", "time", "ratio to floor", "target"], rows(r)), ""]
    return "\n".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    p = common.bench_parser("post_bench", __doc__ or "", section=SECTION, json_help=None)
    p.add_argument("--sizes", default=DEFAULT_SIZES, help="instance counts, comma separated (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="rounds per size (default: %(default)s)")
    args = p.parse_args(argv)
    out, command = common.start_run(args, "post_bench", argv)

    def body() -> None:
        machine = common.machine_info(args.database_url)
        results = [measure(args.database_url, int(x), args.rounds) for x in args.sizes.split(",") if x.strip()]
        machine.append(("Load average at end", common.load_average()))
        common.publish(out, SECTION, render(command, machine, results, args.rounds))

    return common.guarded("post_bench", body)

if __name__ == "__main__":
    sys.exit(main())
