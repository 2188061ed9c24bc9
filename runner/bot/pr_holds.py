"""Apply before merge: the ``kilolock apply`` and ``kilolock unlock`` comment commands, the pull-request
holds they leave, and what merges, closes, pushes and reconciliation do with them.

A comment apply reads the gate (``apply_on_comment``, ``apply_requirements``) and the projects from the
**default branch's** ``.kilolock.yml``, never from the pull request's head, checks every requirement
(``runner.bot.requirements``), and runs the same file-scoped apply as a merge (``flow.apply_project``)
on the head. What it committed is then held for the pull request (``app.store.pr_holds``): write
reservations under the holder ``owner/repo#N`` that no lease ends. A merge releases them and applies
again only the projects whose files on the merge commit differ from the applied head's; a close releases
them and warns; ``kilolock unlock`` releases them; a push marks the apply check stale. Deliveries GitHub
never made are caught by :func:`reconcile`: it asks GitHub about every pull request that holds and runs
the merge or close job that was missed.

Owns: those decisions, on top of the job context (``runner.bot.context``: settings, database, Redis,
GitHub clients). Must not: render Markdown (``runner.bot.holdtext``), or read the environment.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from app import queue
from app.config import AuthMode, Settings
from app.domain.commands import ApplyArgs
from app.domain.jobs import ClosedArgs, JobKind, MergeArgs, ReconcileArgs, job_id
from app.domain.principal import Principal, default_principal
from app.errors import BadRequestError, ReservationConflictError
from app.store import Database, tenancy
from app.store import bot as bot_store
from app.store import pr_holds as holds_store
from app.store.bot import JobStatus
from app.store.pr_holds import PrHold
from runner.bot import flow, holdtext, markdown, render
from runner.bot import requirements as apply_requirements
from runner.bot import trust as trust_rules
from runner.bot.config import BotConfig, Project
from runner.bot.context import Context, refresh
from runner.bot.credentials import EngineToken, engine_token, repository_tokens
from runner.bot.github import GitHub, PullInfo, Review
from runner.bot.outcomes import ApplyResult, ApplyStatus
from runner.bot.owners import OwnedGlob, owned_globs
from runner.bot.results import AppliedBefore, CommentResult, PrApply, ReadyCheck, Released, ReviewResult, results_of
from runner.core import git
from runner.core.errors import Failed, ReservationRefused
from runner.core.scope import ScopedFootprint

log = logging.getLogger("kilolock.holds")
APPLY_CHECK = "kilolock/apply"
RECONCILE_EVERY = 300  # seconds between two reconciliations of one repository's holds


def bot_principal(settings: Settings, db: Database, repo: str, project: str) -> Principal:
    """Whom the bot's holds of ``project`` belong to: the tenant and environment of the project's token
    (``runner.bot.credentials``; database auth), else the built-in tenant. A hold covers only what the
    project's apply committed, which that token's scopes already allowed."""
    return _principal_of(settings, db, engine_token(settings, repo, project))


def bot_principals(settings: Settings, db: Database, repo: str) -> list[Principal]:
    """The holders of every token the bot may present for some project of ``repo`` (one per environment),
    for what is found by id rather than by project."""
    found: dict[tuple[int, str], Principal] = {}
    for credential in repository_tokens(settings, repo):
        try:
            principal = _principal_of(settings, db, credential)
        except Failed:
            continue
        found.setdefault((principal.tenant_id, principal.scope), principal)
    if not found:
        raise Failed("no token the bot has for this repository is known to the server: it cannot release holds")
    return list(found.values())


def _principal_of(settings: Settings, db: Database, credential: EngineToken) -> Principal:
    if settings.auth_mode is AuthMode.DATABASE:
        token = tenancy.authenticate(db, credential.secret or "")
        if token is None:
            raise Failed(f"the token of {credential.source} is unknown or revoked: the bot cannot hold "
                         "reservations with it")
        return Principal(tenant_id=token.tenant_id, actor=token.name, scope=token.scope, token_name=token.name)
    return default_principal(actor="kilolock-bot")


# --- kilolock apply ---------------------------------------------------------------------------------


def comment_apply(ctx: Context, gh: GitHub, repo: str, number: int, login: str, args: ApplyArgs) -> CommentResult:
    """Run ``kilolock apply`` for a writer; the job stores the returned result (the reply always, and
    ``pr_apply`` when something was attempted)."""
    if args.problem:
        return CommentResult(reply=f"{markdown.mention(login)} {markdown.prose(args.problem)}", command="apply")
    pr = gh.pull_request(number)
    if pr.state != "open":
        return CommentResult(reply=f"{markdown.mention(login)} #{number} is {markdown.prose(pr.state)}: there is "
                                   "nothing to apply before merge.", command="apply")
    trust = trust_rules.of_pull_request(gh, repo, pr)
    if not trust.trusted:
        return CommentResult(reply=trust_rules.apply_refused(login, trust), command="apply")
    branch = gh.default_branch()
    token = gh.clone_token()
    with flow.checkout(ctx.workbench, repo, pr.head_sha, token, want=(pr.base_sha,), refresh=True) as head_root:
        _, config, problems = _default_config(ctx, repo, head_root, branch, token)
        if config is None:
            return CommentResult(reply=holdtext.config_invalid(login, branch, problems), command="apply")
        tip, wrong_base = _base_tip(head_root, config, pr, branch)
        if wrong_base:
            return CommentResult(reply=f"{markdown.mention(login)} {wrong_base}", command="apply")
        # The change is measured from where the head left the pull request's own base branch, as its
        # footprint is: never from another branch, whose commits nobody reviewed here.
        base = git.merge_base(head_root, tip, pr.head_sha)
        touched = flow.changed_for(config, head_root, base, pr.head_sha)
        names, refusal = _targets(config, touched, args.project, login, branch)
        if refusal:
            return CommentResult(reply=refusal, command="apply")
        unmet = _unmet(gh, config, pr, head_root, tip, ctx.db, names)
        if unmet:
            return CommentResult(reply=holdtext.requirements_refused(login, unmet, branch), command="apply",
                                 unmet=tuple(u.name for u in unmet))
        # Every project's holder first: an unknown token refuses the comment before anything is applied.
        principals = {name: bot_principal(ctx.settings, ctx.db, repo, name) for name in names}
        results: list[ApplyResult] = []
        for name in names:
            project = config.project(name)
            assert project is not None
            results.append(_apply_project(ctx, gh, head_root, project, base, pr, repo, principals[name],
                                          config.apply_requirements))
    held = holds_store.of_pull_request(ctx.db, repo, number)
    # Other open pull requests on these states re-render: their comments show the new hold.
    notify = _neighbours(ctx.db, repo, number, held)
    return CommentResult(reply=holdtext.apply_reply(login, pr.head_sha, results, held), command="apply",
                         pr_apply=PrApply(pr.head_sha, tuple(results), tuple(notify)))


def _default_config(ctx: Context, repo: str, head_root: Path, branch: str,
                    token: str) -> tuple[str, BotConfig | None, tuple[str, ...]]:
    """The default branch's tip and its validated ``.kilolock.yml`` (None and the problems when invalid)."""
    return flow.default_config(ctx.workbench, repo, head_root, branch, token)


