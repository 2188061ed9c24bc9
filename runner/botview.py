"""What the bot shows, gathered from what its jobs stored: everything a pull request's comment renders
(its latest footprint, the preview of that head, the merge's apply results, the overlaps with other open
pull requests' recorded footprints) and the results behind a merge's ``kilolock/apply`` check.

Owns reading ``bot_jobs`` and ``pull_request_footprints`` (through ``app.store.bot``) into the types of
``runner.comments``. Must not: compute anything new, post to GitHub, or touch RQ (``runner.jobs`` does).
"""

from __future__ import annotations

from app.store import Database, pr_holds
from app.store import bot as store
from app.store.bot import BotJob
from runner import holdtext
from runner.comments import (
    ApplyResult,
    CommentView,
    FootprintOutcome,
    Overlap,
    apply_from_json,
    compact_shared,
    footprint_from_json,
    preview_from_json,
)


def comment_view(db: Database, repo: str, number: int) -> CommentView:
    """Everything PR ``number``'s comment shows, from its stored job outcomes and the open PRs' footprints."""
    rows = store.list_jobs(db, repo, number)
    footprints = [r for r in rows if r.kind == "pull_request" and r.is_finished and "footprint" in r.result]
    fp = footprint_from_json(footprints[-1].result["footprint"]) if footprints else None
    preview, pending = None, False
    if fp is not None:
        previews = [r for r in rows if r.kind == "plan_preview" and r.sha == fp.head_sha]
        done = [r for r in previews if r.is_finished and "preview" in r.result]
        preview = preview_from_json(done[-1].result["preview"]) if done else None
        pending = not done or any(not r.is_finished for r in previews)
    merges = [r for r in rows if r.kind == "merge_apply" and not r.project and r.is_finished]
    applies: list[ApplyResult] = []
    if merges and "config_errors" in merges[-1].result:
        applies = [ApplyResult(".kilolock.yml", "", merges[-1].sha, "failed",
                               error="\n".join(merges[-1].result["config_errors"]),
                               hint="fix .kilolock.yml, then re-run the kilolock/apply check")]
    elif merges:
        results, waiting = apply_results(db, merges[-1])
        applies = results + [ApplyResult(n, "", merges[-1].sha, "pending") for n in waiting]
    return CommentView(repo, number, fp, preview, pending, tuple(applies),
                       overlaps_of(db, repo, number, fp) if fp is not None and not merges else {},
                       merged_sha=merges[-1].sha if merges else None,
                       holds=tuple(_hold_lines(db, repo, number, fp, rows, merged=bool(merges))))


def _hold_lines(db: Database, repo: str, number: int, fp: FootprintOutcome | None, rows: list[BotJob],
                *, merged: bool) -> list[str]:
    """The pull-request holds part of the comment (``runner.holdtext``)."""
    from runner.bot_holds import blocking_holds

    own = [h for h in pr_holds.of_pull_request(db, repo, number) if h.live]
    others = {}
    if fp is not None and not merged:
        for project in fp.projects:
            if not project.error:
                found = blocking_holds(db, repo, number, project.state, project.write_globs, project.read_globs)
                if found:
                    others[project.name] = found
    closes = [r for r in rows if r.kind == "pull_request_closed" and r.is_finished and r.result.get("applied_before")]
    closed = closes[-1].result["applied_before"] if closes and not own and not merged else []
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
        shared = store.overlaps(mine, others)
        if shared:
            found[project.name] = tuple(Overlap(n, compact_shared(g)) for n, g in shared)
    return found


def states_of(db: Database, repo: str, number: int) -> set[str]:
    """The states every footprint PR ``number`` ever had touched (to find whom a change stops overlapping)."""
    rows = [r for r in store.list_jobs(db, repo, number) if r.kind == "pull_request" and "footprint" in r.result]
    return {p["state"] for r in rows for p in r.result["footprint"].get("projects", ())}


def overlapping(db: Database, repo: str, number: int, states: set[str]) -> set[int]:
    """The other open PRs whose stored footprints overlap PR ``number``'s on these states."""
    found: set[int] = set()
    for state in states:
        rows = store.open_footprints(db, repo, state)
        for mine in (r for r in rows if r.number == number):
            found.update(n for n, _ in store.overlaps(mine, [r for r in rows if r.number != number]))
    return found


def apply_results(db: Database, parent: BotJob) -> tuple[list[ApplyResult], list[str]]:
    """A merge's (or push's) per-project results so far, and the projects still waiting or applying."""
    children = {j.project: j for j in store.list_jobs(db, parent.repo, parent.number)
                if j.kind == "merge_apply" and j.project and j.sha == parent.sha}
    results = [apply_from_json(s) for s in parent.result.get("skipped", ())]
    pending: list[str] = []
    for name in parent.result.get("children", ()):
        child = children.get(name)
        if child is None or not child.is_finished or "apply" not in child.result:
            pending.append(name)
        else:
            results.append(apply_from_json(child.result["apply"]))
    return results, pending


def merged_by_job(db: Database, repo: str, sha: str) -> int | None:
    """The PR whose merge job works on commit ``sha``, if any."""
    for row in store.list_jobs(db, repo):
        if row.kind == "merge_apply" and row.sha == sha and row.number:
            return row.number
    return None
