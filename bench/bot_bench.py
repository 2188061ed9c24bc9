"""Bot benchmark: from a pull request's webhook to the bot's footprint comment, on a 10,000-instance state.

Run from the repository root:

    .venv/bin/python -m bench.bot_bench                  # full size, rewrites its section in docs/benchmarks.md
    .venv/bin/python -m bench.bot_bench --quick          # 1,000 instances, 3 pull requests; prints only
    .venv/bin/python -m bench.bot_bench --out /tmp/b.md  # full size, section written elsewhere

Everything is real except GitHub: the Flask app (webhook and engine lane) on a loopback port over a scratch
Postgres database (``bench.backend_bench.Harness``), the machine's Redis (``--redis-url``, default
``redis://127.0.0.1:6379/6``, which must be empty and is emptied at the end), one forking ``kl worker`` in
its own process with the production defaults (App mode, PyGithub's one-second pause between writes), a bare
origin repository the worker clones through ``KL_GITHUB_CLONE_URLS``, and the embedded Terraform for the plan
preview. GitHub's API is ``bench.github_sim`` served on a loopback port, which timestamps every call.

The trunk: 50 files ``svc_NN.tf``, each one ``terraform_data`` with ``count = 200`` (10,000 instances; the
state is uploaded through the backend lane), plus ``network.tf``, which ``svc_00`` depends on. Pull request
``k`` edits ``svc_k.tf`` (all 200 instances change). For each, the clock starts when the signed
``pull_request`` ``opened`` delivery is sent, and stops when the worker's request creating the comment
reaches GitHub (**footprint comment**), when ``kilolock/footprint`` completes, and when the comment is
edited with the plan preview (**plan preview**: a file-scoped plan of 200 instances). Pull requests are sent
one after another, each after the previous preview finished; the first one finds the worker's mirror cache
empty (clone), the others fetch. Then the footprint's parts are timed in this process on the same checkout.
The target is a footprint comment within 10 s on the 10,000-instance state.

A comment or check that does not say what the change must produce (the ``svc_k`` write globs, 200 updates)
aborts the run with status 1 and writes nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis
import requests
from rq import Worker
from werkzeug.serving import make_server

from app.config import Settings
from app.web import create_app
from bench import common, webhooks
from bench.backend_bench import Harness
from bench.common import DEFAULT_OUT, BenchError, log, table
from bench.github_sim import APP_ID, GitHubSim
from bench.states import instance, resource, state

SECTION = "## Bot"
DEFAULT_REDIS = "redis://127.0.0.1:6379/6"
REPO = "bench-org/infra"
TARGET_SECONDS = 10.0
REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Sizes:
    files: int
    count: int
    prs: int

    @property
    def instances(self) -> int:
        return self.files * self.count + 1


FULL = Sizes(files=50, count=200, prs=6)
QUICK = Sizes(files=10, count=100, prs=3)


@dataclass
class Measured:
    number: int
    webhook_ms: float
    first_write_s: float
    comment_s: float
    footprint_check_s: float
    preview_s: float
    cold: bool


@dataclass
class Parts:
    rows: list[tuple[str, float]] = field(default_factory=list)


def git(cwd: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-c", "user.name=Bench", "-c", "user.email=bench@example.com", "-c",
                           "commit.gpgsign=false", *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise BenchError(f"git {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def svc(n: int, count: int, version: str = "") -> str:
    deps = "\n  depends_on = [terraform_data.net]" if n == 0 else ""
    return (f'resource "terraform_data" "svc_{n:02d}" {{\n  count = {count}\n'
            f'  input = "${{local.prefix}}-{n:02d}-${{count.index}}{version}"{deps}\n}}\n')


def trunk_state(sz: Sizes) -> bytes:
    resources = [resource("net", [instance(None, "prod-app-net")])]
    for n in range(sz.files):
        deps = ["terraform_data.net"] if n == 0 else []
        resources.append(resource(f"svc_{n:02d}", [instance(i, f"prod-app-{n:02d}-{i}", deps=deps)
                                                  for i in range(sz.count)]))
    return state(1, resources)


class World:
    """The server with the webhook, the origin repository, the served GitHub and one forking worker."""

    def __init__(self, h: Harness, redis_url: str, tmp: Path, sz: Sizes) -> None:
        self.h, self.redis_url, self.tmp, self.sz = h, redis_url, tmp, sz
        settings = Settings(database_url=h.url, auto_migrate=False, log_level="WARNING",
                            github_webhook_secret=webhooks.SECRET, redis_url=redis_url,
                            github_repositories=(REPO,))
        self.app = create_app(settings)
        self.httpd = make_server("127.0.0.1", 0, self.app, threaded=True)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"
        self.sim, self.stop_sim = GitHubSim.served(REPO, mode="app")
        self.sim.permissions["alice"] = "write"  # the pull requests' author: a writer, so previews run
        self.work, self.origin = tmp / "work", tmp / "origin.git"
        self.worker: subprocess.Popen[str] | None = None

    def close(self) -> None:
        if self.worker is not None and self.worker.poll() is None:
            self.worker.send_signal(signal.SIGTERM)
            try:
                self.worker.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.worker.kill()
        self.stop_sim()
        self.httpd.shutdown()
        self.thread.join(timeout=10)
        self.app.extensions["kilolock"].db.close()

    def build_repository(self) -> None:
        self.work.mkdir()
        address = f"{self.url}/v1/states/bench"
        files = {"backend.tf": f'terraform {{\n  backend "http" {{\n    address = "{address}"\n  }}\n}}\n',
                 "variables.tf": 'locals {\n  prefix = "prod-app"\n}\n',
                 "network.tf": 'resource "terraform_data" "net" {\n  input = "${local.prefix}-net"\n}\n'}
        files.update({f"svc_{n:02d}.tf": svc(n, self.sz.count) for n in range(self.sz.files)})
        for name, text in files.items():
            (self.work / name).write_text(text)
        git(self.work, "init", "-q", "-b", "main")
        git(self.work, "add", "-A")
        git(self.work, "commit", "-qm", "trunk")
        git(self.tmp, "init", "-q", "--bare", "-b", "main", str(self.origin))
        git(self.work, "remote", "add", "origin", str(self.origin))
        git(self.work, "push", "-q", "origin", "main")
        body = trunk_state(self.sz)
        answer = requests.post(address, data=body, timeout=600)
        if answer.status_code != 200:
            raise BenchError(f"uploading the trunk answered {answer.status_code}: {answer.text[:300]}")
        log(f"trunk: {self.sz.instances:,} instances, {len(body) / 1e6:.1f} MB")

    def env(self) -> dict[str, str]:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
        rc = self.tmp / "terraformrc"
        rc.write_text("")
        keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TMPDIR")}
        return {**keep, "HOME": str(self.tmp), "KL_DATABASE_URL": self.h.url, "KL_REDIS_URL": self.redis_url,
                "KL_GITHUB_APP_ID": APP_ID, "KL_GITHUB_PRIVATE_KEY": pem, "KL_GITHUB_API_URL": self.sim.base_url,
                "KL_GITHUB_CLONE_URLS": f"{REPO}={self.origin}", "KL_REPO_CACHE_DIR": str(self.tmp / "cache"),
                "KL_DATA_DIR": str(self.tmp / "kl-data"), "KL_LOG_LEVEL": "WARNING",
                "KL_TERRAFORM_BIN": str(Path(sys.executable).with_name("kl-terraform")),
                "TF_CLI_CONFIG_FILE": str(rc), "CHECKPOINT_DISABLE": "1", "TF_IN_AUTOMATION": "1"}

    def start_worker(self) -> None:
        kl = str(Path(sys.executable).with_name("kl"))
        self.worker = subprocess.Popen([kl, "worker", "--name", f"bench-{os.getpid()}"], env=self.env(),
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        connection = redis.Redis.from_url(self.redis_url)
        deadline = time.monotonic() + 60
        while not Worker.all(connection=connection):
            if self.worker.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"kl worker did not start: {self.worker.stdout.read() if self.worker.stdout else ''}")
            time.sleep(0.1)

    def open_pr(self, number: int) -> Measured:
        n = number % self.sz.files
        branch = f"svc-{n:02d}-v2"
        git(self.work, "checkout", "-q", "-b", branch, "main")
        (self.work / f"svc_{n:02d}.tf").write_text(svc(n, self.sz.count, "-v2"))
        git(self.work, "commit", "-qam", f"svc {n} v2")
        git(self.work, "push", "-q", "origin", branch)
        head = git(self.work, "rev-parse", "HEAD")
        git(self.work, "checkout", "-q", "main")
        self.sim.open_pr(number, head_sha=head, head_ref=branch, base_sha=git(self.work, "rev-parse", "main"))
        doc = webhooks.payload("pull_request/opened")
        doc["number"] = number
        doc["pull_request"].update(number=number)
        doc["pull_request"]["head"].update(sha=head, ref=branch)
        doc["pull_request"]["base"].update(ref="main")
        doc["repository"].update(full_name=REPO, default_branch="main")
        body = webhooks.encode(doc)
        started = time.monotonic()
        answer = requests.post(f"{self.url}/webhooks/github", data=body, timeout=30,
                               headers=webhooks.headers("pull_request", body))
        webhook_ms = (time.monotonic() - started) * 1e3
        if answer.status_code != 202:
            raise BenchError(f"the webhook answered {answer.status_code}: {answer.text[:300]}")
        comment = self.wait(lambda: self.first(number, "POST", rf"/issues/{number}/comments$"), "the comment")
        first_write = self.wait(lambda: self.first(number, "POST", r"/check-runs$", head), "the first check")
        footprint = self.wait(lambda: self.completed(head, "kilolock/footprint"), "kilolock/footprint")
        self.wait(lambda: self.completed(head, "kilolock/plan"), "kilolock/plan")
        preview = self.wait(lambda: self.edited_with(number, f"{self.sz.count} to update"),
                            "the comment with the preview")
        self.check(number, head, n)
        return Measured(number, webhook_ms, first_write - started, comment - started, footprint - started,
                        preview - started, cold=number == 1)

    def wait(self, found: Any, what: str, timeout: float = 300) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            at = found()
            if at is not None:
                return float(at)
            if self.worker is not None and self.worker.poll() is not None:
                raise BenchError(f"the worker exited while waiting for {what}")
            time.sleep(0.02)
        raise BenchError(f"timed out waiting for {what}")

    def first(self, number: int, method: str, pattern: str, sha: str | None = None) -> float | None:
        hits = [c.at for c in list(self.sim.calls) if c.method == method and re.search(pattern, c.path)
                and c.status < 300 and (sha is None or (c.body or {}).get("head_sha") == sha)]
        return hits[0] if hits else None

    def edited_with(self, number: int, text: str) -> float | None:
        ids = {f"/issues/comments/{c['id']}" for c in self.sim.pr_comments(number)}
        hits = [c.at for c in list(self.sim.calls) if c.method == "PATCH" and any(c.path.endswith(i) for i in ids)
                and text in str((c.body or {}).get("body", ""))]
        return hits[-1] if hits else None

    def completed(self, sha: str, name: str) -> float | None:
        for call in list(self.sim.calls):
            body = call.body or {}
            if call.method == "PATCH" and "/check-runs/" in call.path and body.get("status") == "completed":
                run = self.sim.check_runs.get(int(call.path.rsplit("/", 1)[1]))
                if run is not None and run["head_sha"] == sha and run["name"] == name:
                    return call.at
        return None

    def check(self, number: int, head: str, n: int) -> None:
        body = self.sim.bot_comment(number)
        if f"| write | `terraform_data.svc_{n:02d}.*` |" not in body:
            raise BenchError(f"PR #{number}'s comment lacks the write glob of svc_{n:02d}:\n{body[:2000]}")
        if f"{self.sz.count} to update" not in body:
            raise BenchError(f"PR #{number}'s comment lacks the preview's {self.sz.count} updates:\n{body[:3000]}")
        runs = {r["name"]: r for r in self.sim.runs(sha=head)}
        if {r.get("conclusion") for r in runs.values()} != {"success"}:
            raise BenchError(f"PR #{number}'s checks did not succeed: {runs}")


def time_parts(world: World) -> Parts:
    """The footprint job's parts, timed in this process on the warm mirror (no GitHub)."""
    from analyzer.hcl import ParseCache
    from runner.bot import flow as botflow
    from runner.bot.config import load
    from runner.core import git as rgit
    from runner.core.filescoped import changed_selection
    from runner.core.scope import derive_footprint, read_configuration

    settings = Settings(database_url=world.h.url, github_clone_urls=((REPO, str(world.origin)),),
                        repo_cache_dir=world.tmp / "cache", data_dir=world.tmp / "kl-data-parts")
    workbench = replace(botflow.Workbench.for_settings(settings), env={})
    pr = world.sim.prs[max(world.sim.prs)]
    parts = Parts()

    def timed(label: str, fn: Any) -> Any:
        started = time.perf_counter()
        value = fn()
        parts.rows.append((label, time.perf_counter() - started))
        return value

    url = rgit.clone_url(REPO, clone_urls=dict(settings.github_clone_urls), api_url=settings.github_api_url)
    mirror = timed("fetch the mirror", lambda: rgit.mirror(workbench.cache_dir, REPO, url, want=(pr["head_sha"],),
                                                           refresh=True))
    checkout = rgit.worktree(mirror, pr["head_sha"])
    root = timed("check out the head (worktree add)", checkout.__enter__)
    try:
        config = timed("read .kilolock.yml / discover projects", lambda: load(root))
        base = timed("merge base", lambda: rgit.merge_base(root, pr["base_sha"], pr["head_sha"]))
        project = config.projects[0]
        selection = timed("changed files → selection (as --changed-from)",
                          lambda: changed_selection(root / project.dir, base, against=pr["head_sha"]).selection)
        client = botflow.engine_client(workbench, REPO, root, project)
        files = timed("read the configuration", lambda: read_configuration(root / project.dir))
        scoped = timed("footprint + trunk edges (cold parse cache)",
                       lambda: derive_footprint(client, project.state, files, selection, ParseCache()))
        timed("live reservations (GET /v1/engine/reservations)", lambda: client.list_reservations(project.state))
        if not scoped.write_globs:
            raise BenchError("the in-process footprint is empty")
    finally:
        timed("remove the checkout", lambda: checkout.__exit__(None, None, None))
    return parts


