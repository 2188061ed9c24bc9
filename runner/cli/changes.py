"""The client commands that change a state: ``kl plan``, ``kl apply``, ``kl recover`` and ``kl abort``.

``kl plan`` writes the plan file (``runner.core.pipeline.plan``: the whole configuration, or the files of
``-f``/``--changed-from``); ``kl apply`` carries it out (``runner.core.pipeline.apply``); both print Terraform's
output through the context's echo.
With ``--json`` the one document goes to stdout and everything said goes to stderr.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from app import atomic
from app.domain.reservations import DEFAULT_LEASE
from runner.cli.support import (
    EXIT_OK,
    Commands,
    client_config,
    client_options,
    connect,
    json_mode,
    parse_duration,
    print_json,
)
from runner.cli.waiting import WaitProgress
from runner.core.counts import terraform_counts
from runner.core.engine_client import EngineClient, EngineError
from runner.core.errors import UsageError


def terraform_context(env: dict[str, str]) -> Any:
    from runner.core.config import data_dir
    from runner.core.pipeline import TerraformContext
    from runner.core.terraform import TerraformNotFoundError, resolve_binary

    try:
        binary = resolve_binary(env)
    except TerraformNotFoundError as exc:
        raise UsageError(str(exc)) from exc
    return TerraformContext(binary=binary, env=env, plugin_cache=data_dir(env) / "plugin-cache",
                            echo=echo)


def echo(line: str) -> None:
    """What a command says as it goes (stdout, or stderr with --json)."""
    print(line, flush=True)


def _var_args(args: argparse.Namespace) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for raw in args.var or []:
        if "=" not in raw:
            raise UsageError(f"-var {raw!r} must be NAME=VALUE")
        found.append(("var", raw))
    found += [("var-file", path) for path in args.var_file or []]
    return found


def _selection(args: argparse.Namespace, config_dir: Path, texts: Mapping[str, str] | None) -> Any:
    """The file selection of -f / --changed-from, or None for a full plan; ``texts`` are the root module's
    files when they were read already."""
    from runner.core.pipeline import Selection, changed_selection, file_selection

    if not args.file and not args.changed_from:
        return None
    files = [str(Path(f)) for f in args.file or []]
    for name in files:
        hint = file_hint(config_dir, name)
        if hint:
            raise UsageError(hint)
    if not args.changed_from:
        return file_selection(config_dir, files)
    from runner.core.git import GitError

    try:
        chosen = changed_selection(config_dir, args.changed_from, files=texts).selection
    except GitError as exc:
        raise UsageError(str(exc)) from exc
    return Selection(tuple(sorted(set(chosen.files) | set(files))), chosen.deleted, chosen.variables)


def _plan_spec(args: argparse.Namespace, env: dict[str, str], keep: Path | None = None) -> tuple[Any, Any, Any, Any]:
    """The plan file (full, or file-scoped with -f/--changed-from), the engine client, the selection, and the
    plan (``runner.core.pipeline.Planned``; with ``keep`` a file-scoped plan's workspace is kept there for the
    apply)."""
    from runner.core.config import data_dir
    from runner.core.pipeline import ChangeRequest, plan, read_configuration

    config_dir = Path(args.chdir).resolve()
    if not config_dir.is_dir():
        raise UsageError(f"-C {args.chdir}: no such directory")
    # A file-scoped plan reads every file once, for the backend block and for the footprint.
    files = read_configuration(config_dir) if args.file or args.changed_from else None
    config = client_config(args, config_dir, env, texts=files)
    assert config.state
    client, ctx = EngineClient(config), terraform_context(env)
    selection = _selection(args, config_dir, files)
    request = ChangeRequest(state=config.state, config_dir=config_dir, data_dir=data_dir(env), selection=selection,
                            targets=tuple(args.target or ()) if selection is None else (),
                            var_args=tuple(_var_args(args)), refresh=getattr(args, "refresh", False), files=files)
    planned = plan(client, ctx, request, keep=keep)
    return planned.spec, client, selection, planned


def cmd_plan(args: argparse.Namespace) -> int:
    from runner.core.config import process_env
    from runner.core.pipeline import summary

    with json_mode(args):
        spec, client, selection, _ = _plan_spec(args, process_env())
        try:
            out = _plan_out(args, selection is not None)
            # Parallel plans from one checkout may write the same default file: each write replaces it whole.
            atomic.write_text(out, spec.to_json(), mode=0o644)
        except OSError as exc:
            raise UsageError(f"cannot write the plan file: {exc.strerror or exc} ({exc.filename}); "
                             "choose another place with --out FILE") from exc
        print(summary(spec))
        undone = _behind(spec, client, args) if selection is None else ()
        if spec.write_set or spec.output_changes:
            print(f"\nwrote {out}: apply it with kl apply {out}")
        else:
            print(f"\nwrote {out}; the plan has no changes, so kl apply would do nothing")
    if args.json:
        print_json({**plan_document(spec, out), "behind": [b.document() for b in undone]}, args.json_out)
    return EXIT_OK


def _behind(spec: Any, client: EngineClient, args: argparse.Namespace) -> tuple[Any, ...]:
    """The committed runs a full plan would undo (its checkout lacks their commits), each warned of on stderr."""
    from runner.core.behind import behind_runs

    try:
        undone = behind_runs(client, spec.state, Path(args.chdir).resolve(), spec.actions)
    except EngineError as exc:  # e.g. a token that may plan but not list runs: the plan itself stands
        print(f"warning: could not compare the plan with the state's recent runs: {exc}", file=sys.stderr,
              flush=True)
        return ()
    for run in undone:
        print(f"warning: {run.warning}", file=sys.stderr, flush=True)
    return undone


def _plan_out(args: argparse.Namespace, file_scoped: bool) -> Path:
    """Where kl plan writes its plan file: --out; else kl-plan.json for a full plan; else, for a file-scoped
    plan, kl-plan.igplan in the configuration's .kilolock directory, which git and change detection ignore
    (shown relative to the current directory when it is below it)."""
    if args.out:
        return Path(args.out)
    if not file_scoped:
        return Path("kl-plan.json")
    from runner.core.pipeline import artifact_dir

    out = artifact_dir(Path(args.chdir).resolve()) / "kl-plan.igplan"
    try:
        return out.relative_to(Path.cwd().resolve())
    except ValueError:
        return out


def _rerun_command(args: argparse.Namespace) -> str:
    parts = ["kl apply"] + [f"-f {f}" for f in args.file or []]
    if args.changed_from:
        parts.append(f"--changed-from {args.changed_from}")
    if args.chdir != ".":
        parts.append(f"-C {args.chdir}")
    return " ".join(parts + ["--confirm-scope"])


def cmd_apply(args: argparse.Namespace) -> int:
    with json_mode(args):
        spec, outcome = _apply(args)
    if args.json:
        print_json(apply_document(spec, outcome, dry_run=args.dry_run), args.json_out)
    return EXIT_OK


def _apply(args: argparse.Namespace) -> tuple[Any, Any]:
    # With -f/--changed-from the plan phase's workspace is kept here, so the apply can use its saved plan.
    with tempfile.TemporaryDirectory(prefix="kl-apply-f-") as kept:
        return _apply_in(args, Path(kept))


def _apply_in(args: argparse.Namespace, kept: Path) -> tuple[Any, Any]:
    from runner.core.config import data_dir, default_actor, process_env
    from runner.core.pipeline import ApplyOptions, ApplyOutcome, Planned, apply, summary
    from runner.core.spec import PlanSpec

    env = process_env()
    supplied = dict(raw.split("=", 1) for kind, raw in _var_args(args) if kind == "var")
    options = ApplyOptions(actor=args.actor or default_actor(env), wait_seconds=args.wait, dry_run=args.dry_run,
                           data_dir=data_dir(env), supplied_vars=supplied, lease_seconds=args.lease)
    if args.plan_file and (args.file or args.changed_from):
        raise UsageError("give either a plan file or -f/--changed-from, not both")
    if args.plan_file:
        spec = PlanSpec.load(Path(args.plan_file))
        planned = Planned(spec)
        client = EngineClient(client_config(args, Path(spec.config_dir), env, need_state=False,
                                            address=spec.address, state=spec.state))
    elif args.file or args.changed_from:
        spec, client, _, planned = _plan_spec(args, env, keep=kept)
        print(summary(spec))
        if not spec.write_set and not spec.output_changes:
            print("\nnothing to apply")
            return spec, ApplyOutcome("", None, ())
        if args.dry_run or not args.confirm_scope:
            print(f"\nto apply exactly this scope, run:\n  {_rerun_command(args)}")
            if args.dry_run:
                return spec, ApplyOutcome("", None, ())
            raise UsageError("a file-scoped apply changes real infrastructure: review the scope above and "
                             "re-run with --confirm-scope")
    else:
        raise UsageError("give a plan file (kl apply kl-plan.json) or files (kl apply -f FILE --confirm-scope)")
    client.on_wait = WaitProgress(sys.stderr) if args.wait else None  # says that, on whom and how long it waits
    return spec, apply(client, terraform_context(env), planned, options)


def cmd_recover(args: argparse.Namespace) -> int:
    from runner.core.config import data_dir, process_env
    from runner.core.pipeline import recover

    with json_mode(args):
        client, _ = connect(args, need_state=False)
        outcome = recover(client, data_dir(process_env()), args.run_id, args.actor, echo)
    if args.json:
        print_json({"recovered_run_id": args.run_id, "run_id": outcome.run_id, "commit_serial": outcome.serial,
                    "committed_addresses": list(outcome.changed), "rows": dict(outcome.rows)}, args.json_out)
    return EXIT_OK


def cmd_abort(args: argparse.Namespace) -> int:
    client, _ = connect(args, need_state=False)
    result = client.run_action(args.run_id, "abort", {"reason": args.reason or "", "force": bool(args.force)})
    run = result["run"]
    if run["status"] == "aborting":
        print(f"aborting {run['id']} ({run['state']}, held by {run['actor']}): its Terraform is applying; its client "
              "stops Terraform and then closes the run, which releases its reservations (they lapse at "
              f"{run['expires_at']} if the client is gone)")
    else:
        print(f"aborted {run['id']} ({run['state']}, held by {run['actor']}); its reservations are released")
    return EXIT_OK


def plan_document(spec: Any, plan_file: Path | None) -> dict[str, Any]:
    """kl plan --json: what the plan file holds that a CI wrapper acts on."""
    return {
        "state": spec.state,
        "base_serial": spec.base_serial,
        "mode": spec.mode,
        "selected_files": list(spec.selected_files),
        "write_set": list(spec.write_set),
        "read_set": list(spec.read_set),
        "reservations": [r.to_json() for r in spec.reservations],
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


def file_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-f", "--file", action="append", metavar="FILE",
                   help="file-scoped: plan only this .tf file and what it needs (repeatable)")
    p.add_argument("--changed-from", metavar="GIT_REF",
                   help="file-scoped: the .tf files changed since GIT_REF (git diff against the working tree)")


def register(sub: Commands) -> None:
    """Add kl plan, apply, recover and abort to the ``kl`` subcommands."""
    abort = sub.add_parser("abort", help="abort an apply run and release its reservations (operators)")
    client_options(abort)
    abort.add_argument("run_id", metavar="RUN_ID", help="the run to end (ar_..., from kl runs)")
    abort.add_argument("--reason", help="recorded in the run and the audit trail")
    abort.add_argument("--force", action="store_true",
                       help="release the reservations at once, even while the run's Terraform may be applying "
                            "(only when you know it has stopped)")
    abort.set_defaults(func=cmd_abort)

    plan = sub.add_parser("plan", help="plan against the trunk and write kl-plan.json (reservations to take)")
    client_options(plan)
    plan.add_argument("--out", help="where to write the plan file (default kl-plan.json, or with -f "
                                    ".kilolock/kl-plan.igplan in the configuration directory)")
    file_options(plan)
    plan.add_argument("-var", "--var", action="append", metavar="NAME=VALUE", help="an input variable")
    plan.add_argument("-var-file", "--var-file", action="append", metavar="FILE", help="a variables file")
    plan.add_argument("--target", action="append", metavar="ADDRESS", help="plan only this address (repeatable)")
    plan.add_argument("--refresh", action="store_true",
                      help="refresh the slice's objects first, so the plan sees drift in what it changes")
    plan.set_defaults(func=cmd_plan)

    apply = sub.add_parser("apply", help="apply a kl-plan.json: reserve, apply the slice, commit row by row")
    client_options(apply)
    apply.add_argument("plan_file", nargs="?", metavar="PLAN_FILE",
                       help="the plan file kl plan wrote (or -f/--changed-from instead)")
    file_options(apply)
    apply.add_argument("--confirm-scope", action="store_true",
                       help="with -f/--changed-from: apply the derived scope (without it, kl prints it and stops)")
    apply.add_argument("-var-file", "--var-file", action="append", metavar="FILE", help="with -f: a variables file")
    apply.add_argument("--target", action="append", help=argparse.SUPPRESS)
    apply.add_argument("--actor", help="who is applying (default: KL_ACTOR or user@host)")
    apply.add_argument("--wait", type=parse_duration, metavar="DURATION",
                       help="wait up to this long for conflicting reservations (default: fail fast)")
    apply.add_argument("--dry-run", action="store_true", help="reserve, report and release; change nothing")
    apply.add_argument("--lease", type=parse_duration, default=DEFAULT_LEASE.total_seconds(), metavar="DURATION",
                       help="reservation lease, renewed while Terraform runs (default 15m)")
    apply.add_argument("-var", "--var", action="append", metavar="NAME=VALUE",
                       help="a sensitive variable's value again (not stored in the plan file)")
    apply.set_defaults(func=cmd_apply)

    recover_cmd = sub.add_parser("recover", help="commit the post-apply state kept for a run that did not commit")
    client_options(recover_cmd)
    recover_cmd.add_argument("run_id", metavar="RUN_ID", help="the run whose kept post-apply state to commit")
    recover_cmd.add_argument("--actor", help="holder for the new run when the old one has ended")
    recover_cmd.set_defaults(func=cmd_recover)
