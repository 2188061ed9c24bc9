"""Markdown the bot posts: the one pull-request comment and the ``kilolock/*`` check-run outputs, rendered
from the stored outcomes (``runner.bot.outcomes``).

Owns the comment — found again by :data:`MARKER`, with per project the files, the predicted write and read
reservations, diagnostics, live reservations it would conflict with right now, overlaps with other open
pull requests, the plan preview's per-address actions and the merge apply's result — and the
title/summary/text of the checks. Long lists are folded in ``<details>``; every body stays below GitHub's
65,535-character limits.

Must not: talk to GitHub, the database or the server (pure: outcomes in, text out), or print values.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from runner.bot.markdown import block as _block
from runner.bot.markdown import cell as _cell
from runner.bot.markdown import code as _code
from runner.bot.markdown import commit as _short
from runner.bot.markdown import marker
from runner.bot.markdown import prose as _inline
from runner.bot.outcomes import (
    ApplyResult,
    ApplyStatus,
    FootprintOutcome,
    Overlap,
    PreviewOutcome,
    ProjectFootprint,
    ProjectPreview,
)

MARKER = marker("pull-request")
GITHUB_LIMIT = 65_535  # characters in one comment body or check-run summary/text
# Headroom under the limit for the truncation note and GitHub's own counting of multi-byte characters.
BODY_BUDGET = GITHUB_LIMIT - 5_535
FOLD_AFTER = 10
ACTION_ORDER = ("create", "update", "replace", "delete", "move", "read", "no-op")
ROW_ORDER = ("delete", "replace", "create", "update", "move", "read", "no-op")


# --- the pull-request comment --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CommentView:
    """Everything one pull request's comment shows, gathered from the stored outcomes."""

    repo: str
    number: int
    footprint: FootprintOutcome | None
    preview: PreviewOutcome | None = None
    preview_pending: bool = False
    applies: tuple[ApplyResult, ...] = ()
    overlaps: Mapping[str, tuple[Overlap, ...]] = field(default_factory=dict)
    merged_sha: str | None = None
    holds: tuple[str, ...] = ()  # the pull-request holds part, rendered by runner.bot.holdtext


def render_comment(view: CommentView) -> str:
    """The comment body: the marker first, then everything at the most detailed level that fits."""
    for shown in (FOLD_AFTER * 100, FOLD_AFTER * 10, FOLD_AFTER, 3):
        body = _comment(view, shown)
        if len(body) <= BODY_BUDGET:
            return body
    return _truncate(body, BODY_BUDGET, "the check runs have the details")


def _comment(view: CommentView, shown: int) -> str:
    lines = [MARKER, "## Kilolock", ""]
    fp = view.footprint
    if fp is None:
        if not view.applies:
            return "\n".join(lines + ["Working out which reservations this pull request needs…", ""])
        lines += [f"Merged as {_short(view.merged_sha or '')}.", ""]
        for result in view.applies:
            lines += [f"### Project {_code(result.project)}", ""] + _apply_lines(result, shown)
        return "\n".join(lines) + "\n"
    lines += [_intro(view, fp), ""]
    if fp.config_errors:
        lines += [f"**{_code(fp.config_source or '.kilolock.yml')} is invalid**, so nothing was planned:", ""]
        lines += [f"- {_inline(p)}" for p in fp.config_errors] + [""]
        lines += ["Fix the file in this pull request; the check runs again on the next push.", ""]
    previews = {p.name: p for p in view.preview.projects} if view.preview else {}
    applies = {a.project: a for a in view.applies}
    for project in fp.projects:
        lines += _project_section(project, view.overlaps.get(project.name, ()), previews.get(project.name),
                                  view, applies.get(project.name), shown)
    for name, result in applies.items():
        if name not in {p.name for p in fp.projects}:
            lines += [f"### Project {_code(name)}", ""] + _apply_lines(result, shown)
    lines += list(view.holds)
    lines.append(f"<sub>Comment `kilolock help` for commands · footprint of {_short(fp.head_sha)}</sub>")
    return "\n".join(lines) + "\n"


def _intro(view: CommentView, fp: FootprintOutcome) -> str:
    if not fp.projects and not fp.config_errors:
        return (f"This pull request changes no file of a Kilolock project at {_short(fp.head_sha)}: "
                "nothing to reserve, plan or apply.")
    count = len(fp.projects)
    noun = "project" if count == 1 else "projects"
    text = (f"At {_short(fp.head_sha)} this pull request touches {count} {noun}. The reservations are predicted "
            "from the changed files (file-scoped, no Terraform run); ")
    if view.merged_sha:
        return text + f"merged as {_short(view.merged_sha)}."
    return text + "an apply after the merge takes exactly these."


