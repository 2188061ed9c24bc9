"""What the bot says about applies before merge and pull-request holds: the replies to ``kilolock apply``
and ``kilolock unlock``, the refusals (requirements, disabled, held by another pull request), the stale
``kilolock/apply`` check after a push, and the hold lines of the pull request's comment.

Pure: holds and results in, Markdown out. Must not: talk to GitHub, the database or the server.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from app.store.pr_holds import PrHold
from runner.bot.markdown import cell, mention, prose
from runner.bot.markdown import code as _code
from runner.bot.markdown import commit as _short
from runner.bot.outcomes import ApplyResult, ApplyStatus
from runner.bot.render import counts
from runner.bot.requirements import Unmet
from runner.bot.results import AppliedBefore

FAILED_HINT = ("fix the change in this pull request and comment `kilolock apply` again; nothing was committed, so "
               "the trunk is unchanged")
BLOCKED_HINT = ("wait until the holding pull request is merged or closed (or releases its holds with `kilolock "
                "unlock`), then comment `kilolock apply` again")
OWNERS_HINT = ("ask a member of each owner group named above to approve the current head, then comment `kilolock "
               "apply` again; nothing was reserved or committed")
UNTIL = "until it is merged or closed, or a `kilolock unlock` comment releases them"


def _serial(hold: PrHold, quote: Callable[[str], str] = _code) -> str:
    """Where the hold's apply committed; ``quote`` is :func:`cell` inside a table row."""
    if hold.applied_serial is None:
        return "(no changes were needed)"
    return f"at serial {hold.applied_serial} (run {quote(hold.applied_run_id or '')})"


def other_base(number: int, base_ref: str, target: str, default_branch: str) -> str:
    """Why a pull request into another branch than the applied one is not applied."""
    return (f"#{number} merges into {prose(base_ref)}, and Kilolock applies only pull requests into "
            f"{prose(target)} (apply_branch in .kilolock.yml on {prose(default_branch)}).")


def config_invalid(login: str, branch: str, problems: Sequence[str]) -> str:
    listed = "\n".join(f"- {prose(p)}" for p in problems)
    return (f"{mention(login)} nothing was applied: `.kilolock.yml` on {prose(branch)} is invalid, and comment "
            f"applies read their settings from there:\n\n{listed}")


def disabled(login: str, names: Sequence[str], branch: str) -> str:
    shown = ", ".join(_code(n) for n in names)
    return (f"{mention(login)} comment applies are disabled for {shown}, so nothing was applied. To enable them, "
            f"set `apply_on_comment: true` in `.kilolock.yml` on {prose(branch)} (at the top level, or per project); "
            "the setting is read from the default branch only, so this pull request cannot change it. Without it, "
            "the change is applied when the pull request is merged.")


def requirements_refused(login: str, unmet: Sequence[Unmet], branch: str) -> str:
    lines = [f"{mention(login)} nothing was applied: "
             f"{'this requirement is' if len(unmet) == 1 else 'these requirements are'}"
             " not met (`apply_requirements` in `.kilolock.yml` on " + prose(branch) + "):", ""]
    lines += [f"- **{u.name}**: {u.reason}" for u in unmet]
    lines += ["", "Comment `kilolock apply` again once they hold."]
    return "\n".join(lines)


def blocked_by(blocking: Sequence[tuple[PrHold, Sequence[str]]]) -> str:
    """The refusal of an apply that another pull request's holds block, as plain text: it becomes the apply's
    error, which every renderer escapes once."""
    parts = [f"pull request #{h.number} ({h.holder}) holds write {', '.join(globs)} on state {h.state_name}, "
             "applied before merge " + (f"at serial {h.applied_serial} (run {h.applied_run_id or ''})"
                                        if h.applied_serial is not None else "(no changes were needed)")
             for h, globs in blocking]
    return ("held by another pull request: " + "; ".join(parts) + ". Its holds end when it is merged or closed "
            "(or with kilolock unlock on it); comment kilolock apply again then.")


def _result_line(result: ApplyResult) -> str:
    name = _code(result.project)
    if result.status == ApplyStatus.COMMITTED:
        return (f"- {name}: committed at serial {result.serial} (run {_code(result.run_id or '')}): "
                f"{counts(result.actions)}")
    if result.status == ApplyStatus.NO_CHANGES:
        return f"- {name}: no changes; the trunk is unchanged"
    run = f" (run {_code(result.run_id)})" if result.run_id else ""
    error = prose((result.error or "unknown error")[-1500:])
    return f"- {name}: **failed**{run}; nothing was committed: {error}\n  What to do: {result.hint or FAILED_HINT}"


