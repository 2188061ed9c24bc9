"""Shared fixtures: a fresh Postgres database per test session, the app, a live HTTP server,
and a Terraform runner over the embedded ``kl-terraform``.

Services: ``KL_TEST_DATABASE_URL`` (default: the machine's Postgres on 127.0.0.1:5432). When it is
unreachable the suite boots an embedded Postgres, unless ``KL_TEST_REQUIRE_SERVICES=1`` (set by
.ci/run on CI), in which case it fails instead of skipping or substituting.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from werkzeug.serving import make_server

from app.config import Settings
from app.store import Database
from app.store.migrate import migrate
from bench.common import http_backend

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/postgres"
REQUIRE = os.environ.get("KL_TEST_REQUIRE_SERVICES") == "1"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite golden files under tests/fixtures from the current output; review the diff")
    parser.addoption("--fast", action="store_true", default=False,
                     help="the inner loop (./dev test --fast): a test that asks for a database fails")


def _server_url(tmp_factory: pytest.TempPathFactory) -> tuple[str, Path | None]:
    url = os.environ.get("KL_TEST_DATABASE_URL", DEFAULT_PG)
    try:
        with psycopg.connect(url, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return url, None
    except psycopg.OperationalError as exc:
        if REQUIRE:
            pytest.fail(f"Postgres required (KL_TEST_REQUIRE_SERVICES=1) but unreachable at {url}: {exc}")
    from app.embedded import start_embedded_postgres

    data_dir = tmp_factory.mktemp("embedded-pg")
    return start_embedded_postgres(data_dir), data_dir


def _with_dbname(url: str, dbname: str) -> str:
    return psycopg.conninfo.make_conninfo(url, dbname=dbname)


@pytest.fixture(scope="session")
def database_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A fresh database for this test session, migrated to the latest schema."""
    if request.config.getoption("--fast"):
        pytest.fail("a --fast test asked for the database: move it out of the pure test folders")
    server, embedded_dir = _server_url(tmp_path_factory)
    name = f"kl_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = _with_dbname(server, name)
    migrate(url)
    yield url
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    if embedded_dir is not None:
        from app.embedded import stop_embedded_postgres

        stop_embedded_postgres(embedded_dir)


_TRUNCATE = (
    "TRUNCATE states, state_versions, resources, outputs, events, api_tokens, environments, workspaces, "
    "webhook_deliveries, pull_request_footprints, bot_jobs, auth_throttle, event_endpoints, event_deliveries "
    "RESTART IDENTITY CASCADE; "
    "DELETE FROM tenants WHERE id <> 1"
)


@pytest.fixture
def clean_db(database_url: str) -> str:
    """The session database emptied of states, versions, rows and events."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(_TRUNCATE)
    return database_url


@pytest.fixture
def db(clean_db: str) -> Iterator[Database]:
    database = Database(clean_db, pool_size=4)
    yield database
    database.close()


@pytest.fixture
def settings(clean_db: str) -> Settings:
    return Settings(database_url=clean_db, auto_migrate=False, db_pool_size=20, log_level="WARNING")


@pytest.fixture
def app(settings: Settings):  # type: ignore[no-untyped-def]
    from app.web import create_app

    application = create_app(settings)
    yield application
    _close_app(application)


def _close_app(application: object) -> None:
    """Let an app's background threads finish (a bulk write's refresh and changed names, a large POST's
    splice base) before its pool closes, so none of them outlives its test into the next one's TRUNCATE."""
    services = application.extensions["kilolock"]  # type: ignore[attr-defined]
    if services.upkeep is not None:
        services.upkeep.stop()  # its refresh may hand a splice base on: stopped first
    if services.splice_bases is not None:
        services.splice_bases.stop()
    services.db.close()


@pytest.fixture
def client(app):  # type: ignore[no-untyped-def]
    return app.test_client()