def _base_tip(root: Path, config: BotConfig, pr: PullInfo, default_branch: str) -> tuple[str, str | None]:
    """The tip of the pull request's base branch, or why a pull request into that branch is not applied:
    only the configured branch (``apply_branch`` on the default branch, else the default branch) is."""
    target = apply_branch(config, default_branch)
    if pr.base_ref != target:
        return "", holdtext.other_base(pr.number, pr.base_ref, target, default_branch)
    return git.resolve_commit(root, f"refs/heads/{pr.base_ref}"), None


def apply_branch(config: BotConfig | None, default_branch: str) -> str:
    """The branch whose pull requests apply: the default branch's ``apply_branch``, else the default branch."""
    return (config.apply_branch if config is not None else None) or default_branch


def _unmet(gh: GitHub, config: BotConfig, pr: PullInfo, head_root: Path, tip: str, db: Database,
           names: Sequence[str]) -> tuple[apply_requirements.Unmet, ...]:
    wanted = config.apply_requirements
    reviewed = bool({"approved", "last_push_approved", "owners_approved"} & set(wanted))
    reviews = gh.reviews(pr.number) if reviewed else []
    writers = frozenset(login for login in {r.login for r in reviews} if gh.has_write_access(login))
    pushers = gh.commit_logins(pr.head_sha) if "last_push_approved" in wanted else frozenset()
    owners = None
    if "owners_approved" in wanted:
        owners = _predicted_owners_problem(gh, db, config, pr, names, reviews, writers)
    return apply_requirements.unmet(wanted, pr, reviews=reviews, writers=writers, pushers=pushers, owners=owners,
                                    contains_base_tip=git.is_ancestor(head_root, tip, pr.head_sha))