def _project_section(project: ProjectFootprint, overlaps: Sequence[Overlap], preview: ProjectPreview | None,
                     view: CommentView, applied: ApplyResult | None, shown: int) -> list[str]:
    where = f" in {_code(project.dir or '.')}" if (project.dir or ".") != project.name else ""
    lines = [f"### Project {_code(project.name)}{where} · state {_code(project.state)}", ""]
    lines += _folded("Changed files", [_code(f) for f in project.changed], shown, inline=True)
    if project.error:
        lines += ["**Cannot be scoped to the changed files** — nothing is reserved or planned for it:", "",
                  _block(project.error), ""]
    else:
        if project.files:
            lines += [f"**Planned files:** {', '.join(_code(f) for f in project.files)}", ""]
        owned = dict(project.owners)
        if owned:
            rows = [f"| write | {_cell(g)} | {_owners_cell(owned.get(g, ''))} |" for g in project.write_globs]
            rows += [f"| read | {_cell(g)} | |" for g in project.read_globs]
            header = ["| mode | address glob | owners |", "| --- | --- | --- |"]
        else:
            rows = [f"| write | {_cell(g)} |" for g in project.write_globs]
            rows += [f"| read | {_cell(g)} |" for g in project.read_globs]
            header = ["| mode | address glob |", "| --- | --- |"]
        if rows:
            lines += ["**Reservations an apply would take**", ""]
            lines += _table(header, rows, shown)
            if owned:
                lines += [("**Owner approval missing** (of the head, by a member with write access): " +
                           ", ".join(_code(m) for m in project.owners_missing)) if project.owners_missing else
                          "**Owner approval:** every owner group approved the head", ""]
        else:
            lines += ["**Reservations an apply would take:** none", ""]
    if project.conflicts:
        lines += ["**Live reservations this would wait for right now:**", ""]
        items = [f"{c.mode} {_code(c.glob)} conflicts with {c.their_mode} {_code(c.theirs)} held by "
                 f"{_code(c.holder)}" + (f" (run {_code(c.run_id)})" if c.run_id else " (Terraform state lock)")
                 for c in project.conflicts]
        lines += _bullets(items, shown)
    elif not project.error:
        lines += ["**Live reservations this would wait for right now:** none", ""]
    if overlaps:
        lines += ["**Overlaps with other open pull requests** — whichever merges second waits for the first "
                  "one's apply:", ""]
        lines += _bullets([f"#{o.number}: " + ", ".join(_code(g) for g in o.globs) for o in overlaps], shown)
    if project.diagnostics:
        lines += _folded("Diagnostics", [_inline(d) for d in project.diagnostics], shown)
    if not project.error:
        lines += _preview_lines(preview, view, shown)
    if applied is not None:
        lines += _apply_lines(applied, shown)
    return lines


def _preview_lines(preview: ProjectPreview | None, view: CommentView, shown: int) -> list[str]:
    if view.preview is not None and view.preview.withheld:
        return [f"**Plan preview:** not run. {_inline(view.preview.withheld)}", ""]
    if preview is None:
        if view.preview_pending or view.preview is None:
            return ["**Plan preview:** running…", ""]
        return []
    if preview.error:
        return ["**Plan preview failed:**", "", _block(preview.error), ""]
    serial = f" against serial {preview.base_serial}" if preview.base_serial is not None else ""
    if not preview.actions and not preview.output_changes:
        lines = [f"**Plan preview**{serial}: no changes.", ""]
    else:
        lines = [f"**Plan preview**{serial}: {counts(preview.actions)}", ""]
        lines += _table(["| action | address |", "| --- | --- |"],
                        [f"| {a} | {_cell(addr)} |" for addr, a in _by_action(preview.actions)], shown)
    if preview.output_changes:
        lines += [f"Outputs: {', '.join(f'{_code(n)} ({a})' for n, a in preview.output_changes)}", ""]
    if preview.warnings:
        lines += _folded("Plan warnings", [_inline(w) for w in preview.warnings], shown)
    return lines


