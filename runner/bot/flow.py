"""What the bot computes for a pull request, a merge or a push: the predicted footprint per project, the
file-scoped plan preview, and the file-scoped apply of a merged change — on a private checkout of the
commit, against the trunk on the Kilolock server.

Owns the orchestration only: the checkout (``runner.core.git``), the project mapping (``runner.bot.config``),
and the very functions ``kl plan --changed-from`` / ``kl apply -f --confirm-scope`` use
(``runner.core.pipeline``: ``changed_selection``, then ``scope_of``, ``plan`` and ``apply`` of one
``ChangeRequest``), with the engine client authenticated by the project's token (``runner.bot.credentials``).
Results are the outcome types of ``runner.bot.outcomes``.

Must not: talk to GitHub, RQ or the database (``runner.bot.jobs`` does: it claims, stores and posts), or read
the environment (``runner.core.config.process_env`` does, once per job).
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from analyzer.globs import Mode, footprint_reservations, texts_conflict
from app.config import Settings
from app.domain.redaction import Redactor
from app.domain.reservations import DEFAULT_LEASE, LIVE_STATUSES
from runner.bot.config import BotConfig, BotConfigError, Project, load, projects_for, read_raw
from runner.bot.credentials import engine_token
from runner.bot.outcomes import ApplyResult, ApplyStatus, LiveConflict, ProjectFootprint, ProjectPreview
from runner.core import childenv, git
from runner.core.config import ClientConfig, ClientConfigError, data_dir, process_env, split_backend_address
from runner.core.engine_client import EngineClient, EngineError
from runner.core.errors import InvalidInput, KlExit, NothingToDo, ReservationRefused, StalePlan
from runner.core.pipeline import (
    ApplyOptions,
    ApplyRun,
    ChangeRequest,
    ScopedFootprint,
    Selection,
    TerraformContext,
    apply,
    changed_selection,
    plan,
    scope_of,
)
from runner.core.terraform import TerraformNotFoundError, resolve_binary

log = logging.getLogger("kilolock.bot")
LEASE_SECONDS = DEFAULT_LEASE.total_seconds()
# All an untrusted preview's Terraform sees of the worker's environment (Workbench.without_credentials).
UNTRUSTED_ENV = frozenset({"PATH", "KL_TERRAFORM_BIN", "LANG", "LC_ALL", "TZ", "TMPDIR"})


@dataclass(frozen=True, slots=True)
class Workbench:
    """What one job works with: the settings, the worker's environment (Terraform gets an allowlist of it,
    :func:`terraform_context`), KL_DATA_DIR, and the redaction of the worker's secrets."""

    settings: Settings
    env: Mapping[str, str]
    data_dir: Path
    redactor: Redactor = field(default_factory=Redactor)

    @classmethod
    def for_settings(cls, settings: Settings) -> Workbench:
        env = process_env()
        return cls(settings, env, settings.data_dir or data_dir(env), worker_redactor(settings, env))

    def redact(self, text: str) -> str:
        return self.redactor.redact(text)

    @property
    def cache_dir(self) -> Path:
        return self.settings.repo_cache_dir or self.data_dir / "repos"

    def without_credentials(self) -> Workbench:
        """The workbench of untrusted code: Terraform gets only the variables it needs to run (the binary, PATH,
        automation switches) and an empty home of its own — no worker secret, no provider credential, no
        CLI configuration (which may carry registry credentials), no ``TF_VAR_*``."""
        home = self.data_dir / "untrusted-home"
        home.mkdir(parents=True, exist_ok=True)
        kept = {k: v for k, v in self.env.items() if k in UNTRUSTED_ENV}
        return replace(self, env={**kept, "HOME": str(home), "TF_INPUT": "0", "TF_IN_AUTOMATION": "1",
                                  "CHECKPOINT_DISABLE": "1"})


_SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "PRIVATE", "CREDENTIAL", "ACCESS_KEY", "API_KEY",
                 "AUTH")


