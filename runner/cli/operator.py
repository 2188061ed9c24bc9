"""The operators' kl commands, run beside the service with its settings (``KL_*``) and database access:
``kl serve``, ``kl worker``, ``kl migrate``, ``kl embedded stop``, ``kl tenants``, ``kl tokens`` and ``kl prune``.

Each command imports what it runs (the web app, the store, the bot's jobs) inside itself, so ``kl`` with a
client command never loads them.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from app.domain.backend_blocks import backend_block, scoped_backend_block
from runner.cli.support import EXIT_OK, Commands, print_json
from runner.core.errors import InvalidInput, UsageError

DEFAULT_SERVER_URL = "http://localhost:8080"  # kl serve's default listener, as clients on this machine reach it


def cmd_serve(args: argparse.Namespace) -> int:
    import threading

    from app.config import AuthMode, Settings
    from app.domain.network import is_loopback
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
    shown_host = "localhost" if args.host in ("127.0.0.1", "0.0.0.0", "::") else args.host
    # The control API's blocks name the main listener (or KL_PUBLIC_URL), never the control port itself.
    main_url = settings.public_url or f"http://{shown_host}:{args.port}"
    # Listening only once the apps exist: a client that connects early is refused, not left waiting.
    main_app = create_app(settings, lanes="public" if args.control_port else "all")
    control_app = create_app(replace(settings, public_url=main_url), lanes="control") if args.control_port else None
    server = listen(args.host, args.port, main_app, "service")
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
    print(serve_block(base, settings.auth_mode))
    print(flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return EXIT_OK


def serve_block(base: str, mode: Any) -> str:
    """The block kl serve prints: in database mode it carries the ``username`` Basic auth needs, with the
    ids left for ``kl tokens create`` (or the control API), which prints the block of each token."""
    from app.config import AuthMode

    if mode is AuthMode.DATABASE:
        return ("# KL_AUTH_MODE=database: `kl tokens create TENANT --name NAME --environment ENV` prints this\n"
                "# block with the token's workspace and environment ids in place of the <...> below.\n"
                + scoped_backend_block(base, "<workspace_id>", "<environment_id>", "example"))
    return backend_block(base, static_auth=mode is AuthMode.STATIC)


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
        print_json([{"slug": t.slug, "name": t.name, "created_at": t.created_at.isoformat()} for t in found])
        return EXIT_OK
    for t in found:
        print(f"{t.slug}\t{t.name}")
    return EXIT_OK


def _token_json(info: Any) -> dict[str, Any]:
    return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in asdict(info).items()}


def _scopes_of(args: argparse.Namespace) -> list[str]:
    """--scope GLOB:MODE (repeated) and --scopes-from-owners PROJECT, or --plan-only (the preset '*:read');
    none: the whole state."""
    from app.domain.scopes import PLAN_ONLY

    if args.plan_only and (args.scope or args.scopes_from_owners):
        raise UsageError("give --scope or --scopes-from-owners, or --plan-only, not both (--plan-only is the "
                         "scope '*:read')")
    if args.plan_only:
        return list(PLAN_ONLY)
    owned = _owner_scopes(args.checkout, args.scopes_from_owners) if args.scopes_from_owners else []
    return list(dict.fromkeys([*owned, *(args.scope or [])]))


def _owner_scopes(checkout: str, name: str) -> list[str]:
    """The scopes of one project's owners: rules (top-level ones included) in the ``.kilolock.yml`` of a
    checkout of the repository's default branch: what the bot's token for that project may do."""
    from runner.bot.config import BotConfigError, load
    from runner.bot.owners import token_scopes

    root = Path(checkout)
    if root.is_file():
        root = root.parent
    try:
        config = load(root)
    except BotConfigError as exc:
        raise UsageError(f"--scopes-from-owners: {exc}") from None
    if config.source == "discovered":
        raise UsageError(f"--scopes-from-owners: {root} has no .kilolock.yml; give --checkout a checkout of the "
                         "repository's default branch")
    project = config.project(name)
    if project is None:
        known = ", ".join(p.name for p in config.projects)
        raise UsageError(f"--scopes-from-owners: {config.source} in {root} has no project {name!r} (its projects: "
                         f"{known})")
    if not any(rule.owners for rule in project.owners):
        raise UsageError(f"--scopes-from-owners: project {name!r} has no owners: rule naming an owner, so its token "
                         "could change nothing; add owners: to .kilolock.yml or give --scope")
    return list(token_scopes(project.owners))


def _print_scopes(info: Any) -> None:
    print("scopes: " + (", ".join(info.scopes) if info.scopes else "none (the whole state of its environment)"))


def cmd_tokens_create(args: argparse.Namespace) -> int:
    from app.store import tenancy

    scopes = _scopes_of(args)  # a refused --scopes-from-owners touches no database
    secret, info = tenancy.create_token(_operator_db(), args.tenant, name=args.name, environment=args.environment,
                                        workspace=args.workspace, actor=_operator_name(), scopes=scopes)
    block = scoped_backend_block(_server_url(args), info.workspace_id, info.environment_id)
    if args.json:
        print_json({"token_secret": secret, "token": _token_json(info), "workspace_id": info.workspace_id,
                    "environment_id": info.environment_id, "backend_block": block})
        return EXIT_OK
    print(f"token {info.id} ({info.name}) for {info.workspace_id}/{info.environment_id}")
    _print_scopes(info)
    print(f"secret (shown once, store it now): {secret}\n")
    print(block)
    return EXIT_OK


def _server_url(args: argparse.Namespace) -> str:
    """--server-url, else KL_PUBLIC_URL, else kl serve's default listener."""
    from app.config import Settings

    return (args.server_url or Settings.from_env().public_url or DEFAULT_SERVER_URL).rstrip("/")


