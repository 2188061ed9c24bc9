"""What every kl command shares: the argument parser's error handling, JSON documents, the hints
that turn an error into the next thing to do, and the small helpers of kl serve.

The parser exits 3 on every usage error (2 means "conflict or stale plan: re-plan" to a CI wrapper),
and shows the usage of the subcommand that was misused, not the top level's.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import ipaddress
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

from app.domain import durations

EXIT_OK, EXIT_FAILED, EXIT_CONFLICT, EXIT_USAGE = 0, 1, 2, 3


class UsageError(Exception):
    """The command line or the environment is wrong; the message says what to change (exit 3)."""


class KlArgumentParser(argparse.ArgumentParser):
    """argparse with kl's conventions: exit 3 and this (sub)command's usage on a usage error."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(self.format_usage())
        sys.stderr.write(f"{self.prog}: error: {message}\n(run {self.prog} --help for every option)\n")
        raise SystemExit(EXIT_USAGE)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:
        parsed, extra = super().parse_known_args(args, namespace)
        # A leaf command reports its own unknown flags, so the usage shown is the command's own.
        if extra and not any(isinstance(a, argparse._SubParsersAction) for a in self._actions):
            self.error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed, extra


def leaf_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every parser that runs a command (no subcommands of its own), depth first."""
    found: list[argparse.ArgumentParser] = []
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [parser]
    for action in subs:
        for sub in dict.fromkeys(action.choices.values()):
            found.extend(leaf_parsers(sub))
    return found


def print_json(value: Any, stream: Any = None) -> None:
    import json

    out = stream or sys.stdout
    json.dump(value, out, indent=2, sort_keys=True, default=str)
    out.write("\n")


def terraform_counts(actions: Mapping[str, str]) -> dict[str, int]:
    """Counts as Terraform reports them: a replace is one added and one destroyed."""
    counts = {"add": 0, "change": 0, "destroy": 0, "replace": 0, "import": 0, "move": 0, "forget": 0}
    for action in actions.values():
        if action == "create":
            counts["add"] += 1
        elif action == "update":
            counts["change"] += 1
        elif action == "delete":
            counts["destroy"] += 1
        elif action == "replace":
            counts["replace"] += 1
            counts["add"] += 1
            counts["destroy"] += 1
        elif action in counts:
            counts[action] += 1
    return counts


def counts_line(actions: Mapping[str, str]) -> str:
    c = terraform_counts(actions)
    text = f"{c['add']} added, {c['change']} changed, {c['destroy']} destroyed"
    extra = [f"{c[k]} {label}" for k, label in (("replace", "replaced"), ("import", "imported"),
                                                 ("move", "moved"), ("forget", "forgotten")) if c[k]]
    return text + (f" ({', '.join(extra)})" if extra else "")


def plan_document(spec: Any, plan_file: Path | None) -> dict[str, Any]:
    """kl plan --json: what the plan file holds that a CI wrapper acts on."""
    return {
        "state": spec.state,
        "base_serial": spec.base_serial,
        "mode": spec.mode,
        "selected_files": list(spec.selected_files),
        "write_set": list(spec.write_set),
        "read_set": list(spec.read_set),
        "reservations": [{"glob": g, "mode": m} for g, m in spec.reservations],
        "actions": dict(spec.actions),
        "counts": terraform_counts(spec.actions),
        "output_changes": dict(spec.output_changes),
        "changes": bool(spec.write_set or spec.output_changes),
        "warnings": list(spec.warnings),
        "diagnostics": list(spec.diagnostics),
        "plan_file": str(plan_file) if plan_file else None,
    }


def apply_document(spec: Any, outcome: Any, *, dry_run: bool) -> dict[str, Any]:
    """kl apply --json: the plan's sets and reservations plus what the commit did."""
    doc = plan_document(spec, None)
    del doc["plan_file"]
    doc.update({
        "dry_run": dry_run,
        "run_id": outcome.run_id or None,
        "commit_serial": outcome.serial,
        "committed_addresses": list(outcome.changed),
        "rows": dict(getattr(outcome, "rows", {}) or {}),
    })
    return doc


def nearest(name: str, candidates: list[str]) -> str:
    """`` (did you mean x.tf?)`` when a candidate is close to ``name``, else empty."""
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return f" (did you mean -f {close[0]}?)" if close else ""


def file_hint(config_dir: Path, name: str) -> str | None:
    """Why ``-f name`` names no root file of ``config_dir``, and what to give instead; None when it does."""
    if (config_dir / name).is_file() and "/" not in name:
        return None
    roots = sorted(p.name for p in config_dir.iterdir() if p.is_file() and p.name.endswith((".tf", ".tf.json"))) \
        if config_dir.is_dir() else []
    target = (config_dir / name).resolve()
    if target.is_file() and target.parent != config_dir.resolve():
        callers = _module_callers(config_dir, target.parent, roots)
        via = f"-f {callers[0]} (the file that calls that module)" if callers else "the root file that calls it"
        return (f"-f {name}: that file belongs to a module, not to the configuration directory; file-scoped plans "
                f"start from root files: give {via}, or let kl find it with --changed-from GIT_REF")
    if "/" in name or not name.endswith((".tf", ".tf.json")):
        return f"-f {name}: name a .tf file of the configuration directory (e.g. -f {roots[0] if roots else 'main.tf'})"
    return f"-f {name}: no such file in {config_dir}{nearest(name, roots)}"


def _module_callers(config_dir: Path, module_dir: Path, roots: list[str]) -> list[str]:
    from analyzer.hcl import HclError, analyze_file

    found = []
    for name in roots:
        try:
            blocks = analyze_file(name, (config_dir / name).read_text(errors="replace")).blocks
        except HclError:
            continue
        for block in blocks:
            source = block.module_source or ""
            if block.type == "module" and source.startswith(("./", "../")) \
                    and (config_dir / source).resolve() == module_dir:
                found.append(name)
                break
    return found


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def port_free(host: str, port: int, what: str) -> None:
    """Refuse a port in use before anything starts or is printed, so the clash is the only thing said."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as exc:
        raise UsageError(f"cannot listen on {host}:{port} for the {what}: {exc.strerror or exc}. Another process "
                         "(perhaps another kl serve) holds that port: stop it, or pass --port/--control-port with "
                         "a free one") from None


def listen(host: str, port: int, app: Any, what: str) -> Any:
    from werkzeug.serving import make_server

    try:
        return make_server(host, port, app, threaded=True)
    except (OSError, SystemExit):  # werkzeug reports a clash itself and exits; taken since port_free looked
        port_free(host, port, what)
        raise


@contextlib.contextmanager
def json_mode(args: argparse.Namespace) -> Any:
    """With --json, everything a command says goes to stderr; stdout carries only the JSON document."""
    if not getattr(args, "json", False):
        yield
        return
    args.json_out = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        yield


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``5m``, ``1h30m`` → seconds (``app.domain.durations``), as an argparse type."""
    try:
        return durations.parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kilolock")
    except PackageNotFoundError:
        return "(not installed)"
