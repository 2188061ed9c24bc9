"""What every benchmark shares: the option parser, the machine description, the Markdown section writer, the
report helpers, clean stops on signals, and the guard every timing shim goes through.

Timing shims wrap a product function by name to time it. When that function moves or is renamed, a shim
that skipped it would time nothing and report a phase as zero; ``shim_target`` raises ``ShimError``
instead, naming the function, so the bench stops and says which of its shims to point elsewhere. Shims
that run inside a ``kl`` subprocess (``python -c SHIM``) import it through ``SHIM_IMPORT``.

Only the standard library at import time: a subprocess shim imports this module while it is being timed.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_OUT = Path("docs/benchmarks.md")
NEW_DOCUMENT = ("# Benchmarks\n\nMeasured performance of Kilolock, one section per lane. Each section says "
                "which script produced it, on what machine, with which command.\n")


class BenchError(Exception):
    """The benchmark cannot produce honest numbers (an HTTP error, a wrong projection)."""


class ShimError(BenchError):
    """A timing shim's target is gone: the product function moved or was renamed."""


# --- the option parser ----------------------------------------------------------------------------


def bench_parser(module: str, doc: str, *, section: str, default_out: Path = DEFAULT_OUT,
                 quick_help: str | None = None, json_help: str | None = "also dump the raw measurements as JSON here",
                 out_help: str | None = None, database_help: str | None = None) -> argparse.ArgumentParser:
    """The options benchmarks share: --quick, --out, --json and --database-url. A bench without a quick mode or
    a JSON dump passes ``quick_help=None`` / ``json_help=None``; ``out_help`` and ``database_help`` replace the
    default help texts."""
    p = argparse.ArgumentParser(prog=f"python -m bench.{module}", description=doc.split("\n\n")[0])
    if quick_help is not None:
        p.add_argument("--quick", action="store_true", help=quick_help)
    p.add_argument("--out", type=Path, default=None,
                   help=out_help or f"Markdown file whose '{section}' section is replaced (default: {default_out} "
                                    "for a full run, nothing for --quick)")
    if json_help is not None:
        p.add_argument("--json", type=Path, default=None, help=json_help)
    p.add_argument("--database-url", default=os.environ.get("KL_BENCH_DATABASE_URL", DEFAULT_DATABASE_URL),
                   help=database_help or "Postgres server to create the scratch database on (default: %(default)s)")
    return p


def printing_parser(module: str, doc: str, *, size: int, what: str = "instances") -> argparse.ArgumentParser:
    """The options of a bench that prints only (no --out): --size and --database-url, the module's docstring
    as its help."""
    p = argparse.ArgumentParser(prog=f"python -m bench.{module}", description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=size, help=f"{what} (default: %(default)s)")
    p.add_argument("--database-url", default=DEFAULT_DATABASE_URL,
                   help="Postgres server to create the scratch database on (default: %(default)s)")
    return p


def out_path(args: argparse.Namespace, default: Path = DEFAULT_OUT) -> Path | None:
    """Where a run writes its section: ``--out``, else ``default`` for a full run and nowhere for ``--quick``."""
    out: Path | None = args.out
    if out is None and not getattr(args, "quick", False):
        out = default
    return out


def command_line(module: str, argv: Sequence[str] | None) -> str:
    """The command that repeats this run, as its results section records it."""
    return shlex.join([".venv/bin/python", "-m", f"bench.{module}", *(sys.argv[1:] if argv is None else argv)])


def start_run(args: argparse.Namespace, module: str, argv: Sequence[str] | None) -> tuple[Path | None, str]:
    """Begin a run: stop cleanly on signals from now on; return where it writes its section (``out_path``) and
    the command that repeats it (``command_line``)."""
    stop_cleanly_on_signals()
    return out_path(args), command_line(module, argv)


@dataclass(frozen=True)
class SizedRun:
    """A run over a few state sizes in alternating rounds (``start_sized_run``)."""

    args: argparse.Namespace
    out: Path | None  # where it writes its section (``out_path``)
    command: str  # the command that repeats it
    sizes: list[int]
    rounds: int