def cmd_tokens_list(args: argparse.Namespace) -> int:
    from app.store import tenancy

    found = tenancy.list_tokens(_operator_db(), args.tenant)
    if args.json:
        print_json([_token_json(t) for t in found])
        return EXIT_OK
    for t in found:
        state = "revoked" if t.revoked_at else "active"
        used = t.last_used_at.isoformat() if t.last_used_at else "never used"
        scopes = ",".join(t.scopes) or "whole state"
        print(f"{t.id}\t{t.name}\t{t.workspace}/{t.environment}\t{state}\tcreated {t.created_at.isoformat()}\t{used}"
              f"\tscopes {scopes}")
    return EXIT_OK


def cmd_tokens_scopes(args: argparse.Namespace) -> int:
    from app.store import tenancy

    given = args.scope or args.plan_only or args.scopes_from_owners
    if not (given or args.whole_state) or (args.whole_state and given):
        raise UsageError("give the new scopes (--scope GLOB:MODE ..., --scopes-from-owners PROJECT, or "
                         "--plan-only), or --whole-state to remove every scope")
    scopes = _scopes_of(args)
    info = tenancy.set_token_scopes(_operator_db(), args.tenant, args.token_id, scopes, actor=_operator_name())
    if args.json:
        print_json(_token_json(info))
        return EXIT_OK
    print(f"token {info.id} ({info.name}): scopes replaced; its next request is checked against them")
    _print_scopes(info)
    return EXIT_OK


def _scope_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scope", action="append", metavar="GLOB:MODE",
                        help="an address scope, read or write (write implies read), e.g. 'module.payments.*:write'; "
                             "repeat it; without any the token has the whole state")
    parser.add_argument("--plan-only", action="store_true",
                        help="the preset '*:read': reads, slices and read reservations for kl plan, no writes")
    parser.add_argument("--scopes-from-owners", metavar="PROJECT",
                        help="write scopes for each glob the project's owners: rules (top-level ones included) give "
                             "an owner, plus '*:read': the bot's token for that project (see docs/github.md)")
    parser.add_argument("--checkout", default=".", metavar="DIR",
                        help="with --scopes-from-owners: a checkout of the repository's default branch, or its "
                             ".kilolock.yml (default: the current directory)")


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


def cmd_embedded_stop(args: argparse.Namespace) -> int:
    from app.embedded import default_data_dir, stop_embedded_postgres, stop_embedded_redis
    from runner.core.config import data_dir, process_env

    where = data_dir(process_env()) if process_env().get("KL_DATA_DIR") else default_data_dir()
    stopped = [name for name, stop in (("Postgres", stop_embedded_postgres), ("Redis", stop_embedded_redis))
               if stop(where)]
    print(f"stopped embedded {' and '.join(stopped)} in {where}" if stopped else f"nothing running in {where}")
    return EXIT_OK