def _predicted_owners_problem(gh: GitHub, db: Database, config: BotConfig, pr: PullInfo, names: Sequence[str],
                              reviews: Sequence[Review], writers: frozenset[str]) -> str | None:
    """``owners_approved`` on the head's recorded footprint (the apply checks its exact footprint again)."""
    owned: list[OwnedGlob] = []
    for name in names:
        project = config.project(name)
        if project is not None and not project.owners:
            continue
        recorded = [f for f in bot_store.open_footprints(db, gh.repo, project.state) if f.number == pr.number
                    and f.project == name and f.head_sha == pr.head_sha] if project is not None else []
        if project is None or not recorded:
            return (f"the footprint of {pr.head_sha[:7]} for {markdown.code(name)} is not known yet, so its owners "
                    "cannot be checked: wait for the kilolock/footprint check, then comment again")
        owned += owned_globs(project.owners, recorded[0].write_globs)
    return owners_problem_for(gh, owned, pr, reviews, writers)


def owners_problem_for(gh: GitHub, owned: Sequence[OwnedGlob], pr: PullInfo, reviews: Sequence[Review],
                       writers: frozenset[str], *, plain: bool = False) -> str | None:
    """:func:`runner.bot.requirements.owners_problem` with team memberships read from GitHub."""
    return apply_requirements.owners_problem(
        owned, reviews, author=pr.author, head_sha=pr.head_sha, writers=writers,
        **({"quote": str} if plain else {}),
        is_member=lambda login, owner: owner.team is not None and gh.is_team_member(owner.login, owner.team, login))


def exact_owners_problem(gh: GitHub, project: Project, pr: PullInfo | None,
                         write_globs: Sequence[str]) -> str | None:
    """``owners_approved`` on the exact write globs an apply is about to reserve (None: every owner group
    approved, or nothing written is owned). Without a pull request (a push), no approval exists."""
    owned = owned_globs(project.owners, write_globs)
    if not any(o.groups for o in owned):
        return None
    reviews = gh.reviews(pr.number) if pr is not None else []
    writers = frozenset(login for login in {r.login for r in reviews} if gh.has_write_access(login))
    if pr is None:
        pr = PullInfo(number=0, head_sha="", head_ref="", base_ref="", base_sha="", merged=True, state="closed",
                      author="")
    return owners_problem_for(gh, owned, pr, reviews, writers, plain=True)


def review_readiness(ctx: Context, gh: GitHub, repo: str, number: int,
                     head_sha: str) -> tuple[JobStatus, ReviewResult]:
    """A review was submitted or dismissed: whether ``kilolock apply`` may run on the head now, as the
    (status, result) of the job; the result's ``ready_check`` goes to the head's ``kilolock/apply`` check."""
    pr = gh.pull_request(number)
    if pr.state != "open" or pr.head_sha != head_sha:
        return JobStatus.SKIPPED, ReviewResult(
            skipped=f"#{number} is {pr.state} at {pr.head_sha[:12]}: the review came late")
    if any(h.head_sha == head_sha for h in holds_store.of_pull_request(ctx.db, repo, number)):
        return JobStatus.SKIPPED, ReviewResult(skipped=f"{head_sha[:12]} is applied already")
    trust = trust_rules.of_pull_request(gh, repo, pr)
    if not trust.trusted:
        return JobStatus.SKIPPED, ReviewResult(skipped=f"no apply before merge: {trust.reason}")
    token = gh.clone_token()
    with flow.checkout(ctx.workbench, repo, head_sha, token, want=(pr.base_sha,), refresh=True) as head_root:
        branch = gh.default_branch()
        _, config, _ = _default_config(ctx, repo, head_root, branch, token)
        if config is None:
            return JobStatus.SKIPPED, ReviewResult(skipped="the default branch's .kilolock.yml is invalid")
        tip, wrong_base = _base_tip(head_root, config, pr, branch)
        if wrong_base:
            return JobStatus.SKIPPED, ReviewResult(skipped=wrong_base)
        touched = flow.changed_for(config, head_root, git.merge_base(head_root, tip, head_sha), head_sha)
        names = [n for n in touched if (config.project(n) or NO_PROJECT).apply_on_comment]
        if not names:
            return JobStatus.SKIPPED, ReviewResult(skipped="no project of the pull request has apply_on_comment")
        unmet = _unmet(gh, config, pr, head_root, tip, ctx.db, names)
    title, summary = holdtext.readiness(names, unmet)
    return JobStatus.SUCCEEDED, ReviewResult(ready_check=ReadyCheck(head_sha, title, summary))