def worker_redactor(settings: Settings, env: Mapping[str, str]) -> Redactor:
    """The worker's known secrets: the secret settings (``Settings.secret_values``), and the values of
    the environment's ``KL_*`` and credential-named variables."""
    values = list(settings.secret_values())
    values += [v for k, v in env.items() if k.startswith("KL_") or any(w in k.upper() for w in _SECRET_WORDS)]
    return Redactor.of(values)


@contextmanager
def checkout(workbench: Workbench, repo: str, sha: str, token: str | None, *, want: Sequence[str] = (),
             also: Sequence[str] = (), refresh: bool = False) -> Iterator[Path]:
    """A private checkout of ``sha`` from the repository's mirror. The commits in ``want`` must be fetched
    too; those in ``also`` are fetched when they can be (a merged PR's deleted head branch may be gone)."""
    url = git.clone_url(repo, clone_urls=dict(workbench.settings.github_clone_urls),
                        api_url=workbench.settings.github_api_url)
    try:
        mirror_dir = git.mirror(workbench.cache_dir, repo, url, token=token, want=(sha, *want, *also), refresh=refresh)
    except git.GitError:
        if not also:
            raise
        mirror_dir = git.mirror(workbench.cache_dir, repo, url, token=token, want=(sha, *want), refresh=refresh)
    with git.worktree(mirror_dir, sha) as root:
        yield root


def engine_client(workbench: Workbench, repo: str, root: Path, project: Project) -> EngineClient:
    """The server of a trusted project (its default-branch backend block, else KL_PUBLIC_URL), as the bot
    with the project's token (``runner.bot.credentials``). Nothing under ``root`` is read: a pull request's
    files never choose where the token goes."""
    address = project.address or workbench.settings.public_url
    if not address:
        raise ClientConfigError(f"project {project.name!r} names no Kilolock server: give its directory a backend "
                                "\"http\" block on the default branch, or set KL_PUBLIC_URL on the worker")
    base, _ = split_backend_address(address)
    token = engine_token(workbench.settings, repo, project.name)
    return EngineClient(ClientConfig(base_url=base, state=project.state, username=None, token=token.secret,
                                     token_source=token.source))


def terraform_context(workbench: Workbench, project: Project) -> TerraformContext:
    """How the bot runs Terraform for ``project`` (trusted): the worker's allowlisted environment plus the
    provider variables its default-branch ``env:`` names, never the worker's own secrets."""
    try:
        binary = resolve_binary(workbench.env)
    except TerraformNotFoundError as exc:
        raise InvalidInput(str(exc)) from exc
    return TerraformContext(binary=binary, env=childenv.for_worker(workbench.env, project.env),
                            plugin_cache=workbench.data_dir / "plugin-cache",
                            echo=lambda line: log.info("%s", workbench.redact(line)), stream=False)


def default_config(workbench: Workbench, repo: str, root: Path, branch: str,
                   token: str | None) -> tuple[str, BotConfig | None, tuple[str, ...]]:
    """The default branch's tip (as the mirror behind ``root`` knows it) and its validated ``.kilolock.yml``
    (None and the problems when invalid): the only source of trusted settings for a pull request."""
    tip = git.resolve_commit(root, f"refs/heads/{branch}")
    with checkout(workbench, repo, tip, token) as main_root:
        config, problems = read_config(main_root)
        return tip, config, problems


def anchored(project: Project, trusted: BotConfig | None) -> Project:
    """A pull request's project with what its files may not choose — the state, the server and the
    environment — taken from the default branch's project of the same name and directory. Raises
    ClientConfigError when the default branch has no such project."""
    known = trusted.project(project.name) if trusted is not None else None
    if known is None or known.dir != project.dir:
        why = "the default branch's .kilolock.yml is invalid" if trusted is None else \
            f"the default branch has no project {project.name!r} in {project.shown_dir!r}"
        raise ClientConfigError(f"{why}: a pull request's state, server and environment come from the default "
                                "branch, so this project is planned once it is merged there")
    return replace(project, state=known.state, address=known.address, env=known.env)


def read_config(root: Path) -> tuple[BotConfig | None, tuple[str, ...]]:
    """The checkout's validated ``.kilolock.yml``, or None and the problems that make it invalid."""
    try:
        return load(root), ()
    except BotConfigError as exc:
        return None, exc.problems


