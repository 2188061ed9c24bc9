"""The kl command line: serve, migrate, and the read commands over a server's rows.

Client commands find the server and state from the configuration directory's ``backend "http"``
block (``-C DIR``, default ``.``; or --address/--state/--token, KL_ADDRESS/KL_STATE/KL_TOKEN) and talk
to it only through ``runner.engine_client``. Exit codes: 0 ok, 1 failed, 2 conflict or stale plan
(re-plan), 3 usage or configuration error. Other modules add subcommands with a few lines in
``build_parser``; shared parser rules and output helpers live in ``runner.cli_support``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.domain.blocks import backend_block, scoped_backend_block
from app.domain.reservations import format_duration
from runner.cli_support import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    KlArgumentParser,
    UsageError,
    apply_document,
    file_hint,
    is_loopback,
    json_mode,
    leaf_parsers,
    listen,
    package_version,
    parse_duration,
    plan_document,
    port_free,
    print_json,
)
from runner.config import ClientConfigError, resolve
from runner.engine_client import EngineClient

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "UsageError", "build_parser", "main"]


def cmd_serve(args: argparse.Namespace) -> int:
    import threading

    from app.config import AuthMode, Settings
    from app.web import create_app, resolve_database_url

    settings = Settings.from_env()
    if args.allow_open_on_network:
        settings = replace(settings, allow_open_on_network=True)
    if settings.auth_mode is AuthMode.OPEN and not is_loopback(args.host) and not settings.allow_open_on_network:
        raise UsageError(
            f"refusing to serve KL_AUTH_MODE=open on {args.host}: anyone who can reach it could rewrite "
            "your states. Set KL_AUTH_MODE=static with KL_AUTH_TOKEN, or pass --allow-open-on-network "
            "(KL_ALLOW_OPEN_ON_NETWORK=true)"
        )
    port_free(args.host, args.port, "service")
    if args.control_port:
        port_free(args.control_host, args.control_port, "control API")
    where = "KL_DATABASE_URL" if settings.database_url else "embedded Postgres"
    settings = replace(settings, database_url=resolve_database_url(settings))
    # Listening only once the apps exist: a client that connects early is refused, not left waiting.
    main_app = create_app(settings, lanes="public" if args.control_port else "all")
    control_app = create_app(settings, lanes="control") if args.control_port else None
    server = listen(args.host, args.port, main_app, "service")
    shown_host = "localhost" if args.host in ("127.0.0.1", "0.0.0.0", "::") else args.host
    listening = f"http://{shown_host}:{server.port}"
    print(f"Kilolock listening on {listening} (database: {where}, auth: {settings.auth_mode.value})")
    if control_app is not None:
        control = listen(args.control_host, args.control_port, control_app, "control API")
        threading.Thread(target=control.serve_forever, name="control-api", daemon=True).start()
        print(f"control API on http://{args.control_host}:{control.port}/v1/api")
    print(f"Dashboard: {listening}/ui/")
    base = (settings.public_url or listening).rstrip("/")
    if settings.public_url:
        print(f"Clients reach it as {base} (KL_PUBLIC_URL); the backend block below uses that address.")
    print("Paste this into your Terraform configuration (rename 'example' to your state's name):\n")
    print(backend_block(base, static_auth=settings.auth_mode.value == "static"))
    print(flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return EXIT_OK


def cmd_worker(args: argparse.Namespace) -> int:
    import logging
    from dataclasses import replace as with_fields

    from app.config import Settings
    from app.embedded import default_data_dir, start_embedded_postgres, start_embedded_redis
    from runner.bot.jobs import work

    settings = Settings.from_env()
    if not settings.github_enabled:
        raise UsageError("kl worker runs the GitHub bot's jobs: set KL_GITHUB_APP_ID and KL_GITHUB_PRIVATE_KEY (a "
                         "GitHub App) or KL_GITHUB_TOKEN, as for the server")
    where = settings.data_dir or default_data_dir()
    settings = with_fields(settings, database_url=settings.database_url or start_embedded_postgres(where),
                           redis_url=settings.redis_url or start_embedded_redis(where))
    # The jobs' own loggers (kilolock.*), as text; RQ configures its worker's logger itself.
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    work(settings, burst=args.burst, name=args.name, with_scheduler=not args.no_scheduler)
    return EXIT_OK


def cmd_migrate(args: argparse.Namespace) -> int:
    from app.config import Settings
    from app.store.migrate import migrate
    from app.web import resolve_database_url

    settings = Settings.from_env()
    applied = migrate(resolve_database_url(settings))
    if applied:
        for m in applied:
            print(f"applied {m.version:04d}_{m.name}")
    else:
        print("database is up to date")
    return EXIT_OK


def _operator_db() -> Any:
    from app.config import Settings
    from app.store import Database
    from app.store.migrate import migrate
    from app.web import resolve_database_url

    url = resolve_database_url(Settings.from_env())
    migrate(url)
    return Database(url, pool_size=2)


def cmd_tenants_create(args: argparse.Namespace) -> int:
    from app.store import tenancy

    tenant = tenancy.create_tenant(_operator_db(), args.slug, args.name or args.slug, actor=_operator_name())
    print(f"created tenant {tenant.slug} (id {tenant.id})")
    return EXIT_OK


def cmd_tenants_list(args: argparse.Namespace) -> int:
    from app.store import tenancy

    found = tenancy.list_tenants(_operator_db())
    if args.json:
        _print_json([{"slug": t.slug, "name": t.name, "created_at": t.created_at.isoformat()} for t in found])
        return EXIT_OK
    for t in found:
        print(f"{t.slug}\t{t.name}")
    return EXIT_OK


def _token_json(info: Any) -> dict[str, Any]:
    return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in asdict(info).items()}


def cmd_tokens_create(args: argparse.Namespace) -> int:
    from app.store import tenancy

    secret, info = tenancy.create_token(_operator_db(), args.tenant, name=args.name, environment=args.environment,
                                        workspace=args.workspace, actor=_operator_name())
    if args.json:
        _print_json({"token_secret": secret, "token": _token_json(info)})
        return EXIT_OK
    print(f"token {info.id} ({info.name}) for {info.workspace_id}/{info.environment_id}")
    print(f"secret (shown once, store it now): {secret}\n")
    print(scoped_backend_block(args.server_url.rstrip("/"), info.workspace_id, info.environment_id))
    return EXIT_OK


def cmd_tokens_list(args: argparse.Namespace) -> int:
    from app.store import tenancy

    found = tenancy.list_tokens(_operator_db(), args.tenant)
    if args.json:
        _print_json([_token_json(t) for t in found])
        return EXIT_OK
    for t in found:
        state = "revoked" if t.revoked_at else "active"
        used = t.last_used_at.isoformat() if t.last_used_at else "never used"
        print(f"{t.id}\t{t.name}\t{t.workspace}/{t.environment}\t{state}\tcreated {t.created_at.isoformat()}\t{used}")
    return EXIT_OK


def cmd_tokens_revoke(args: argparse.Namespace) -> int:
    from app.store import tenancy

    info = tenancy.revoke_token(_operator_db(), args.tenant, args.token_id, actor=_operator_name())
    print(f"revoked {info.id} ({info.name}); it stops working on its next request")
    return EXIT_OK


def _operator_name() -> str:
    import getpass

    try:
        return "cli:" + getpass.getuser()
    except (KeyError, OSError):
        return "cli"


def _client(args: argparse.Namespace, *, need_state: bool = True) -> tuple[EngineClient, str]:
    config = resolve(config_dir=Path(args.chdir), address=args.address, state=args.state, token=args.token)
    if need_state and not config.state:
        raise ClientConfigError("no state name: pass --state NAME or use a backend address ending in /v1/states/NAME")
    args.token_source = config.token_source
    return EngineClient(config), config.state or ""


def _print_json(value: Any) -> None:
    print_json(value)


def _span(row: dict[str, Any]) -> str:
    end = row.get("delete_serial")
    return f"[{row['create_serial']}, {'' if end is None else end})"


def cmd_states(args: argparse.Namespace) -> int:
    client, _ = _client(args, need_state=False)
    found = client.list_states()
    if args.json:
        _print_json(found)
        return EXIT_OK
    for s in found:
        lock = "  locked" if s["locked"] else ""
        print(f"{s['name']}\tserial {s['current_serial']}\t{s['resources']} resources{lock}")
    return EXIT_OK


def cmd_state_ls(args: argparse.Namespace) -> int:
    client, state = _client(args)
    listing = client.list_resources(state, serial=args.serial, prefix=args.prefix)
    if args.json:
        _print_json(listing)
        return EXIT_OK
    for row in listing["resources"]:
        extra = f" (deposed {row['deposed']})" if row["deposed"] else ""
        extra += " (tainted)" if row["status"] == "tainted" else ""
        print(f"{row['address']}{extra}")
    print(f"# {listing['count']} instances in {state!r} at serial {listing['serial']}", file=sys.stderr)
    return EXIT_OK


def cmd_state_history(args: argparse.Namespace) -> int:
    client, state = _client(args)
    rows = client.history(state, args.resource_address)
    if args.json:
        _print_json(rows)
        return EXIT_OK
    for row in rows:
        status = "alive" if row["delete_serial"] is None else "closed"
        print(f"serials {_span(row)}\t{status}\thash {row['attributes_hash'][:12]}")
    return EXIT_OK


def _age(moment: str | None, now: datetime) -> str:
    if not moment:
        return "-"
    return format_duration(now - datetime.fromisoformat(moment))


def _left(moment: str | None, now: datetime) -> str:
    if not moment:
        return "no lease"
    return format_duration(datetime.fromisoformat(moment) - now)


def cmd_reservations(args: argparse.Namespace) -> int:
    client, state = _client(args, need_state=False)
    found = client.list_reservations(state or None)
    if args.json:
        _print_json([{k: r[k] for k in ("state", "glob", "mode", "holder", "run_id", "acquired_at", "expires_at")}
                     for r in found])
        return EXIT_OK
    now = datetime.now(UTC)
    if not found:
        print("no live reservations")
    for r in found:
        run = r["run_id"] or "terraform lock"
        print(f"{r['state']}\t{r['mode']:<5} {r['glob']}\theld by {r['holder']} ({run}, "
              f"acquired {_age(r['acquired_at'], now)} ago, {'expires in ' if r['expires_at'] else ''}"
              f"{_left(r['expires_at'], now)})")
    return EXIT_OK


def cmd_runs(args: argparse.Namespace) -> int:
    client, state = _client(args, need_state=False)
    found = client.list_runs(state or None, status=args.status)
    if args.json:
        _print_json([{k: r[k] for k in ("id", "state", "status", "actor", "started_at", "finished_at",
                                        "base_serial", "committed_serial", "error_summary")} for r in found])
        return EXIT_OK
    for r in found:
        serial = f" serial {r['committed_serial']}" if r["committed_serial"] is not None else ""
        print(f"{r['id']}\t{r['state']}\t{r['status']:<9}\t{r['actor']}\tstarted {r['started_at']}{serial}")
    return EXIT_OK


def cmd_abort(args: argparse.Namespace) -> int:
    client, _ = _client(args, need_state=False)
    result = client.run_action(args.run_id, "abort", {"reason": args.reason or ""})
    run = result["run"]
    print(f"aborted {run['id']} ({run['state']}, held by {run['actor']}); its reservations are released")
    return EXIT_OK


def _terraform_context(env: dict[str, str]) -> Any:
    from runner.config import data_dir
    from runner.plan import TerraformContext
    from runner.terraform import TerraformNotFoundError, resolve_binary

    try:
        binary = resolve_binary(env)
    except TerraformNotFoundError as exc:
        raise UsageError(str(exc)) from exc
    return TerraformContext(binary=binary, env=env, plugin_cache=data_dir(env) / "plugin-cache",
                            echo=lambda line: print(line, flush=True))


def _var_args(args: argparse.Namespace) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for raw in args.var or []:
        if "=" not in raw:
            raise UsageError(f"-var {raw!r} must be NAME=VALUE")
        found.append(("var", raw))
    found += [("var-file", path) for path in args.var_file or []]
    return found


def _selection(args: argparse.Namespace, config_dir: Path) -> Any:
    """The file selection of -f / --changed-from, or None for a full plan."""
    from runner.filescoped import Selection, changed_selection

    if not args.file and not args.changed_from:
        return None
    files = [str(Path(f)) for f in args.file or []]
    for name in files:
        hint = file_hint(config_dir, name)
        if hint:
            raise UsageError(hint)
    if not args.changed_from:
        return Selection(tuple(files))
    from runner.git import GitError

    try:
        chosen = changed_selection(config_dir, args.changed_from)
    except GitError as exc:
        raise UsageError(str(exc)) from exc
    return Selection(tuple(sorted(set(chosen.files) | set(files))), chosen.deleted, chosen.variables)


def _plan_spec(args: argparse.Namespace, env: dict[str, str]) -> tuple[Any, Any, Any]:
    from runner.config import data_dir
    from runner.filescoped import plan_files
    from runner.plan import make_plan

    config_dir = Path(args.chdir).resolve()
    if not config_dir.is_dir():
        raise UsageError(f"-C {args.chdir}: no such directory")
    config = resolve(config_dir=config_dir, address=args.address, state=args.state, token=args.token, env=env)
    args.token_source = config.token_source
    if not config.state:
        raise ClientConfigError("no state name: pass --state NAME or use a backend address ending in /v1/states/NAME")
    client, ctx = EngineClient(config), _terraform_context(env)
    selection = _selection(args, config_dir)
    if selection is None:
        return make_plan(client, ctx, state=config.state, config_dir=config_dir, var_args=_var_args(args),
                         targets=args.target or [], refresh=getattr(args, "refresh", False)), client, selection
    spec = plan_files(client, ctx, state=config.state, config_dir=config_dir, selection=selection,
                      var_args=_var_args(args), data_dir=data_dir(env), refresh=getattr(args, "refresh", False))
    return spec, client, selection


def cmd_plan(args: argparse.Namespace) -> int:
    from runner.config import process_env
    from runner.plan import summary

    with json_mode(args):
        spec, _, selection = _plan_spec(args, process_env())
        out = Path(args.out or ("kl-plan.igplan" if selection is not None else "kl-plan.json"))
        out.write_text(spec.to_json())
        print(summary(spec))
        if spec.write_set or spec.output_changes:
            print(f"\nwrote {out}: apply it with kl apply {out}")
        else:
            print(f"\nwrote {out}; the plan has no changes, so kl apply would do nothing")
    if args.json:
        print_json(plan_document(spec, out), args.json_out)
    return EXIT_OK


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
    from runner.apply import ApplyOptions, ApplyOutcome, apply_spec
    from runner.config import data_dir, default_actor, process_env
    from runner.filescoped import apply_files
    from runner.plan import summary
    from runner.spec import PlanSpec

    env = process_env()
    supplied = dict(raw.split("=", 1) for kind, raw in _var_args(args) if kind == "var")
    options = ApplyOptions(actor=args.actor or default_actor(env), wait_seconds=args.wait, dry_run=args.dry_run,
                           data_dir=data_dir(env), supplied_vars=supplied, lease_seconds=args.lease)
    if args.plan_file and (args.file or args.changed_from):
        raise UsageError("give either a plan file or -f/--changed-from, not both")
    if args.plan_file:
        spec = PlanSpec.load(Path(args.plan_file))
        config = resolve(config_dir=Path(spec.config_dir), address=args.address or spec.address,
                         state=spec.state, token=args.token, env=env)
        args.token_source = config.token_source
        client = EngineClient(config)
    elif args.file or args.changed_from:
        spec, client, _ = _plan_spec(args, env)
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
    if spec.mode == "files":
        outcome = apply_files(client, _terraform_context(env), spec, options, {})
    else:
        outcome = apply_spec(client, _terraform_context(env), spec, Path(spec.config_dir), options)
    return spec, outcome


def cmd_recover(args: argparse.Namespace) -> int:
    from runner.apply import recover
    from runner.config import data_dir, process_env

    with json_mode(args):
        client, _ = _client(args, need_state=False)
        outcome = recover(client, data_dir(process_env()), args.run_id, args.actor)
    if args.json:
        print_json({"recovered_run_id": args.run_id, "run_id": outcome.run_id, "commit_serial": outcome.serial,
                    "committed_addresses": list(outcome.changed), "rows": dict(outcome.rows)}, args.json_out)
    return EXIT_OK


def cmd_embedded_stop(args: argparse.Namespace) -> int:
    from app.embedded import default_data_dir, stop_embedded_postgres, stop_embedded_redis
    from runner.config import data_dir, process_env

    where = data_dir(process_env()) if process_env().get("KL_DATA_DIR") else default_data_dir()
    stopped = [name for name, stop in (("Postgres", stop_embedded_postgres), ("Redis", stop_embedded_redis))
               if stop(where)]
    print(f"stopped embedded {' and '.join(stopped)} in {where}" if stopped else f"nothing running in {where}")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    # Every subparser is a KlArgumentParser (usage errors exit 3 with the subcommand's own usage).
    # To add a command: sub.add_parser(...), its options, set_defaults(func=...), anywhere below.
    parser = KlArgumentParser(prog="kl", description="Kilolock: Terraform state as rows, applied in parallel.")
    parser.add_argument("--version", action="version", version=f"kl {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the service (dev server; use gunicorn in production)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument("--control-port", type=int, help="serve the control API (/v1/api) only on this port")
    serve.add_argument("--control-host", default="127.0.0.1", help="address for --control-port (default 127.0.0.1)")
    serve.add_argument("--allow-open-on-network", action="store_true",
                       help="serve KL_AUTH_MODE=open on a non-loopback address anyway")
    serve.set_defaults(func=cmd_serve)

    worker = sub.add_parser("worker", help="run a GitHub bot worker (RQ) on the kilolock queue")
    worker.add_argument("--burst", action="store_true", help="run the queued jobs, then exit")
    worker.add_argument("--name", help="worker name shown by RQ (default: host and pid)")
    worker.add_argument("--no-scheduler", action="store_true",
                        help="do not run RQ's scheduler in this worker (retries need one somewhere)")
    worker.set_defaults(func=cmd_worker)

    migrate = sub.add_parser("migrate", help="apply pending database migrations")
    migrate.set_defaults(func=cmd_migrate)

    def file_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("-f", "--file", action="append", metavar="FILE",
                       help="file-scoped: plan only this .tf file and what it needs (repeatable)")
        p.add_argument("--changed-from", metavar="GIT_REF",
                       help="file-scoped: the .tf files changed since GIT_REF (git diff against the working tree)")

    def client_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("-C", "--chdir", default=".", metavar="DIR",
                       help="configuration directory, whose backend block names the server (default: .)")
        p.add_argument("--address", help="server or backend address (default: the backend block)")
        p.add_argument("--state", help="state name (default: from the backend address)")
        p.add_argument("--token", help="API token (default: KL_TOKEN, TF_HTTP_PASSWORD, the backend block)")
        p.add_argument("--json", action="store_true", help="print JSON")

    states = sub.add_parser("states", help="list the states on the server")
    client_options(states)
    states.set_defaults(func=cmd_states)

    state = sub.add_parser("state", help="inspect a state's resource rows")
    state_sub = state.add_subparsers(dest="state_command", required=True, metavar="SUBCOMMAND")
    ls = state_sub.add_parser("ls", help="list resource instances at the head or a serial")
    client_options(ls)
    ls.add_argument("--serial", type=int, help="list as of this serial (default: the head)")
    ls.add_argument("--prefix", help="only addresses under this structured prefix, e.g. module.web")
    ls.set_defaults(func=cmd_state_ls)
    hist = state_sub.add_parser("history", help="one instance's lifecycles across versions")
    client_options(hist)
    hist.add_argument("resource_address", metavar="ADDRESS")
    hist.set_defaults(func=cmd_state_history)

    reservations = sub.add_parser("reservations", help="list live reservations (and Terraform state locks)")
    client_options(reservations)
    reservations.set_defaults(func=cmd_reservations)

    runs = sub.add_parser("runs", help="list apply runs, newest first")
    client_options(runs)
    runs.add_argument("--status", choices=["reserved", "running", "committed", "failed", "aborted", "expired"])
    runs.set_defaults(func=cmd_runs)

    abort = sub.add_parser("abort", help="abort an apply run and release its reservations (operators)")
    client_options(abort)
    abort.add_argument("run_id", metavar="RUN_ID")
    abort.add_argument("--reason", help="recorded in the run and the audit trail")
    abort.set_defaults(func=cmd_abort)

    plan = sub.add_parser("plan", help="plan against the trunk and write kl-plan.json (reservations to take)")
    client_options(plan)
    plan.add_argument("--out", help="where to write the plan file (default kl-plan.json, or kl-plan.igplan with -f)")
    file_options(plan)
    plan.add_argument("-var", "--var", action="append", metavar="NAME=VALUE", help="an input variable")
    plan.add_argument("-var-file", "--var-file", action="append", metavar="FILE", help="a variables file")
    plan.add_argument("--target", action="append", metavar="ADDRESS", help="plan only this address (repeatable)")
    plan.add_argument("--refresh", action="store_true",
                      help="refresh the slice's objects first, so the plan sees drift in what it changes")
    plan.set_defaults(func=cmd_plan)

    apply = sub.add_parser("apply", help="apply a kl-plan.json: reserve, apply the slice, commit row by row")
    client_options(apply)
    apply.add_argument("plan_file", nargs="?", metavar="PLAN_FILE")
    file_options(apply)
    apply.add_argument("--confirm-scope", action="store_true",
                       help="with -f/--changed-from: apply the derived scope (without it, kl prints it and stops)")
    apply.add_argument("-var-file", "--var-file", action="append", metavar="FILE", help="with -f: a variables file")
    apply.add_argument("--target", action="append", help=argparse.SUPPRESS)
    apply.add_argument("--actor", help="who is applying (default: KL_ACTOR or user@host)")
    apply.add_argument("--wait", type=parse_duration, metavar="DURATION",
                       help="wait up to this long for conflicting reservations (default: fail fast)")
    apply.add_argument("--dry-run", action="store_true", help="reserve, report and release; change nothing")
    apply.add_argument("--lease", type=parse_duration, default=900.0, metavar="DURATION",
                       help="reservation lease, renewed while Terraform runs (default 15m)")
    apply.add_argument("-var", "--var", action="append", metavar="NAME=VALUE",
                       help="a sensitive variable's value again (not stored in the plan file)")
    apply.set_defaults(func=cmd_apply)

    recover_cmd = sub.add_parser("recover", help="commit the post-apply state kept for a run that did not commit")
    client_options(recover_cmd)
    recover_cmd.add_argument("run_id", metavar="RUN_ID")
    recover_cmd.add_argument("--actor", help="holder for the new run when the old one has ended")
    recover_cmd.set_defaults(func=cmd_recover)

    from runner.drift_cli import add_commands as add_drift_commands

    add_drift_commands(sub, client_options, parse_duration)

    embedded = sub.add_parser("embedded", help="manage the embedded Postgres and Redis under KL_DATA_DIR")
    embedded_sub = embedded.add_subparsers(dest="embedded_command", required=True, metavar="SUBCOMMAND")
    embedded_stop = embedded_sub.add_parser("stop", help="stop the embedded servers (they outlive kl serve)")
    embedded_stop.set_defaults(func=cmd_embedded_stop)

    tenants = sub.add_parser("tenants", help="manage tenants (operators with database access)")
    tenants_sub = tenants.add_subparsers(dest="tenants_command", required=True, metavar="SUBCOMMAND")
    t_create = tenants_sub.add_parser("create", help="create a tenant")
    t_create.add_argument("slug", metavar="SLUG")
    t_create.add_argument("--name", help="display name (default: the slug)")
    t_create.set_defaults(func=cmd_tenants_create)
    t_list = tenants_sub.add_parser("list", help="list tenants")
    t_list.add_argument("--json", action="store_true", help="print JSON")
    t_list.set_defaults(func=cmd_tenants_list)

    tokens = sub.add_parser("tokens", help="manage API tokens (operators with database access)")
    tokens_sub = tokens.add_subparsers(dest="tokens_command", required=True, metavar="SUBCOMMAND")
    k_create = tokens_sub.add_parser("create", help="create a token for one environment; prints the secret once")
    k_create.add_argument("tenant", metavar="TENANT")
    k_create.add_argument("--name", required=True, help="what the token is for, e.g. terraform-ci")
    k_create.add_argument("--environment", required=True, help="environment name, created on first use")
    k_create.add_argument("--workspace", default="default", help="workspace name (default: default)")
    k_create.add_argument("--server-url", default="http://localhost:8080", help="base URL for the backend block")
    k_create.add_argument("--json", action="store_true", help="print JSON")
    k_create.set_defaults(func=cmd_tokens_create)
    k_list = tokens_sub.add_parser("list", help="list a tenant's tokens (never the secrets)")
    k_list.add_argument("tenant", metavar="TENANT")
    k_list.add_argument("--json", action="store_true", help="print JSON")
    k_list.set_defaults(func=cmd_tokens_list)
    k_revoke = tokens_sub.add_parser("revoke", help="revoke a token; it stops working at once")
    k_revoke.add_argument("tenant", metavar="TENANT")
    k_revoke.add_argument("token_id", metavar="TOKEN_ID")
    k_revoke.set_defaults(func=cmd_tokens_revoke)
    from runner import prune as prune_command  # registered from its own module

    prune_command.register(sub)
    return parser


def _prepare(parser: argparse.ArgumentParser) -> None:
    for leaf in leaf_parsers(parser):
        leaf.set_defaults(kl_parser=leaf)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    _prepare(parser)
    args = parser.parse_args(argv)
    try:
        code = _run(args)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # kl states | head: the reader left; say nothing more, and keep Python from complaining at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED


def _run(args: argparse.Namespace) -> int:
    from runner.cli_hints import explain

    try:
        code: int = args.func(args)
        return code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        raise
    except Exception as exc:  # noqa: BLE001 - every error kl knows becomes one message and an exit code
        found = explain(exc, args)
        if found is None:
            raise
        code, message = found
        if getattr(args, "json", False):  # the one JSON document, for a wrapper that parses stdout
            print_json({"ok": False, "exit_code": code, "error": message}, getattr(args, "json_out", None))
        print(f"kl: {message}", file=sys.stderr)
        if code == EXIT_USAGE and isinstance(exc, UsageError) and getattr(args, "kl_parser", None) is not None:
            sys.stderr.write(args.kl_parser.format_usage())
        return code


if __name__ == "__main__":
    sys.exit(main())