def _targets(config: BotConfig, touched: dict[str, tuple[str, ...]], wanted: str | None, login: str,
             branch: str) -> tuple[list[str], str | None]:
    if wanted is not None:
        if config.project(wanted) is None:
            known = ", ".join(markdown.code(p.name) for p in config.projects) or "none"
            return [], (f"{markdown.mention(login)} there is no project {markdown.code(wanted)} in .kilolock.yml on "
                        f"{markdown.prose(branch)} (projects: {known}).")
        names = [wanted]
    else:
        names = list(touched)
    if not names:
        return [], f"@{login} this pull request changes no file of a Kilolock project: there is nothing to apply."
    disabled = [n for n in names if not (config.project(n) or NO_PROJECT).apply_on_comment]
    if disabled:
        return [], holdtext.disabled(login, disabled, branch)
    return names, None


NO_PROJECT = Project(name="", dir="", state="", address=None, files=(), apply_on_merge=False)


def _apply_project(ctx: Context, gh: GitHub, root: Path, project: Project, base: str, pr: PullInfo, repo: str,
                   principal: Principal, requirements: Sequence[str] = ()) -> ApplyResult:
    """Apply one project of the head, then hold what it applied (plus what earlier comment applies of this
    pull request held there)."""
    number, sha = pr.number, pr.head_sha
    previous = [h for h in holds_store.of_pull_request(ctx.db, repo, number) if h.project == project.name]
    footprint: dict[str, tuple[str, ...]] = {}

    def before_apply(scoped: ScopedFootprint) -> float:
        footprint["write"] = tuple(scoped.write_globs)
        if "owners_approved" in requirements:
            problem = exact_owners_problem(gh, project, pr, scoped.write_globs)
            if problem:
                footprint["owners"] = ()
                raise Failed(f"owners_approved: {problem}")
        blocking = holds_store.blocking(ctx.db, repo, number, project.state, scoped.write_globs, scoped.read_globs)
        if blocking:
            footprint["blocked"] = ()
            _reconcile_numbers(ctx, gh, repo, {h.number for h, _ in blocking})
            raise ReservationRefused(holdtext.blocked_by(blocking))
        return 0.0

    # Our own earlier hold would refuse our own run: hand it back for the length of the apply.
    for hold in previous:
        holds_store.release(ctx.db, hold, "re-applied from a new kilolock apply comment")
    actor = f"github:{repo}#{number}@{sha[:12]}/{project.name}"
    result = flow.apply_project(ctx.workbench, repo, root, project, base, sha, actor=actor, wait_seconds=0.0,
                                before_apply=before_apply, origin={"repository": repo, "pull_request": number,
                                                                   "head_commit": sha})
    if result.failed:
        hint = holdtext.OWNERS_HINT if "owners" in footprint else \
            holdtext.BLOCKED_HINT if "blocked" in footprint else holdtext.FAILED_HINT
        result = replace(result, hint=hint)
    globs = {g for h in previous for g in h.write_globs}
    serial = previous[0].applied_serial if previous else None
    run_id = previous[0].applied_run_id if previous else None
    head = previous[0].head_sha if previous else sha
    if result.status in (ApplyStatus.COMMITTED, ApplyStatus.NO_CHANGES):
        # No changes: the trunk already has what the head says (an earlier apply, here or unlocked): hold it.
        globs |= set(footprint.get("write", ()))
        head = sha
    if result.status == ApplyStatus.COMMITTED:
        serial, run_id = result.serial, result.run_id
    if globs:
        try:
            holds_store.take(ctx.db, principal, repo=repo, number=number, project=project.name,
                             state_name=project.state, write_globs=sorted(globs), head_sha=head,
                             applied_serial=serial, applied_run_id=run_id, max_globs=ctx.settings.max_globs_per_run)
        except (ReservationConflictError, BadRequestError) as exc:
            # Someone reserved these addresses in the moment between our commit and the hold: what we
            # applied is on the trunk, and their run started from it, so nothing is lost but the hold.
            log.warning("could not hold %s for %s#%s: %s", project.state, repo, number, exc)
            result = replace(result, hint=f"applied, but the addresses could not be held: {exc.message}")
    return result


