"""The walk: how many places one change passes through, read as data flowing through the code.

Run from the repository root:

    .venv/bin/python -m bench.walk                 # both walks; prints the numbers
    .venv/bin/python -m bench.walk --json /tmp/w.json   # and writes them as JSON

Two real runs, each in this process under ``sys.setprofile`` (the scenarios are the test
``tests/bot/test_walk.py``, run through pytest so they use the suite's fixtures: real Postgres and Redis, the
embedded Terraform, GitHub simulated): one ``kl apply -f db.tf --confirm-scope`` (``runner.cli.main`` called in
process, the server in a thread) and one bot merge apply (the merge webhook's jobs run by an in-process RQ
``SimpleWorker``). Only the calling thread is profiled, so the server's own functions are not counted.

What it counts, over the functions defined in ``analyzer/``, ``app/`` and ``runner/`` (comprehensions,
generator expressions and lambdas left out):

- **stops**: distinct functions entered;
- **modules**: distinct modules those functions live in;
- **core switches**: in the order functions are first entered, how often the next new function lives in
  another module of the core (the runner outside ``runner/cli`` and ``runner/bot``) than the previous one;
  the busiest pairs are listed too.

A walk that is one pass through the core enters each stage once, in order, and comes back rarely.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("analyzer", "app", "runner")
OUTSIDE_CORE = ("runner/cli/", "runner/bot/")
ENV_OUT = "KL_WALK_OUT"


def module_of(filename: str) -> str | None:
    """The dotted module of a source file of the product, or None for anything else."""
    try:
        rel = Path(filename).resolve().relative_to(REPO)
    except ValueError:
        return None
    if not rel.parts or rel.parts[0] not in PACKAGES or rel.suffix != ".py":
        return None
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_core(module: str) -> bool:
    path = module.replace(".", "/") + "/"
    return module.startswith("runner.") and not path.startswith(OUTSIDE_CORE)


@dataclass
class Walk:
    """The functions of the product one run enters, in the order it first enters them."""

    order: list[tuple[str, str]] = field(default_factory=list)  # (module, qualified name)
    _seen: set[tuple[str, int, str]] = field(default_factory=set)
    _files: dict[str, str | None] = field(default_factory=dict)

    def _profile(self, frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call":
            return
        code = frame.f_code
        if code.co_name.startswith("<"):
            return
        module = self._files.get(code.co_filename, "")
        if module == "":
            module = self._files[code.co_filename] = module_of(code.co_filename)
        if module is None:
            return
        key = (code.co_filename, code.co_firstlineno, code.co_name)
        if key not in self._seen:
            self._seen.add(key)
            self.order.append((module, code.co_qualname))

    @contextmanager
    def recording(self) -> Iterator[Walk]:
        previous = sys.getprofile()
        sys.setprofile(self._profile)
        try:
            yield self
        finally:
            sys.setprofile(previous)

    def summary(self) -> dict[str, Any]:
        modules = [m for m, _ in self.order]
        core = [m for m in modules if is_core(m)]
        pairs: Counter[str] = Counter()
        switches = 0
        for before, after in zip(core, core[1:], strict=False):
            if before != after:
                switches += 1
                a, b = sorted((before.rpartition(".")[2], after.rpartition(".")[2]))
                pairs[f"{a}↔{b}"] += 1
        return {
            "stops": len(self.order),
            "modules": len(set(modules)),
            "core_stops": len(core),
            "core_modules": len(set(core)),
            "core_switches": switches,
            "pairs": dict(pairs.most_common(6)),
            "walk": [f"{m}:{q}" for m, q in self.order],
        }


def save(name: str, walk: Walk) -> None:
    """Add one walk's summary to the file ``KL_WALK_OUT`` names (a JSON object by walk name), if it is set."""
    out = os.environ.get(ENV_OUT)
    if not out:
        return
    path = Path(out)
    found = json.loads(path.read_text()) if path.exists() else {}
    found[name] = walk.summary()
    path.write_text(json.dumps(found, indent=2))


def render(found: dict[str, Any]) -> str:
    lines = ["| walk | stops | modules | core stops | core modules | core switches | busiest pairs |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for name, s in found.items():
        pairs = ", ".join(f"{k} {v}" for k, v in s["pairs"].items())
        lines.append(f"| {name} | {s['stops']} | {s['modules']} | {s['core_stops']} | {s['core_modules']} | "
                     f"{s['core_switches']} | {pairs} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.walk", description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the walks (every stop, in order) to this file")
    args = parser.parse_args(argv)
    out = args.json or Path(os.environ.get("TMPDIR", "/tmp")) / f"kl-walk-{os.getpid()}.json"
    out.unlink(missing_ok=True)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                           "tests/bot/test_walk.py"], cwd=REPO, env={**os.environ, ENV_OUT: str(out)})
    if proc.returncode != 0 or not out.exists():
        print("the walk's scenarios failed", file=sys.stderr)
        return 1
    found = json.loads(out.read_text())
    print(render(found))
    if args.json is None:
        out.unlink()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