def _apply_lines(result: ApplyResult, shown: int) -> list[str]:
    sha = _short(result.sha)
    if result.status == ApplyStatus.PENDING:
        return [f"**Apply** {sha}: waiting for reservations or applying…", ""]
    if result.status == ApplyStatus.COMMITTED:
        waited = f" after waiting {result.waited_seconds:.0f} s for an earlier overlapping merge" \
            if result.waited_seconds >= 1 else ""
        lines = [f"**Applied** {sha}{waited}: committed at serial {result.serial} (run {_code(result.run_id or '')}): "
                 f"{counts(result.actions)}", ""]
        lines += _table(["| action | address |", "| --- | --- |"],
                        [f"| {a} | {_cell(addr)} |" for addr, a in _by_action(result.actions)], shown)
        return lines
    if result.status == ApplyStatus.NO_CHANGES:
        return [f"**Applied** {sha}: no changes; the trunk is unchanged.", ""]
    if result.status == ApplyStatus.APPLIED_BEFORE_MERGE:
        return [f"**Not applied again** ({sha}): applied before merge at serial {result.serial} (run "
                f"{_code(result.run_id or '')}); the merge commit's project files equal the applied head's.", ""]
    if result.status in (ApplyStatus.SKIPPED, ApplyStatus.OTHER_BRANCH):
        return [f"**Not applied** ({sha}): {_inline(result.error or 'apply on merge is off for this project')}", ""]
    run = f" (run {_code(result.run_id)})" if result.run_id else ""
    lines = [f"**Apply failed** {sha}{run}; nothing was committed and the trunk is unchanged:", "",
             _block(result.error or "unknown error")]
    if result.hint:
        lines += ["", f"What to do: {_inline(result.hint)}"]
    return lines + [""]


# --- check runs --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckOutput:
    conclusion: str  # success | failure | neutral
    title: str
    summary: str
    text: str | None = None


def footprint_check(outcome: FootprintOutcome, overlaps: Mapping[str, Sequence[Overlap]]) -> CheckOutput:
    if outcome.config_errors:
        return CheckOutput("failure", f"{outcome.config_source or '.kilolock.yml'} is invalid",
                           _limit("\n".join(f"- {_inline(p)}" for p in outcome.config_errors)))
    if not outcome.projects:
        return CheckOutput("neutral", "No Kilolock project changed", "Nothing to reserve, plan or apply.")
    failed = [p for p in outcome.projects if p.error]
    writes = sum(len(p.write_globs) for p in outcome.projects)
    reads = sum(len(p.read_globs) for p in outcome.projects)
    shared = sorted({o.number for items in overlaps.values() for o in items})
    title = (f"{len(failed)} project(s) cannot be scoped to the changed files" if failed else
             f"{writes} write and {reads} read reservation(s) predicted")
    if shared and not failed:
        title += "; overlaps " + ", ".join(f"#{n}" for n in shared)
    summary = []
    for p in outcome.projects:
        state = "cannot be scoped: " + _inline(_first_line(p.error)) if p.error else \
            f"{len(p.write_globs)} write, {len(p.read_globs)} read"
        summary.append(f"- {_code(p.name)} (state {_code(p.state)}): {state}")
    text = "\n".join(_block(p.error or "") for p in failed) or None
    return CheckOutput("failure" if failed else "success", title, _limit("\n".join(summary)),
                       _limit(text) if text else None)


def plan_check(outcome: PreviewOutcome) -> CheckOutput:
    if outcome.withheld:
        return CheckOutput("neutral", "No plan preview: untrusted pull request", _limit(_inline(outcome.withheld)))
    if outcome.config_errors:
        return CheckOutput("failure", ".kilolock.yml is invalid",
                           _limit("\n".join(f"- {_inline(p)}" for p in outcome.config_errors)))
    if not outcome.projects:
        return CheckOutput("neutral", "Nothing to plan", "No Kilolock project changed.")
    failed = [p for p in outcome.projects if p.error]
    every: list[tuple[str, str]] = [pair for p in outcome.projects if not p.error for pair in p.actions]
    title = f"plan failed for {len(failed)} project(s)" if failed else f"plan: {counts(every)}"
    summary = "\n".join(f"- {_code(p.name)}: " + ("failed: " + _inline(_first_line(p.error)) if p.error else
                                                  counts(p.actions))
                        for p in outcome.projects)
    text_lines: list[str] = []
    for p in outcome.projects:
        text_lines += [f"### {_inline(p.name)}", ""]
        text_lines += [_block(p.error)] if p.error else \
            [f"- {_inline(a)} {_code(addr)}" for addr, a in _by_action(p.actions)] or ["no changes"]
        text_lines.append("")
    return CheckOutput("failure" if failed else "success", title, _limit(summary), _limit("\n".join(text_lines)))