# --- kilolock unlock, close, merge, push ---------------------------------------------------------------


def comment_unlock(ctx: Context, repo: str, number: int, login: str) -> CommentResult:
    released = release_all(ctx.db, repo, number, f"released by @{login} with kilolock unlock")
    return CommentResult(reply=holdtext.unlocked(login, number, released), command="unlock",
                         released=tuple(_released(h) for h in released),
                         notify=tuple(_neighbours(ctx.db, repo, number, released)))


def release_all(db: Database, repo: str, number: int, reason: str) -> list[PrHold]:
    """End every hold of the pull request; returns what was held."""
    found = holds_store.of_pull_request(db, repo, number)
    for hold in found:
        holds_store.release(db, hold, reason)
    return found


def released_on_close(ctx: Context, repo: str,
                      number: int) -> tuple[tuple[Released, ...], tuple[AppliedBefore, ...], list[int]]:
    """The pull request was closed unmerged: what it held is released (kept for the warning), what its
    comment applies committed, and the other pull requests whose comments show the released holds."""
    released = release_all(ctx.db, repo, number, f"#{number} was closed without merging")
    return (tuple(_released(h) for h in released), applied_before(ctx.db, repo, number),
            _neighbours(ctx.db, repo, number, released))


def applied_before(db: Database, repo: str, number: int) -> tuple[AppliedBefore, ...]:
    """Per project, the latest commit a comment apply of the pull request made."""
    found: dict[str, AppliedBefore] = {}
    rows = [r for r in bot_store.list_jobs(db, repo, number) if r.kind is JobKind.COMMENT and r.is_finished]
    for result in results_of(rows, CommentResult):
        if result.pr_apply is not None:
            for r in result.pr_apply.results:
                if r.status == ApplyStatus.COMMITTED:
                    found[r.project] = AppliedBefore(r.project, r.serial, r.state)
    return tuple(found[k] for k in sorted(found))


def settle_merge(ctx: Context, root: Path, config: BotConfig, repo: str, number: int, merge_sha: str,
                 touched: dict[str, tuple[str, ...]]) -> tuple[dict[str, tuple[str, ...]], tuple[ApplyResult, ...]]:
    """A merged pull request's holds end. A held project whose files on the merge commit equal the applied
    head's is not applied again (reported as applied before merge); any other keeps its merge apply."""
    held = release_all(ctx.db, repo, number, f"#{number} was merged")
    serials = {a.project: a.serial for a in applied_before(ctx.db, repo, number)}
    remaining = dict(touched)
    reported: list[ApplyResult] = []
    for hold in held:
        project = config.project(hold.project)
        if project is None:
            continue
        try:
            differs = hold.project in flow.changed_for(config, root, hold.head_sha, merge_sha)
        except git.GitError as exc:
            log.warning("cannot compare %s with the applied head %s (%s): applying the merge", merge_sha[:12],
                        hold.head_sha[:12], exc)
            differs = True
        if differs:
            continue
        remaining.pop(hold.project, None)
        reported.append(ApplyResult(hold.project, hold.state_name, merge_sha, ApplyStatus.APPLIED_BEFORE_MERGE,
                                    serial=hold.applied_serial or serials.get(hold.project),
                                    run_id=hold.applied_run_id))
    return remaining, tuple(reported)


def holds_heads(db: Database, repo: str, number: int) -> tuple[str, ...]:
    """The applied heads of a pull request's holds (the merge job fetches them to compare)."""
    return tuple(sorted({h.head_sha for h in holds_store.of_pull_request(db, repo, number)}))


def mark_stale(gh: GitHub, db: Database, repo: str, number: int, head_sha: str) -> None:
    """A new head after a comment apply: its ``kilolock/apply`` check is pending until ``kilolock apply``
    runs again; the holds stay."""
    held = [h for h in holds_store.of_pull_request(db, repo, number) if h.head_sha != head_sha]
    if not held:
        return
    title, summary = holdtext.stale_check(held, head_sha)
    gh.set_check(head_sha, APPLY_CHECK, status="queued", title=title, summary=summary,
                 external_id=job_id("stale", repo, number, head_sha))


def deliver_apply(gh: GitHub, applied: PrApply, external_id: str) -> list[int]:
    """The ``kilolock/apply`` check of a comment apply on the head; returns the other PRs to refresh."""
    check = render.apply_check(applied.results)
    title = check.title.replace("applied: ", "applied before merge: ", 1)
    gh.set_check(applied.head_sha, APPLY_CHECK, status="completed", conclusion=check.conclusion, title=title,
                 summary=check.summary, text=check.text, external_id=external_id)
    return list(applied.notify)