def apply_reply(login: str, head_sha: str, results: Sequence[ApplyResult], held: Sequence[PrHold]) -> str:
    failed = any(r.failed for r in results)
    lines = [f"{mention(login)} {'apply before merge of' if not failed else 'apply before merge failed for'} "
             f"{_short(head_sha)}:", ""]
    lines += [_result_line(r) for r in results]
    if held:
        lines += ["", f"This pull request now holds, {UNTIL}:", ""]
        lines += [f"- {_code(h.project)} (state {_code(h.state_name)}): write "
                  f"{', '.join(_code(g) for g in h.write_globs)}" for h in held]
    return "\n".join(lines)


def unlocked(login: str, number: int, released: Sequence[PrHold]) -> str:
    if not released:
        return f"{mention(login)} #{number} holds nothing: there was nothing to unlock."
    lines = [f"{mention(login)} released the holds of #{number}:", ""]
    lines += [f"- {_code(h.project)} (state {_code(h.state_name)}): write {', '.join(_code(g) for g in h.write_globs)}"
              for h in released]
    lines += ["", "What was applied before merge stays on the trunk; other pull requests may now apply over it. "
              "Comment `kilolock apply` to apply and hold again."]
    return "\n".join(lines)


def stale_check(held: Sequence[PrHold], head_sha: str) -> tuple[str, str]:
    applied = ", ".join(f"{_code(h.project)} {_serial(h)} ({prose(h.head_sha[:7])})" for h in held)
    return ("not applied: new commits since kilolock apply",
            f"The last comment apply was {applied}; {prose(head_sha[:7])} has not been applied. Comment "
            "`kilolock apply` to apply it. The pull request keeps its holds meanwhile.")


def comment_lines(number: int, head_sha: str | None, own: Sequence[PrHold],
                  others: Mapping[str, Sequence[tuple[PrHold, Sequence[str]]]],
                  closed: Sequence[AppliedBefore]) -> list[str]:
    """The holds part of PR ``number``'s comment: its own holds (and whether the head moved since), other
    pull requests' holds its footprint meets, and the warning after a close without merge."""
    lines: list[str] = []
    if own:
        lines += ["### Applied before merge", "",
                  f"This pull request applied from a comment and holds these write globs {UNTIL}:", "",
                  "| project | state | write globs | applied |", "| --- | --- | --- | --- |"]
        for h in own:
            written = ", ".join(cell(g) for g in h.write_globs)
            applied = f"{_short(h.head_sha)} {_serial(h, cell)}"
            lines.append(f"| {cell(h.project)} | {cell(h.state_name)} | {written} | {applied} |")
        lines.append("")
        moved = sorted({h.head_sha for h in own if head_sha and h.head_sha != head_sha})
        if moved:
            lines += [f"The head moved to {_short(head_sha or '')} after the apply of "
                      f"{', '.join(_short(s) for s in moved)}: comment `kilolock apply` to apply it.", ""]
    for project, blocking in sorted(others.items()):
        for hold, globs in blocking:
            lines += [f"**Held by #{hold.number}** ({_code(project)}): it applied before merge {_serial(hold)} "
                      f"and holds write {', '.join(_code(g) for g in globs)}, which this pull "
                      "request also reserves; `kilolock apply` here is refused and the merge apply waits until #"
                      f"{hold.number} is merged or closed.", ""]
    if closed:
        shown = ", ".join(f"{_code(c.project)} at serial {c.serial}" for c in closed)
        lines += [f"**Closed without merging**: the change applied before merge ({shown}) is on the trunk but "
                  "**not on the default branch**. Its holds are released, so the next apply of those files from the "
                  "default branch will undo it: re-open and merge this pull request, or revert the trunk by "
                  "applying the default branch's configuration.", ""]
    return lines


def readiness(names: Sequence[str], unmet: Sequence[Unmet]) -> tuple[str, str]:
    """The head's ``kilolock/apply`` check after a review: ready for ``kilolock apply``, or what it waits for."""
    shown = ", ".join(names)
    if not unmet:
        return (f"ready to apply before merge: comment kilolock apply ({shown})",
                "Every apply requirement holds: a writer may comment `kilolock apply` to apply this head before "
                "merge, or merge it to apply on merge.")
    return ("waiting for: " + ", ".join(u.name for u in unmet),
            "\n".join(f"- **{u.name}**: {u.reason}" for u in unmet))