def config_source(root: Path) -> str:
    """Where the checkout's configuration was read from (for a report on an invalid one)."""
    try:
        return read_raw(root).source
    except BotConfigError as exc:
        return exc.source


def changed_for(config: BotConfig, root: Path, base: str, head: str) -> dict[str, tuple[str, ...]]:
    """Project name → the paths changed between two commits that trigger it."""
    return projects_for(config, git.changed_paths(root, base, head))


# --- the footprint (no Terraform) ------------------------------------------------------------------


def footprint(workbench: Workbench, repo: str, root: Path, config: BotConfig, base: str, head: str, *,
              trusted: BotConfig | None) -> tuple[ProjectFootprint, ...]:
    """Per triggered project: the files, the predicted reservations, diagnostics and the live reservations
    they would conflict with now. A project whose change cannot be scoped carries the reason in ``error``.
    ``trusted`` is the default branch's configuration (:func:`anchored`)."""
    found: list[ProjectFootprint] = []
    for name, paths in changed_for(config, root, base, head).items():
        project = config.project(name)
        assert project is not None
        shown = ProjectFootprint(name=project.name, dir=project.dir, state=project.state, changed=tuple(paths))
        try:
            project = anchored(project, trusted)
        except ClientConfigError as exc:
            found.append(_with(shown, error=workbench.redact(str(exc))))
            continue
        shown = _with(shown, state=project.state)
        try:
            changed = changed_selection(root / project.dir, base, against=head)
        except NothingToDo:
            continue  # every changed path is unrelated to the configuration (state files, .terraform/)
        except (KlExit, git.GitError) as exc:
            found.append(_with(shown, error=workbench.redact(str(exc))))
            continue
        try:
            client = engine_client(workbench, repo, root, project)
            # The parse cache is read, not written: the preview's plan saves (and prunes) it.
            scoped = scope_of(client, ChangeRequest(project.state, root / project.dir, workbench.data_dir,
                                                    changed.selection, files=changed.files))
            live = client.list_reservations(project.state)
        except (KlExit, EngineError, ClientConfigError) as exc:
            found.append(_with(shown, files=_shown_files(changed.selection), error=workbench.redact(str(exc))))
            continue
        found.append(ProjectFootprint(
            name=project.name, dir=project.dir, state=project.state, changed=tuple(paths),
            files=_shown_files(scoped.selection), write_globs=scoped.write_globs, read_globs=scoped.read_globs,
            diagnostics=tuple(scoped.widened) + tuple(f"{d.file}:{d.line}: {d.construct}: {d.message}"
                                                      for d in scoped.footprint.diagnostics),
            conflicts=live_conflicts(scoped.write_globs, scoped.read_globs, live)))
    return tuple(found)


def live_conflicts(write_globs: Sequence[str], read_globs: Sequence[str],
                   held: Sequence[Mapping[str, object]]) -> tuple[LiveConflict, ...]:
    """Live reservations (as ``GET /v1/engine/reservations`` lists them) that a run holding these globs
    would conflict with, by the reservation conflict matrix."""
    mine = footprint_reservations(write_globs, read_globs)
    found: list[LiveConflict] = []
    for row in held:
        theirs, their_mode = str(row["glob"]), str(row["mode"])
        for mine_one in mine:
            if texts_conflict(mine_one.mode, mine_one.glob, their_mode, theirs):
                run_id = row.get("run_id")
                found.append(LiveConflict(mine_one.glob, mine_one.mode, theirs, Mode(their_mode),
                                          str(row.get("holder") or "unknown"),
                                          str(run_id) if run_id else None))
    return tuple(sorted(set(found), key=lambda c: (c.glob, c.theirs, c.holder)))


def _shown_files(selection: Selection) -> tuple[str, ...]:
    deleted = sorted(f"{name} (deleted)" for name in selection.deleted if "@" not in name)
    return tuple(selection.files) + tuple(deleted)