def fmt(seconds: float) -> str:
    return f"{seconds:.2f}"


def render(command: str, machine: list[tuple[str, str]], sz: Sizes, measured: list[Measured], parts: Parts,
           when: str) -> str:
    warm = [m for m in measured if not m.cold]
    rows = [[f"#{m.number}" + (" (cold: clone)" if m.cold else ""), f"{m.webhook_ms:.1f}", fmt(m.first_write_s),
             fmt(m.comment_s), fmt(m.footprint_check_s), fmt(m.preview_s)] for m in measured]
    worst = max(m.comment_s for m in measured)
    verdict = "met" if worst < TARGET_SECONDS else "missed"
    lines = [
        SECTION, "",
        f"`bench/bot_bench.py`, {when}. From a pull request's webhook to the bot's comment on a "
        f"{sz.instances:,}-instance state; the plan preview separately. Target: footprint comment within "
        f"{TARGET_SECONDS:.0f} s — **{verdict}** (slowest {worst:.2f} s).", "",
        "### Machine", "", table(["", ""], [[k, v] for k, v in machine]), "",
        "### Command", "", f"```\n{command}\n```", "",
        "### Setup", "",
        f"The real app (webhook and engine lane) over a scratch Postgres database; the machine's Redis; one forking "
        f"`kl worker` with production defaults (App mode, PyGithub's 1 s pause between writes); a bare origin "
        f"repository cloned through `KL_GITHUB_CLONE_URLS`; GitHub simulated by `bench.github_sim` served on "
        f"a loopback port, which timestamps every call. The trunk: {sz.files} files `svc_NN.tf`, each a "
        f"`terraform_data` with `count = {sz.count}`, and `network.tf` (`svc_00` depends on it), uploaded through "
        f"the backend lane. Pull request `#k` edits `svc_k.tf`: its footprint writes `terraform_data.svc_k` and "
        f"`.*`, and the preview plans {sz.count} updates. Pull requests are sent one at a time, each after the "
        "previous preview finished.", "",
        "### Results (seconds from sending the webhook)", "",
        table(["pull request", "webhook answer ms", "check in progress", "footprint comment",
               "kilolock/footprint done", "plan preview in the comment"], rows), "",
    ]
    if warm:
        lines += [f"Warm median: footprint comment {statistics.median(m.comment_s for m in warm):.2f} s, plan "
                  f"preview {statistics.median(m.preview_s for m in warm):.2f} s.", ""]
    lines += [
        "### Where the footprint's time goes", "",
        "The same steps in the benchmark's process on the warm mirror, for the last pull request (no GitHub):",
        "", table(["step", "ms"], [[label, f"{seconds * 1e3:.1f}"] for label, seconds in parts.rows]), "",
        "### Reading", "",
        "The footprint needs no Terraform and never reads the state: the analysis parses the changed files and "
        "the blocks they reference, and the server answers the dependency edges of the written globs from its "
        f"rows, so its cost follows the size of the change, not of the {sz.instances:,}-instance state (the "
        "steps above take tens of milliseconds). The job's first write, the in-progress check, comes after the "
        "worker's fork, its database connection and the GitHub round trips that read the pull request and "
        "(App mode) fetch an installation token; the comment follows at least one second later, because "
        "PyGithub pauses a second between two writes of one client, which keeps the bot under GitHub's "
        "secondary rate limits; the completed check another second after that. The first pull request also "
        "clones the repository into the worker's mirror cache (a small repository here, so it barely shows). "
        "The plan preview is a second job: Terraform (`init`, `plan`, `show -json`) over the minimal "
        f"workspace and a slice of the {sz.count} instances the change touches, never the whole state.",
    ]
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = common.bench_parser("bot_bench", __doc__ or "", section=SECTION, json_help=None,
                     quick_help=f"{QUICK.instances:,} instances, {QUICK.prs} pull requests; writes no document "
                                "unless --out is given",
                     out_help=f"where to write '{SECTION}' (default {DEFAULT_OUT})")
    p.add_argument("--redis-url", default=os.environ.get("KL_BENCH_REDIS_URL", DEFAULT_REDIS),
                   help="Redis database for the queue; must be empty, and is emptied at the end")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out, command = common.start_run(args, "bot_bench", argv)
    sz = QUICK if args.quick else FULL
    connection = redis.Redis.from_url(args.redis_url)
    if connection.dbsize():
        log(f"{args.redis_url} is not empty: give --redis-url an empty database index")
        return 1
    machine = common.machine_info(args.database_url)
    measured: list[Measured] = []
    try:
        with Harness(args.database_url) as h, tempfile.TemporaryDirectory(prefix="kl-bot-bench-") as tmp:
            world = World(h, args.redis_url, Path(tmp), sz)
            try:
                world.build_repository()
                world.start_worker()
                for number in range(1, sz.prs + 1):
                    m = world.open_pr(number)
                    log(f"PR #{number}: comment {m.comment_s:.2f} s, preview {m.preview_s:.2f} s")
                    measured.append(m)
                parts = time_parts(world)
            finally:
                world.close()
    except BenchError as exc:
        log(f"benchmark failed: {exc}")
        return 1
    except KeyboardInterrupt as exc:
        log(f"interrupted ({exc})")
        return 130
    finally:
        connection.flushdb()
    machine.append(("Load average at end", common.load_average()))
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    section = render(command, machine, sz, measured, parts, when)
    print(section)
    if out is not None:
        common.write_section(out, SECTION, section)
        log(f"wrote {SECTION!r} in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