@dataclass
class LiveServer:
    url: str
    settings: Settings

    def state_url(self, name: str) -> str:
        return f"{self.url}/v1/states/{name}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def live_server_factory(settings: Settings) -> Iterator:  # type: ignore[type-arg]
    """Start real threaded HTTP servers over the app; each call may override settings."""
    from app.web import create_app

    started: list[tuple[object, threading.Thread, object]] = []

    def start(**overrides: object) -> LiveServer:
        chosen = replace(settings, **overrides)  # type: ignore[arg-type]
        application = create_app(chosen)
        port = _free_port()
        server = make_server("127.0.0.1", port, application, threaded=True)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        started.append((server, thread, application))
        return LiveServer(url=f"http://127.0.0.1:{port}", settings=chosen)

    yield start
    for server, thread, application in started:
        server.shutdown()  # type: ignore[attr-defined]
        thread.join(timeout=5)
        _close_app(application)


@pytest.fixture
def live_server(live_server_factory) -> LiveServer:  # type: ignore[no-untyped-def]
    return live_server_factory()


def kl_terraform_bin() -> str:
    found = Path(sys.executable).with_name("kl-terraform")
    if found.exists():
        return str(found)
    which = shutil.which("kl-terraform")
    assert which, "kl-terraform is not installed: run ./dev setup"
    return which


@dataclass
class TerraformRun:
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