def _with(shown: ProjectFootprint, **changes: object) -> ProjectFootprint:
    return replace(shown, **changes)  # type: ignore[arg-type]


# --- the plan preview --------------------------------------------------------------------------------


def preview(workbench: Workbench, repo: str, root: Path, config: BotConfig, base: str, head: str, *,
            trusted: BotConfig | None) -> tuple[ProjectPreview, ...]:
    """Per triggered project: a file-scoped plan (``kl plan --changed-from``) and its per-address actions;
    state, server and environment from ``trusted``, the default branch's configuration."""
    found: list[ProjectPreview] = []
    for name in changed_for(config, root, base, head):
        project = config.project(name)
        assert project is not None
        try:
            project = anchored(project, trusted)
            changed = changed_selection(root / project.dir, base, against=head)
            ctx = terraform_context(workbench, project)
            spec = plan(engine_client(workbench, repo, root, project), ctx,
                        ChangeRequest(project.state, root / project.dir, workbench.data_dir, changed.selection,
                                      files=changed.files)).spec
        except NothingToDo:
            continue
        except (KlExit, git.GitError, EngineError, ClientConfigError) as exc:
            found.append(ProjectPreview(project.name, project.state, error=workbench.redact(str(exc))))
            continue
        found.append(ProjectPreview(project.name, project.state, base_serial=spec.base_serial,
                                    actions=tuple(sorted(spec.actions.items())),
                                    output_changes=tuple(sorted(spec.output_changes.items())),
                                    warnings=tuple(spec.warnings)))
    return tuple(found)


# --- the apply after a merge --------------------------------------------------------------------------


def merge_diff_base(root: Path, merge_sha: str, base_sha: str, head_sha: str) -> str:
    """The commit the merge's change is measured from. A merge commit: its first parent. A squash merge:
    its parent. A rebase merge of k commits: k first-parent steps back (recognised because the last commit
    alone does not touch every path the pull request changed)."""
    parents = git.parents(root, merge_sha)
    if not parents:
        raise git.GitError(f"{merge_sha} has no parent: nothing to compare the merge with")
    if len(parents) > 1:
        return parents[0]
    try:
        fork = git.merge_base(root, base_sha, head_sha)
        changed = set(git.changed_paths(root, fork, head_sha))
        count = git.commit_count(root, fork, head_sha)
    except git.GitError as exc:
        log.warning("cannot compare %s with the pull request's commits (%s); using its parent", merge_sha, exc)
        return parents[0]
    if count <= 1 or changed <= set(git.changed_paths(root, parents[0], merge_sha)):
        return parents[0]
    return git.first_parent_back(root, merge_sha, count) or parents[0]


# Called with the cheap footprint before Terraform runs: waits for earlier merges it overlaps and returns
# how many seconds the apply may still wait for reservations (raises KlExit when it must not go on).
BeforeApply = Callable[[ScopedFootprint], float]