def start_sized_run(p: argparse.ArgumentParser, module: str, argv: Sequence[str] | None, *, rounds: int,
                    rounds_help: str, quick_rounds: int = 1, quick_size: int = 20_000) -> SizedRun:
    """Add ``--sizes`` (instance counts) and ``--rounds`` to ``p``, parse ``argv`` and begin the run
    (``start_run``); with ``--quick`` it measures ``quick_size`` instances in ``quick_rounds`` rounds."""
    p.add_argument("--sizes", default="200000", help="instance counts, comma-separated")
    p.add_argument("--rounds", type=int, default=rounds, help=rounds_help)
    args = p.parse_args(argv)
    out, command = start_run(args, module, argv)
    if args.quick:
        return SizedRun(args, out, command, [quick_size], quick_rounds)
    return SizedRun(args, out, command, [int(s) for s in args.sizes.split(",")], args.rounds)


def log(msg: str) -> None:
    """Progress for the person running the bench: stderr, so stdout stays the report."""
    print(msg, file=sys.stderr, flush=True)


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def stop_cleanly_on_signals() -> None:
    """Turn SIGTERM (and SIGINT, even when a shell started the benchmark in the background with it
    ignored) into KeyboardInterrupt, so the scratch database and directories are always removed."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
        signal.signal(signal.SIGINT, _interrupt)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def with_dbname(url: str, dbname: str) -> str:
    """``url`` pointing at the database ``dbname`` instead."""
    import psycopg

    return psycopg.conninfo.make_conninfo(url, dbname=dbname)


@contextmanager
def scratch_database(server_url: str, prefix: str) -> Iterator[str]:
    """A new empty database on ``server_url`` named ``prefix`` and a random suffix; yields its URL and drops it
    (closing whatever still uses it) on the way out."""
    import uuid

    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_dbname(server_url, name)
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def state_database(server_url: str, prefix: str, state: str, doc: bytes) -> Iterator[str]:
    """``scratch_database``, migrated, holding ``doc`` as the state named ``state`` (written by
    ``states.write_state``, as a first POST writes it); yields its URL."""
    from app.domain.principal import default_principal
    from app.store import states
    from app.store.db import Database
    from app.store.migrate import migrate

    with scratch_database(server_url, prefix) as url:
        migrate(url)
        db = Database(url)
        try:
            states.write_state(db, default_principal("bench"), state, doc, lock_id=None)
        finally:
            db.close()
        yield url


def assembly_sort(statement: str) -> tuple[int, int]:
    """Where the sort of the assembly's streamed statement (``resources._STREAM_FOR_ASSEMBLY``) is: the start
    of its ``ORDER BY`` and of the ``OFFSET 0`` that ends it, for the benches that take the statement apart.
    Stops the bench when the statement no longer has them."""
    start, end = statement.find("ORDER BY"), statement.find("OFFSET 0")
    if start < 0 or end < start:
        raise SystemExit("the assembly's statement no longer has the sort this bench takes apart")
    return start, end


def http_backend(url: str) -> str:
    """A ``terraform`` block pointing Terraform's http backend (and its lock) at a Kilolock state URL."""
    return (f'terraform {{\n  backend "http" {{\n    address        = "{url}"\n    lock_address   = "{url}"\n'
            f'    unlock_address = "{url}"\n    lock_method    = "LOCK"\n    unlock_method  = "UNLOCK"\n  }}\n}}\n')


# --- the server's background work ------------------------------------------------------------------

_BACKGROUND = re.compile(r'^kilolock_background_pending\{queue="([^"]*)"\} (\S+)$', re.M)


def background_pending(metrics: str) -> dict[str, float]:
    """The ``kilolock_background_pending`` gauge of a server's ``/metrics`` text, by queue (``upkeep``: statistics
    refreshes and changed attribute names after bulk writes; ``splice_bases``: splice base builds)."""
    found = {queue: float(value) for queue, value in _BACKGROUND.findall(metrics)}
    if not found:
        raise BenchError("the server's /metrics has no kilolock_background_pending gauge: is it this checkout's?")
    return found


def wait_until_idle(server_url: str, session: Any = None, *, timeout: float = 1800.0, poll: float = 0.1) -> float:
    """Wait until the server (one process: a scrape reads the process that answers it) has no background work
    queued or running, so what a bench times next does not share the CPU and the database with the upkeep of
    an earlier write; the seconds waited."""
    import time

    import requests

    get = (session or requests).get
    started = time.monotonic()
    while True:
        resp = get(f"{server_url}/metrics", timeout=60)
        if resp.status_code != 200:
            raise BenchError(f"GET /metrics answered {resp.status_code}")
        if not any(background_pending(resp.text).values()):
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise BenchError(f"the server's background work did not finish within {timeout:.0f} s")
        time.sleep(poll)