@dataclass
class Terraform:
    """Runs the embedded Terraform in one configuration directory."""

    workdir: Path
    env: dict[str, str]

    def __call__(self, *args: str, timeout: float = 180, check: bool = True,
                 env: dict[str, str] | None = None) -> TerraformRun:
        proc = subprocess.run(
            [kl_terraform_bin(), *args], cwd=self.workdir, env={**self.env, **(env or {})},
            capture_output=True, text=True, timeout=timeout,
        )
        run = TerraformRun(proc.returncode, proc.stdout, proc.stderr)
        if check and proc.returncode != 0:
            raise AssertionError(f"terraform {' '.join(args)} exited {proc.returncode}:\n{run.output[-4000:]}")
        return run

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([kl_terraform_bin(), *args], cwd=self.workdir, env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def write(self, name: str, text: str) -> Path:
        path = self.workdir / name
        path.write_text(text)
        return path


# The start of the trunk the end-to-end suites share: a variable, a local and resources referring across files.
TRUNK_FILES = {
    "variables.tf": 'variable "env" {\n  type    = string\n  default = "prod"\n}\n\n'
                    'locals {\n  prefix = "${var.env}-app"\n}\n',
    "network.tf": 'resource "terraform_data" "net" {\n  input = "${local.prefix}-net-v1"\n}\n',
    "web.tf": 'resource "terraform_data" "web" {\n  count = 2\n'
              '  input = "${local.prefix}-web-${count.index}-${terraform_data.net.output}"\n}\n',
}


def git(cwd: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """Run git with a fixed author and no signing; fails the test with git's output when git fails."""
    proc = subprocess.run(["git", "-c", "user.name=Dev", "-c", "user.email=dev@example.com", "-c",
                           "commit.gpgsign=false", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, f"git {' '.join(args)}: {proc.stdout}{proc.stderr}"
    return proc.stdout.strip()


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 120.0, every: float = 0.2) -> Any:
    """Poll ``predicate`` until it returns something true, and return that; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def held_until(gate: Path, seconds: int = 300) -> str:
    """A shell command for a ``local-exec`` provisioner: it holds until the file ``gate`` exists, then succeeds
    (and fails after ``seconds``). A test opens the gate (``gate.touch()``) once it has seen what must happen
    while the apply holds its reservations, instead of betting on a fixed ``sleep``."""
    return f"for i in $(seq 1 {seconds * 4}); do [ -f {gate} ] && exit 0; sleep 0.25; done; exit 1"


def write_file(root: Path, name: str, text: str) -> None:
    """Write ``root/name``, making its directories."""
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def edit_file(root: Path, name: str, old: str, new: str) -> None:
    """Replace ``old`` (which must be there) by ``new`` in ``root/name``."""
    text = (root / name).read_text()
    assert old in text, (name, old)
    write_file(root, name, text.replace(old, new))


class Workdir:
    """A Terraform configuration directory against one Kilolock state URL, run with one environment: its files,
    vanilla Terraform (the embedded ``kl-terraform``), ``kl`` and git."""

    def __init__(self, root: Path, url: str, env: dict[str, str]) -> None:
        self.dir, self.url, self.env = root, url, env
        root.mkdir(parents=True, exist_ok=True)

    def write(self, name: str, text: str) -> None:
        write_file(self.dir, name, text)

    def edit(self, name: str, old: str, new: str) -> None:
        edit_file(self.dir, name, old, new)

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(list(args), cwd=self.dir, env=self.env, capture_output=True, text=True, timeout=180)
        assert not check or proc.returncode == 0, proc.stdout + proc.stderr
        return proc

    def tf(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run(kl_terraform_bin(), *args, check=check)

    def kl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run(str(Path(sys.executable).with_name("kl")), *args, check=False)

    def kl_popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([str(Path(sys.executable).with_name("kl")), *args], cwd=self.dir, env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def git(self, *args: str) -> str:
        return git(self.dir, *args, env=self.env)

    def seed(self, files: dict[str, str]) -> None:
        """Write ``backend.tf`` and ``files``, then init and apply them: the trunk every scenario starts from."""
        self.write("backend.tf", http_backend(self.url))
        for name, text in files.items():
            self.write(name, text)
        self.tf("init", "-input=false")
        self.tf("apply", "-auto-approve", "-input=false")

    def converged(self, *, reinit: bool = False) -> None:
        """Vanilla Terraform over the whole configuration plans no changes."""
        if reinit:
            self.tf("init", "-input=false", "-reconfigure")
        plan = self.tf("plan", "-detailed-exitcode", "-input=false", check=False)
        assert plan.returncode == 0, "vanilla terraform plan shows changes:\n" + plan.stdout[-3000:] + plan.stderr


def terraform_env(home: Path) -> dict[str, str]:
    rc = home / "terraformrc"
    rc.write_text("")
    plugin_cache = home / "plugin-cache"
    plugin_cache.mkdir(exist_ok=True)
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")}
    return {
        **keep,
        "TF_IN_AUTOMATION": "1",
        "CHECKPOINT_DISABLE": "1",
        "TF_CLI_CONFIG_FILE": str(rc),
        "TF_INPUT": "0",
        "NO_COLOR": "1",
        # kl resolves terraform/tofu on PATH first; the suite always runs the embedded Terraform.
        "KL_TERRAFORM_BIN": kl_terraform_bin(),
    }


@pytest.fixture(scope="session")
def fakecloud(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """The fakecloud test provider, built once per session into a filesystem mirror (``bench.fakecloud``)."""
    from bench.fakecloud.install import install

    return install(tmp_path_factory.mktemp("fakecloud-provider"))


@pytest.fixture
def terraform_factory(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Make Terraform runners, each in its own directory under tmp_path."""
    home = tmp_path / "tf-home"
    home.mkdir()
    env = terraform_env(home)

    def make(name: str = "config") -> Terraform:
        workdir = tmp_path / name
        workdir.mkdir(exist_ok=True)
        return Terraform(workdir=workdir, env=dict(env))

    return make


@pytest.fixture
def workdir_env(tmp_path: Path, terraform_factory) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """The environment ``Workdir``s of one test share: one Terraform home, ``KL_DATA_DIR`` and ``HOME``."""
    env = dict(terraform_factory("home").env)
    env.update(KL_DATA_DIR=str(tmp_path / "kl-data"), PATH=os.environ["PATH"], HOME=str(tmp_path))
    return env


@pytest.fixture
def workdir_factory(tmp_path: Path, workdir_env: dict[str, str]):  # type: ignore[no-untyped-def]
    """Make ``Workdir``s under tmp_path against a state URL: ``make("repo", url)``."""

    def make(name: str, url: str) -> Workdir:
        return Workdir(tmp_path / name, url, workdir_env)

    return make