def apply_check(results: Sequence[ApplyResult]) -> CheckOutput:
    failed = [r for r in results if r.failed]
    done = [r for r in results if r.status == ApplyStatus.COMMITTED]
    before = [r for r in results if r.status == ApplyStatus.APPLIED_BEFORE_MERGE]
    if failed:
        title = f"apply failed for {', '.join(r.project for r in failed)}; the trunk is unchanged"
    elif done or before:
        title = "applied: " + ", ".join([f"{r.project} at serial {r.serial}" for r in done] +
                                        [f"{r.project} before merge at serial {r.serial}" for r in before])
    elif all(r.status == ApplyStatus.OTHER_BRANCH for r in results):
        title = "not applied: " + _first_line(results[0].error or "merged into a branch that is not applied")
    elif all(r.status == ApplyStatus.SKIPPED for r in results):
        title = "not applied: apply on merge is off"
    else:
        title = "applied: no changes"
    summary_lines: list[str] = []
    for r in results:
        summary_lines += _apply_lines(r, FOLD_AFTER)
    idle = all(r.status in (ApplyStatus.SKIPPED, ApplyStatus.OTHER_BRANCH) for r in results)
    conclusion = "failure" if failed else ("neutral" if idle else "success")
    return CheckOutput(conclusion, title, _limit("\n".join(summary_lines)))


def counts(actions: Iterable[tuple[str, str]]) -> str:
    """``2 to create, 1 to update``, in Terraform's order (create, update, replace, delete …)."""
    tally: dict[str, int] = {}
    for _, action in actions:
        tally[action] = tally.get(action, 0) + 1
    if not tally:
        return "no changes"
    order = sorted(tally, key=lambda a: (ACTION_ORDER.index(a) if a in ACTION_ORDER else len(ACTION_ORDER), a))
    return ", ".join(f"{tally[a]} to {a}" for a in order)


# --- Markdown helpers --------------------------------------------------------------------------------


def _by_action(actions: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Destructive actions first (what a reviewer must not miss when a list is folded), then by address
    with instance keys in numeric order (``web[2]`` before ``web[10]``)."""
    return sorted(actions, key=lambda p: (ROW_ORDER.index(p[1]) if p[1] in ROW_ORDER else 99, _natural(p[0])))


def _natural(address: str) -> tuple[tuple[int, int | str], ...]:
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", address))


def _table(header: list[str], rows: list[str], shown: int) -> list[str]:
    if len(rows) <= FOLD_AFTER:
        return header + rows + [""]
    rest = rows[FOLD_AFTER:shown]
    lines = header + rows[:FOLD_AFTER] + ["", f"<details><summary>{len(rows) - FOLD_AFTER} more</summary>", ""]
    lines += header + rest + [""]
    if len(rows) > shown:
        lines += [f"… and {len(rows) - shown} more (see the check run)", ""]
    return lines + ["</details>", ""]


def _bullets(items: list[str], shown: int) -> list[str]:
    if len(items) <= FOLD_AFTER:
        return [f"- {i}" for i in items] + [""]
    lines = [f"- {i}" for i in items[:FOLD_AFTER]]
    lines += ["", f"<details><summary>{len(items) - FOLD_AFTER} more</summary>", ""]
    lines += [f"- {i}" for i in items[FOLD_AFTER:shown]]
    if len(items) > shown:
        lines.append(f"- … and {len(items) - shown} more")
    return lines + ["", "</details>", ""]


def _folded(label: str, items: list[str], shown: int, *, inline: bool = False) -> list[str]:
    if not items:
        return []
    if inline and len(items) <= FOLD_AFTER:
        return [f"**{label}:** {', '.join(items)}", ""]
    return [f"**{label}:**", ""] + _bullets(items, shown)


def _owners_cell(groups: str) -> str:
    return " and ".join(_cell(g) for g in groups.split("; ")) if groups else "unowned"


def _first_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0][:200] if lines else ""


def _truncate(text: str, budget: int, where: str) -> str:
    note = f"\n\n… truncated to stay under GitHub's limit; {where}.\n"
    cut = text[: budget - len(note)]
    # Never leave a code fence or a details block open.
    if cut.count("```") % 2:
        cut += "\n```"
    if cut.count("<details>") > cut.count("</details>"):
        cut += "\n</details>"
    return cut + note


def _limit(text: str) -> str:
    return text if len(text) <= BODY_BUDGET else _truncate(text, BODY_BUDGET, "the comment has the summary")
