"""What the bot shows, gathered from what its jobs stored: everything a pull request's comment renders
(its latest footprint, the preview of that head, the merge's apply results, the overlaps with other open
pull requests' recorded footprints) and the results behind a merge's ``kilolock/apply`` check.

Owns reading ``bot_jobs`` and ``pull_request_footprints`` (through ``app.store.bot``) into the types of
``runner.bot.outcomes`` and ``runner.bot.render.CommentView``. Must not: compute anything new, post to
GitHub, or touch RQ (``runner.bot.jobs`` does).
"""

from __future__ import annotations

from app.domain.jobs import JobKind
from app.domain.overlaps import pr_overlaps
from app.store import Database, pr_holds
from app.store import bot as store
from app.store.bot import BotJob
from runner.bot import holdtext
from runner.bot.outcomes import ApplyResult, ApplyStatus, FootprintOutcome, Overlap, compact_shared
from runner.bot.render import CommentView
from runner.bot.results import (
    AppliedBefore,
    ApplyProjectResult,
    ClosedResult,
    FanOutResult,
    FootprintResult,
    PreviewResult,
    result_of,
    results_of,
)


def comment_view(db: Database, repo: str, number: int) -> CommentView:
    """Everything PR ``number``'s comment shows, from its stored job outcomes and the open PRs' footprints."""
    rows = store.list_jobs(db, repo, number)
    footprints = [f.footprint for f in results_of([r for r in rows if r.kind is JobKind.PULL_REQUEST
                                                   and r.is_finished], FootprintResult) if f.footprint]
    fp = footprints[-1] if footprints else None
    preview, pending = None, False
    if fp is not None:
        previews = [r for r in rows if r.kind is JobKind.PLAN_PREVIEW and r.sha == fp.head_sha]
        done = [p.preview for p in results_of([r for r in previews if r.is_finished], PreviewResult) if p.preview]
        preview = done[-1] if done else None
        pending = not done or any(not r.is_finished for r in previews)
    merges = [r for r in rows if r.kind is JobKind.MERGE and r.is_finished]
    applies: list[ApplyResult] = []
    last = result_of(merges[-1]) if merges else None
    if isinstance(last, FanOutResult) and last.config_errors:
        applies = [ApplyResult(".kilolock.yml", "", merges[-1].sha, ApplyStatus.FAILED,
                               error="\n".join(last.config_errors),
                               hint="fix .kilolock.yml, then re-run the kilolock/apply check")]
    elif merges:
        results, waiting = apply_results(db, merges[-1])
        applies = results + [ApplyResult(n, "", merges[-1].sha, ApplyStatus.PENDING) for n in waiting]
    return CommentView(repo, number, fp, preview, pending, tuple(applies),
                       overlaps_of(db, repo, number, fp) if fp is not None and not merges else {},
                       merged_sha=merges[-1].sha if merges else None,
                       holds=tuple(_hold_lines(db, repo, number, fp, rows, merged=bool(merges))))


def _hold_lines(db: Database, repo: str, number: int, fp: FootprintOutcome | None, rows: list[BotJob],
                *, merged: bool) -> list[str]:
    """The pull-request holds part of the comment (``runner.bot.holdtext``)."""
    own = [h for h in pr_holds.of_pull_request(db, repo, number) if h.live]
    others = {}
    if fp is not None and not merged:
        for project in fp.projects:
            if not project.error:
                found = pr_holds.blocking(db, repo, number, project.state, project.write_globs, project.read_globs)
                if found:
                    others[project.name] = found
    closes = [c for c in results_of([r for r in rows if r.kind is JobKind.PULL_REQUEST_CLOSED and r.is_finished],
                                    ClosedResult) if c.applied_before]
    closed: tuple[AppliedBefore, ...] = closes[-1].applied_before if closes and not own and not merged else ()
    return holdtext.comment_lines(number, fp.head_sha if fp is not None else None, own, others, closed)


def overlaps_of(db: Database, repo: str, number: int, fp: FootprintOutcome) -> dict[str, tuple[Overlap, ...]]:
    """Per project: the other open PRs whose recorded footprints overlap PR ``number``'s, with the shared globs."""
    found: dict[str, tuple[Overlap, ...]] = {}
    for project in fp.projects:
        rows = store.open_footprints(db, repo, project.state)
        mine = next((r for r in rows if r.number == number and r.project == project.name), None)
        if mine is None:
            continue
        others = [r for r in rows if r.number != number]
        shared = pr_overlaps(mine, others)
        if shared:
            found[project.name] = tuple(Overlap(n, compact_shared(g)) for n, g in shared)
    return found


def states_of(db: Database, repo: str, number: int) -> set[str]:
    """The states every footprint PR ``number`` ever had touched (to find whom a change stops overlapping)."""
    rows = [r for r in store.list_jobs(db, repo, number) if r.kind is JobKind.PULL_REQUEST]
    return {p.state for f in results_of(rows, FootprintResult) if f.footprint for p in f.footprint.projects}


def overlapping(db: Database, repo: str, number: int, states: set[str]) -> set[int]:
    """The other open PRs whose stored footprints overlap PR ``number``'s on these states."""
    found: set[int] = set()
    for state in states:
        rows = store.open_footprints(db, repo, state)
        for mine in (r for r in rows if r.number == number):
            found.update(n for n, _ in pr_overlaps(mine, [r for r in rows if r.number != number]))
    return found


def apply_results(db: Database, parent: BotJob) -> tuple[list[ApplyResult], list[str]]:
    """A merge's (or push's) per-project results so far, and the projects still waiting or applying."""
    children = {j.project: j for j in store.list_jobs(db, parent.repo, parent.number)
                if j.kind is JobKind.APPLY_PROJECT and j.sha == parent.sha}
    fan = result_of(parent)
    assert isinstance(fan, FanOutResult)
    results = list(fan.not_applied)
    pending: list[str] = []
    for name in fan.children:
        child = children.get(name)
        done = result_of(child) if child is not None and child.is_finished else None
        if not isinstance(done, ApplyProjectResult) or done.apply is None:
            pending.append(name)
        else:
            results.append(done.apply)
    return results, pending


def merged_by_job(db: Database, repo: str, sha: str) -> int | None:
    """The PR whose merge job works on commit ``sha``, if any."""
    for row in store.list_jobs(db, repo):
        if row.kind is JobKind.MERGE and row.sha == sha and row.number:
            return row.number
    return None