def apply_project(workbench: Workbench, repo: str, root: Path, project: Project, base: str, sha: str, *, actor: str,
                  wait_seconds: float, before_apply: BeforeApply | None = None,
                  origin: Mapping[str, Any] | None = None) -> ApplyResult:
    """``kl apply --changed-from BASE --confirm-scope`` for one project on a checkout of ``sha``. The
    footprint is derived once: ``before_apply`` sees it, the plan and the apply's workspace reuse it."""
    client: EngineClient | None = None
    try:
        changed = changed_selection(root / project.dir, base, against=sha)
        client = engine_client(workbench, repo, root, project)
        remaining, waited = wait_seconds, 0.0
        request = ChangeRequest(project.state, root / project.dir, workbench.data_dir, changed.selection,
                                files=changed.files)
        scoped = scope_of(client, request)
        if before_apply is not None:
            waiting = time.monotonic()
            remaining = before_apply(scoped)
            waited = time.monotonic() - waiting
        ctx = terraform_context(workbench, project)
        options = ApplyOptions(actor=actor, wait_seconds=max(remaining, 0.0), dry_run=False,
                               data_dir=workbench.data_dir, supplied_vars={}, lease_seconds=LEASE_SECONDS,
                               origin=origin)
        # The plan's workspace is kept through the apply: when nothing landed on the trunk between the plan
        # and the grant, the apply runs the saved plan instead of planning again (as kl apply -f does).
        with tempfile.TemporaryDirectory(prefix="kl-bot-plan-") as kept:
            planned = plan(client, ctx, replace(request, scoped=scoped), keep=Path(kept))
            spec = planned.spec
            outcome = apply(client, ctx, planned, options)
    except NothingToDo:
        return ApplyResult(project.name, project.state, sha, ApplyStatus.NO_CHANGES)
    except KlExit as exc:
        return _failed(project, sha, workbench.redact(str(exc)), _hint(exc), client, actor)
    except (git.GitError, ClientConfigError) as exc:
        return _failed(project, sha, workbench.redact(str(exc)), "fix the repository or the configuration, then re-run "
                       "the kilolock/apply check", client, actor)
    except EngineError as exc:
        return _failed(project, sha, workbench.redact(str(exc)), "the Kilolock server refused or could not be reached; "
                       "re-run the kilolock/apply check once it is available", client, actor)
    if not outcome.run_id or outcome.serial is None:
        return ApplyResult(project.name, project.state, sha, ApplyStatus.NO_CHANGES, run_id=outcome.run_id or None,
                           waited_seconds=round(waited, 1))
    return ApplyResult(project.name, project.state, sha, ApplyStatus.COMMITTED, serial=outcome.serial,
                       run_id=outcome.run_id,
                       actions=tuple(sorted(spec.actions.items())), waited_seconds=round(waited, 1))


def _hint(exc: KlExit) -> str:
    if isinstance(exc, ReservationRefused | StalePlan):
        return ("another apply holds or changed these addresses (a reservation conflict or a stale plan); re-run the "
                "kilolock/apply check to try again")
    if isinstance(exc, InvalidInput):
        return ("this change cannot be applied file-scoped; apply it with a full kl plan and kl apply, or fix the "
                "configuration in a new pull request")
    return ("fix the configuration in a new pull request (the trunk still holds the state before this merge), or "
            "re-run the kilolock/apply check if the failure was transient")


def _failed(project: Project, sha: str, error: str, hint: str, client: EngineClient | None,
            actor: str) -> ApplyResult:
    return ApplyResult(project.name, project.state, sha, ApplyStatus.FAILED,
                       run_id=latest_run(client, project.state, actor),
                       error=error, hint=hint)


def latest_run(client: EngineClient | None, state: str, actor: str) -> str | None:
    """The newest apply run ``actor`` opened on ``state`` (to name it in a failure report)."""
    if client is None:
        return None
    try:
        runs = client.list_runs(state)
    except EngineError:
        return None
    mine = [r for r in runs if r.get("actor") == actor]
    return str(mine[0]["id"]) if mine else None


def end_live_runs(workbench: Workbench, repo: str, root: Path, project: Project, actor: str, reason: str) -> list[str]:
    """Close (as failed) every live run ``actor`` holds on the project's state, so its reservations end now
    rather than at lease expiry (a job that timed out)."""
    client = engine_client(workbench, repo, root, project)
    ended: list[str] = []
    try:
        runs = client.list_runs(project.state)
    except EngineError:
        return ended
    for run in runs:
        if run.get("actor") == actor and run.get("status") in LIVE_STATUSES:
            not_closed = ApplyRun(client, str(run["id"]), actor).close_failed(reason)
            if not_closed is None:
                ended.append(str(run["id"]))
            else:
                log.warning("could not close run %s: %s", run["id"], not_closed)
    return ended


def branch_head(workbench: Workbench, repo: str, branch: str, token: str | None) -> str:
    """The commit ``branch`` points at now (the mirror is fetched first)."""
    url = git.clone_url(repo, clone_urls=dict(workbench.settings.github_clone_urls),
                        api_url=workbench.settings.github_api_url)
    mirror_dir = git.mirror(workbench.cache_dir, repo, url, token=token, refresh=True)
    return git.resolve_commit(mirror_dir, f"refs/heads/{branch}")