def cmd_embedded_info(args: argparse.Namespace) -> int:
    from app.embedded import default_data_dir, describe_embedded_postgres
    from runner.core.config import data_dir, process_env

    where = data_dir(process_env()) if process_env().get("KL_DATA_DIR") else default_data_dir()
    pg = describe_embedded_postgres(where)
    if args.json:
        print_json({"data_dir": str(pg.pgdata), "version": pg.version, "running": pg.pid is not None,
                    "pid": pg.pid, "socket_dir": str(pg.socket_dir) if pg.socket_dir else None, "port": pg.port,
                    "url": pg.url, "bin_dir": str(pg.bin_dir)})
        return EXIT_OK
    state = f"running (pid {pg.pid})" if pg.pid is not None else "not running (kl serve starts it)"
    print(f"embedded Postgres {pg.version or '(not created yet)'} in {pg.pgdata}: {state}")
    if pg.url:
        print(f"  socket directory: {pg.socket_dir} (port {pg.port})")
        print(f"  URL:              {pg.url}")
    print(f"  bundled tools:    {pg.bin_dir} (psql, pg_dump, pg_restore… of the same version)")
    print(f"  log:              {pg.pgdata / 'log'}")
    if pg.url:
        print(f"try: {pg.bin_dir / 'psql'} '{pg.url}'")
    return EXIT_OK


def cmd_prune(args: argparse.Namespace) -> int:
    from app.config import Settings
    from app.store import Database, prune
    from app.store.migrate import migrate
    from app.web import resolve_database_url

    settings = Settings.from_env()
    keep = settings.retain_versions if args.keep is None else args.keep
    days = settings.retain_days if args.older_than_days is None else args.older_than_days
    if keep < 0 or days < 0:
        raise UsageError("--keep and --older-than-days must be zero or more")
    policy = prune.RetentionPolicy(keep_versions=keep or None, keep_age=timedelta(days=days) if days else None)
    if not policy.enabled:
        raise UsageError("retention is off: pass --keep N and/or --older-than-days DAYS, or set "
                         "KL_RETAIN_VERSIONS / KL_RETAIN_DAYS")
    url = resolve_database_url(settings)
    migrate(url)
    db = Database(url, pool_size=2)
    try:
        report = prune.prune(db, policy, dry_run=args.dry_run)
    finally:
        db.close()
    if args.json:
        print(json.dumps({"states": report.states, "versions": report.versions, "bytes": report.bytes,
                          "dry_run": report.dry_run, "rule": policy.describe()}))
        return EXIT_OK
    verb = "would remove" if report.dry_run else "removed"
    print(f"{verb} the raw bytes of {report.versions} versions in {report.states} states "
          f"({report.bytes:,} bytes); rule: versions {policy.describe()}")
    return EXIT_OK


def port_free(host: str, port: int, what: str) -> None:
    """Refuse a port in use before anything starts or is printed, so the clash is the only thing said."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as exc:
        # InvalidInput, not UsageError: the command line is fine, so no usage follows the one line.
        raise InvalidInput(f"cannot listen on {host}:{port} for the {what}: {exc.strerror or exc}. Another process "
                         "(perhaps another kl serve) holds that port: stop it, or pass --port/--control-port with "
                         "a free one") from None


def listen(host: str, port: int, app: Any, what: str) -> Any:
    from werkzeug.serving import WSGIRequestHandler, make_server

    class OneLinePerRequest(WSGIRequestHandler):
        """The app logs each request itself (kilolock.web, without colours): werkzeug's own access line
        (coloured with ANSI codes) would repeat it. Werkzeug's error lines stay."""

        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            return

    try:
        return make_server(host, port, app, threaded=True, request_handler=OneLinePerRequest)
    except (OSError, SystemExit):  # werkzeug reports a clash itself and exits; taken since port_free looked
        port_free(host, port, what)
        raise


def register_service(sub: Commands) -> None:
    """Add kl serve, worker and migrate to the ``kl`` subcommands."""
    serve = sub.add_parser("serve", help="run the service (dev server; use gunicorn in production)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default: 127.0.0.1; open auth mode refuses a public one)")
    serve.add_argument("--port", type=int, default=8080, help="port to listen on (default: 8080)")
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