# --- the machine description -----------------------------------------------------------------------


def load_average() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def machine_info(server_url: str) -> list[tuple[str, str]]:
    """Cores, memory, Python, Postgres and its durability settings, library versions, OS, load average and the
    git revision measured: the rows every results section records."""
    import psycopg
    import requests
    from psycopg import sql

    mem = ""
    try:
        for ln in Path("/proc/meminfo").read_text().splitlines():
            if ln.startswith("MemTotal:"):
                mem = f"{int(ln.split()[1]) / 1024 / 1024:.1f} GiB"
    except OSError:
        mem = "unknown"
    model = ""
    try:
        model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                      if ln.startswith("model name")), "")
    except OSError:
        pass
    with psycopg.connect(server_url, autocommit=True) as conn:
        version = conn.execute("SHOW server_version").fetchone()
        settings = {k: conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(k))).fetchone()
                    for k in ("shared_buffers", "synchronous_commit", "fsync")}
    pg = f"{version[0] if version else '?'} (" + ", ".join(f"{k}={v[0] if v else '?'}"
                                                          for k, v in settings.items()) + ")"
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout.strip()
        revision = head + (" with uncommitted changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        revision = "unknown"
    return [
        ("CPU cores (os.cpu_count())", f"{os.cpu_count()}" + (f" ({model})" if model else "")),
        ("Memory (MemTotal)", mem),
        ("Python", f"{platform.python_version()} ({platform.python_implementation()})"),
        ("Postgres (SHOW server_version)", pg),
        ("psycopg / requests", f"{psycopg.__version__} / {requests.__version__}"),
        ("OS", platform.platform()),
        ("Load average at start", load_average()),
        ("Code (git)", revision),
    ]


# --- the report ------------------------------------------------------------------------------------


def ms(seconds: float) -> str:
    value = seconds * 1e3
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table (readable as plain text too)."""
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=False)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return "\n".join([line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def guarded(module: str, body: Callable[[], object]) -> int:
    """Run a bench's measuring ``body``: exit status 0, or 1 after logging a ``BenchError`` (the run cannot give
    honest numbers), or 130 when interrupted."""
    try:
        body()
    except BenchError as exc:
        log(f"{module}: {exc}")
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def publish(out: Path | None, title: str, section: str) -> None:
    """Print a run's results section and, when ``out`` is set, replace its section there (``write_section``)."""
    print(section)
    if out is not None:
        write_section(out, title, section)


def write_section(path: Path, title: str, section: str) -> None:
    """Replace the section headed ``title`` (``## …``, up to the next ``## `` heading) in ``path``, or append it;
    every other section stays as it is. A missing document is started with its title."""
    doc = path.read_text() if path.exists() else NEW_DOCUMENT
    pattern = re.compile(rf"^{re.escape(title)}[ \t]*\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(doc):
        doc = pattern.sub(lambda _m: section.rstrip("\n") + "\n\n", doc, count=1)
    else:
        doc = doc.rstrip("\n") + "\n\n" + section
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc.rstrip("\n") + "\n")


# --- timing shims ----------------------------------------------------------------------------------


def _owner_name(owner: object) -> str:
    if isinstance(owner, type):
        return f"{owner.__module__}.{owner.__qualname__}"
    return str(getattr(owner, "__name__", type(owner).__name__))


def shim_target(owner: object, attr: str) -> Any:
    """The function a timing shim is about to wrap, or ``ShimError`` when ``owner`` has no callable ``attr``
    any more (the product moved or renamed it): a shim never times nothing in silence."""
    found = getattr(owner, attr, None)
    if not callable(found):
        raise ShimError(f"timing shim: {_owner_name(owner)}.{attr} is gone (moved or renamed?); point the bench's "
                        "shim at the function's new home")
    return found


# Source lines for shims run as ``python -c SHIM`` in a kl subprocess: make ``shim_target`` importable there.
SHIM_IMPORT = f"import sys as _sys\n_sys.path.insert(0, {str(REPO)!r})\nfrom bench.common import shim_target\n"