def _neighbours(db: Database, repo: str, number: int, released: Sequence[PrHold]) -> list[int]:
    states = {h.state_name for h in released}
    return sorted({f.number for s in states for f in bot_store.open_footprints(db, repo, s)} - {number})


def _released(hold: PrHold) -> Released:
    return Released(hold.project, hold.state_name, hold.applied_serial, hold.applied_run_id, hold.head_sha,
                    tuple(hold.write_globs))


# --- reconciliation -----------------------------------------------------------------------------------


def maybe_reconcile(ctx: Context, repo: str) -> None:
    """At most every RECONCILE_EVERY seconds per repository, and only while some pull request holds:
    enqueue :func:`reconcile` (called as each delivery's job finishes)."""
    if not holds_store.of_repo(ctx.db, repo):
        return
    if ctx.redis.set(f"kilolock:reconcile:{repo}", 1, nx=True, ex=RECONCILE_EVERY):
        queue.enqueue(ctx.redis, ReconcileArgs(repo), job_id=job_id(JobKind.RECONCILE_HOLDS, repo, ctx.id),
                      timeout=ctx.settings.job_timeout)


def reconcile(ctx: Context, gh: GitHub, repo: str, *, now: datetime | None = None) -> list[int]:
    """Ask GitHub about every pull request that holds; for each one merged or closed, enqueue the merge or
    close job its missed delivery would have. Then release the holds older than ``hold_expiry`` of the
    default branch's ``.kilolock.yml`` (when set). Returns the numbers of both kinds."""
    ended = _reconcile_numbers(ctx, gh, repo, {h.number for h in holds_store.of_repo(ctx.db, repo)})
    return ended + [n for n in expire(ctx, gh, repo, now=now or datetime.now(UTC)) if n not in ended]


def expire(ctx: Context, gh: GitHub, repo: str, *, now: datetime) -> list[int]:
    """Release every hold older than the default branch's ``hold_expiry`` and re-render the comments of
    the pull requests that lost them; returns their numbers (none when no expiry is configured)."""
    held = holds_store.of_repo(ctx.db, repo)
    if not held:
        return []
    token = gh.clone_token()
    tip = flow.branch_head(ctx.workbench, repo, gh.default_branch(), token)
    with flow.checkout(ctx.workbench, repo, tip, token) as root:
        config, _ = flow.read_config(root)
    if config is None or config.hold_expiry is None:
        return []
    cutoff = now - timedelta(seconds=config.hold_expiry)
    expired = sorted({h.number for h in held if h.created_at <= cutoff})
    for number in expired:
        released = [h for h in holds_store.of_pull_request(ctx.db, repo, number) if h.created_at <= cutoff]
        for hold in released:
            holds_store.release(ctx.db, hold, f"held longer than hold_expiry ({config.hold_expiry} s)")
        log.info("released %d expired hold(s) of %s#%s", len(released), repo, number)
        for other in [number, *sorted(set(_neighbours(ctx.db, repo, number, released)) - {number})]:
            refresh(ctx, gh, repo, other)
    return expired


def _reconcile_numbers(ctx: Context, gh: GitHub, repo: str, numbers: set[int]) -> list[int]:
    ended: list[int] = []
    for number in sorted(numbers):
        pr = gh.pull_request(number)
        if pr.state == "open":
            continue
        ended.append(number)
        if pr.merged and pr.merge_commit_sha:
            # The id the merge delivery routes to: a merge job that did run is not run twice.
            queue.enqueue(ctx.redis, MergeArgs(repo, number, pr.merge_commit_sha),
                          job_id=job_id(JobKind.MERGE, repo, number, pr.merge_commit_sha),
                          timeout=ctx.settings.job_timeout)
        else:
            held = "-".join(h.run_id for h in holds_store.of_pull_request(ctx.db, repo, number))
            queue.enqueue(ctx.redis, ClosedArgs(repo, number),
                          job_id=job_id(JobKind.PULL_REQUEST_CLOSED, repo, number, "reconciled", held),
                          timeout=ctx.settings.job_timeout)
        log.info("reconciling holds of %s#%s: it is %s", repo, number, "merged" if pr.merged else "closed")
    return ended