def register_admin(sub: Commands) -> None:
    """Add kl embedded, tenants, tokens and prune to the ``kl`` subcommands."""
    embedded = sub.add_parser("embedded", help="manage the embedded Postgres and Redis under KL_DATA_DIR")
    embedded_sub = embedded.add_subparsers(dest="embedded_command", required=True, metavar="SUBCOMMAND")
    embedded_stop = embedded_sub.add_parser("stop", help="stop the embedded servers (they outlive kl serve)")
    embedded_stop.set_defaults(func=cmd_embedded_stop)
    embedded_info = embedded_sub.add_parser("info", help="where the embedded Postgres is and how to reach it",
                                            description="Print the embedded Postgres's data directory, whether "
                                                        "it runs, its socket directory and URL, and where the "
                                                        "wheel's psql and pg_dump of the same version are.")
    embedded_info.add_argument("--json", action="store_true", help="print JSON")
    embedded_info.set_defaults(func=cmd_embedded_info)

    _register_tenancy(sub)

    p = sub.add_parser("prune", help="remove the raw bytes of old state versions (retention; operators)")
    p.add_argument("--keep", type=int, metavar="N",
                   help="keep the bytes of the newest N versions of each state (default: KL_RETAIN_VERSIONS)")
    p.add_argument("--older-than-days", type=int, metavar="DAYS",
                   help="prune only versions older than DAYS days (default: KL_RETAIN_DAYS)")
    p.add_argument("--dry-run", action="store_true", help="report what would be removed; change nothing")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_prune)


def _register_tenancy(sub: Commands) -> None:
    tenants = sub.add_parser("tenants", help="manage tenants (operators with database access)")
    tenants_sub = tenants.add_subparsers(dest="tenants_command", required=True, metavar="SUBCOMMAND")
    t_create = tenants_sub.add_parser("create", help="create a tenant")
    t_create.add_argument("slug", metavar="SLUG", help="1-63 lowercase letters, digits and dashes, e.g. acme")
    t_create.add_argument("--name", help="display name (default: the slug)")
    t_create.set_defaults(func=cmd_tenants_create)
    t_list = tenants_sub.add_parser("list", help="list tenants")
    t_list.add_argument("--json", action="store_true", help="print JSON")
    t_list.set_defaults(func=cmd_tenants_list)

    tokens = sub.add_parser("tokens", help="manage API tokens (operators with database access)")
    tokens_sub = tokens.add_subparsers(dest="tokens_command", required=True, metavar="SUBCOMMAND")
    k_create = tokens_sub.add_parser("create", help="create a token for one environment; prints the secret once")
    k_create.add_argument("tenant", metavar="TENANT", help="tenant slug")
    k_create.add_argument("--name", required=True, help="what the token is for, e.g. terraform-ci")
    k_create.add_argument("--environment", required=True, help="environment name, created on first use")
    k_create.add_argument("--workspace", default="default", help="workspace name (default: default)")
    k_create.add_argument("--server-url", help="base URL for the backend block (default: KL_PUBLIC_URL, else "
                                               f"{DEFAULT_SERVER_URL})")
    k_create.add_argument("--json", action="store_true", help="print JSON")
    _scope_flags(k_create)
    k_create.set_defaults(func=cmd_tokens_create)
    k_scopes = tokens_sub.add_parser("scopes", help="replace a token's address scopes (audited)")
    k_scopes.add_argument("tenant", metavar="TENANT", help="tenant slug")
    k_scopes.add_argument("token_id", metavar="TOKEN_ID", help="the token id, as kl tokens list shows it")
    _scope_flags(k_scopes)
    k_scopes.add_argument("--whole-state", action="store_true", help="remove every scope: the whole state again")
    k_scopes.add_argument("--json", action="store_true", help="print JSON")
    k_scopes.set_defaults(func=cmd_tokens_scopes)
    k_list = tokens_sub.add_parser("list", help="list a tenant's tokens (never the secrets)")
    k_list.add_argument("tenant", metavar="TENANT", help="tenant slug")
    k_list.add_argument("--json", action="store_true", help="print JSON")
    k_list.set_defaults(func=cmd_tokens_list)
    k_revoke = tokens_sub.add_parser("revoke", help="revoke a token; it stops working at once")
    k_revoke.add_argument("tenant", metavar="TENANT", help="tenant slug")
    k_revoke.add_argument("token_id", metavar="TOKEN_ID", help="the token's id (tok_..., from kl tokens list)")
    k_revoke.set_defaults(func=cmd_tokens_revoke)
